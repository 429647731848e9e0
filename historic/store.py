"""A historic store: publications kept in a database and queried with the language's filters.

``Store("sqlite:///db1.sqlite")`` (the default kind: a file, nothing to install) or
``Store("postgresql+psycopg://user@host/db")``. Writes are batched and idempotent: a publication
is stored once, identified by its publisher and id, however often it is added. Queries return
publications in time order (then in the order they were stored).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, create_engine, event, func, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import SQLAlchemyError

from historic.predicates import filter_clause
from historic.schema import metadata, publications
from padres.errors import PadresError
from padres.messages import Filter, Publication
from padres.wire import from_dict, to_dict

__all__ = ["Store", "StoreError"]


class StoreError(PadresError):
    """The database failed or refused (the driver's error is the cause)."""


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
            self._insert_new: Any = sqlite_insert(publications).on_conflict_do_nothing()
        elif self.dialect == "postgresql":
            self._insert_new = postgresql_insert(publications).on_conflict_do_nothing()
        else:
            self.engine.dispose()
            raise StoreError(f"unsupported database {self.dialect!r}: use sqlite or postgresql")
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
        except SQLAlchemyError as exc:
            raise StoreError(f"storing {len(batch)} publications failed: {exc}") from exc
        return len(new)

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
            raise StoreError(f"query failed: {exc}") from exc

    def count(self) -> int:
        """How many publications are stored."""
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(publications)).scalar_one())


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
