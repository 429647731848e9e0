"""A historic store: publications kept in a database and queried with the language's filters.

``Store("sqlite:///db1.sqlite")`` (the default kind: a file, nothing to install) or
``Store("postgresql+psycopg://user@host/db")``. Writes are batched and idempotent: a publication
is stored once, identified by its publisher and id, however often it is added. Queries return
publications in time order (then in the order they were stored).

``add`` is one transaction: all or nothing. ``write`` is what a database node uses: it stores
what can be stored and sets aside, in the ``rejected`` table with the reason, each publication
the database refuses, so one bad publication costs only itself; it raises only
``StoreUnavailable`` (the database is unreachable or busy), after which the same batch may be
written again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, create_engine, delete, event, func, insert, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from historic.predicates import filter_clause
from historic.schema import metadata, publications, rejected, specs
from padres.errors import PadresError
from padres.messages import Filter, Publication
from padres.wire import from_dict, to_dict

__all__ = ["Rejection", "Store", "StoreError", "StoreUnavailable", "Written"]

log = logging.getLogger("padres.store")


class StoreError(PadresError):
    """The database failed or refused (the driver's error is the cause)."""


class StoreUnavailable(StoreError):
    """The database is unreachable or busy (locked, restarting): the same write may work later."""


@dataclass(frozen=True, slots=True)
class Written:
    """What ``Store.write`` did with a batch: publications stored (new ones), set aside in
    ``rejected``, and dropped (refused, and not even set aside: logged whole)."""

    stored: int = 0
    set_aside: int = 0
    dropped: int = 0

    def __add__(self, other: Written) -> Written:
        return Written(
            self.stored + other.stored,
            self.set_aside + other.set_aside,
            self.dropped + other.dropped,
        )


@dataclass(frozen=True, slots=True)
class Rejection:
    """A publication the database refused, kept whole (its wire form) with the reason."""

    publisher: str
    id: str
    reason: str
    body: dict[str, Any]
    at: datetime


def _utc(ts: datetime) -> datetime:
    return ts.astimezone(UTC).replace(tzinfo=None)


class Store:
    """Publications in a SQL database (see the module docstring)."""

    def __init__(self, url: str = "sqlite:///padres-history.sqlite") -> None:
        self.url = url
        try:
            self.engine: Engine = create_engine(url)
            if self.engine.dialect.name == "sqlite":
                event.listen(self.engine, "connect", _sqlite_pragmas)
            metadata.create_all(self.engine)
        except SQLAlchemyError as exc:
            raise StoreError(f"cannot open the store at {_safe(url)}: {exc}") from exc
        self.dialect = self.engine.dialect.name
        if self.dialect == "sqlite":
            insert: Any = sqlite_insert
        elif self.dialect == "postgresql":
            insert = postgresql_insert
        else:
            self.engine.dispose()
            raise StoreError(f"unsupported database {self.dialect!r}: use sqlite or postgresql")
        self._insert_new = insert(publications).on_conflict_do_nothing()
        self._insert_rejected = insert(rejected).on_conflict_do_nothing().returning(rejected.c.pk)
        mark = "?" if self.engine.dialect.paramstyle == "qmark" else "%s"
        self._insert_attributes = (
            f"INSERT INTO attributes (pub, name, kind, i, f, s, b) VALUES ({', '.join([mark] * 7)})"
        )

    def close(self) -> None:
        self.engine.dispose()

    def add(self, pubs: Iterable[Publication]) -> int:
        """Store publications (one transaction); returns how many were new."""
        batch: dict[tuple[str, str], Publication] = {}
        for pub in pubs:
            batch.setdefault((pub.publisher, pub.id), pub)
        if not batch:
            return 0
        try:
            with self.engine.begin() as conn:
                # Publications already stored are skipped by the unique (publisher, id) index.
                result = conn.execute(
                    self._insert_new.returning(
                        publications.c.pk, publications.c.publisher, publications.c.id
                    ),
                    [
                        {
                            "id": p.id,
                            "publisher": p.publisher,
                            "class": p.class_name,
                            "time": _utc(p.timestamp),
                            "body": to_dict(p),
                        }
                        for p in batch.values()
                    ],
                )
                pks = {(row.publisher, row.id): row.pk for row in result}
                new = [batch[key] for key in pks]
                if not new:
                    return 0
                # Straight to the driver: per-row parameter processing would cost more than
                # the database's own work here.
                conn.exec_driver_sql(
                    self._insert_attributes,
                    [
                        _attribute_row(pks[p.publisher, p.id], name, value)
                        for p in new
                        for name, value in p.attributes.items()
                    ],
                )
        except (SQLAlchemyError, ArithmeticError, ValueError) as exc:
            raise _failure(exc, f"storing {len(batch)} publications failed") from exc
        return len(new)

    def write(self, pubs: Sequence[Publication]) -> Written:
        """Store ``pubs``, setting aside each one the database refuses (see the module
        docstring). One transaction when all is well; a batch that fails for another reason
        than ``StoreUnavailable`` is split in halves until the publications at fault are found.
        """
        try:
            return Written(stored=self.add(pubs))
        except StoreUnavailable:
            raise
        except Exception as exc:  # whatever the cause, it costs the publications at fault only
            if len(pubs) > 1:
                half = len(pubs) // 2
                return self.write(pubs[:half]) + self.write(pubs[half:])
            return self._set_aside(pubs[0], _reason(exc))

    def _set_aside(self, pub: Publication, reason: str) -> Written:
        log.warning("set aside publication %s of %s: %s", pub.id, pub.publisher, reason)
        try:
            return Written(set_aside=int(self.reject(pub, reason)))
        except StoreUnavailable:
            raise
        except Exception:
            log.exception("publication dropped, it could not be set aside either: %r", pub)
            return Written(dropped=1)

    def reject(self, pub: Publication, reason: str) -> bool:
        """Keep ``pub`` in ``rejected`` with ``reason``; False if it was there already."""
        row = {
            "id": pub.id,
            "publisher": pub.publisher,
            "reason": reason,
            "body": to_dict(pub),
            "at": datetime.now(UTC),
        }
        try:
            with self.engine.begin() as conn:
                return conn.execute(self._insert_rejected, row).first() is not None
        except (SQLAlchemyError, ValueError) as exc:
            raise _failure(exc, f"setting aside publication {pub.id} failed") from exc

    def rejected(self) -> list[Rejection]:
        """The publications set aside, oldest first."""
        statement = select(rejected).order_by(rejected.c.pk)
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(statement).all()
        except SQLAlchemyError as exc:
            raise _failure(exc, "reading the rejected publications failed") from exc
        return [Rejection(r.publisher, r.id, r.reason, r.body, _aware(r.at)) for r in rows]

    def query(
        self,
        flt: Filter,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int | None = None,
    ) -> list[Publication]:
        """The stored publications matching ``flt`` with ``since <= time < until``."""
        return [
            p for chunk in self.stream(flt, since=since, until=until, limit=limit) for p in chunk
        ]

    def stream(
        self,
        flt: Filter,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int | None = None,
        size: int = 500,
    ) -> Iterator[list[Publication]]:
        """``query``'s results in time order, ``size`` at a time, read as they are consumed."""
        where = [filter_clause(flt, self.dialect)]
        if since is not None:
            where.append(publications.c.time >= _utc(since))
        if until is not None:
            where.append(publications.c.time < _utc(until))
        statement = (
            select(publications.c.body)
            .where(*where)
            .order_by(publications.c.time, publications.c.pk)
            .limit(limit)
        )
        try:
            with self.engine.connect() as conn:
                result = conn.execution_options(yield_per=size).execute(statement)
                for part in result.scalars().partitions(size):
                    yield [_publication(body) for body in part]
        except SQLAlchemyError as exc:
            raise _failure(exc, "query failed") from exc

    def specs(self) -> list[str]:
        """The specs the database node stores (see ``historic.node``)."""
        try:
            with self.engine.connect() as conn:
                return [row[0] for row in conn.execute(select(specs.c.spec).order_by(specs.c.spec))]
        except SQLAlchemyError as exc:
            raise _failure(exc, "reading the specs") from exc

    def keep_spec(self, spec: str, kept: bool) -> None:
        """Record that the node stores ``spec`` (or no longer does)."""
        try:
            with self.engine.begin() as conn:
                conn.execute(delete(specs).where(specs.c.spec == spec))
                if kept:
                    conn.execute(insert(specs).values(spec=spec))
        except SQLAlchemyError as exc:
            raise _failure(exc, "recording a spec") from exc

    def count(self) -> int:
        """How many publications are stored."""
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(publications)).scalar_one())


def _failure(exc: Exception, what: str) -> StoreError:
    """``exc`` as a ``StoreError``: ``StoreUnavailable`` when trying again later may work."""
    transient = isinstance(exc, (OperationalError, PoolTimeout)) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    )
    kind = StoreUnavailable if transient else StoreError
    return kind(f"{what}: {_reason(exc)}")


def _reason(exc: BaseException) -> str:
    """A short account of what went wrong: the first line of the original error (the driver's,
    without the SQL and its parameters)."""
    if isinstance(exc, StoreError) and exc.__cause__ is not None:
        exc = exc.__cause__
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        exc = exc.orig
    first = (str(exc).strip().splitlines() or [""])[0]
    text = f"{type(exc).__name__}: {first}"[:500]
    return text.encode("utf-8", "backslashreplace").decode().replace("\x00", "\\x00")


def _aware(at: datetime) -> datetime:
    """A time read back: SQLite returns UTC without its zone."""
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def _publication(body: Any) -> Publication:
    pub = from_dict(body)
    if not isinstance(pub, Publication):
        raise StoreError(f"the store holds a {type(pub).__name__} where a publication belongs")
    return pub


def _attribute_row(pk: int, name: str, value: Any) -> tuple[Any, ...]:
    t = type(value)
    if t is int:
        return (pk, name, "i", value, None, None, None)
    if t is float:
        return (pk, name, "f", None, value, None, None)
    if t is str:
        return (pk, name, "s", None, None, value, None)
    return (pk, name, "b", None, None, None, value)


def _sqlite_pragmas(connection: Any, _record: Any) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")  # WAL: safe from a crash, fsync at checkpoints
    cursor.execute("PRAGMA cache_size=-65536")  # 64 MiB: index inserts stay in memory
    cursor.close()


def _safe(url: str) -> str:
    """The URL without its password, for messages."""
    head, sep, tail = url.partition("@")
    if not sep or "://" not in head:
        return url
    scheme, _, credentials = head.partition("://")
    return f"{scheme}://{credentials.split(':')[0]}@{tail}"
