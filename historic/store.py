"""A historic store: publications kept in a database and queried with the language's filters.

``Store("sqlite:///db1.sqlite")`` (the default kind: a file, nothing to install) or
``Store("postgresql+psycopg://user@host/db")``. Writes are batched and idempotent: a publication
is stored once, identified by its publisher and id, however often it is added. Queries return
publications in time order (then in the order they were stored), built without checking the
rules of the language again (they were checked before they were stored).

``add`` is one transaction: all or nothing. ``write`` is what a database node uses: it stores
what can be stored and sets aside, in the ``rejected`` table with the reason, each publication
the database refuses, so one bad publication costs only itself; it raises only
``StoreUnavailable`` (the database is unreachable or busy), after which the same batch may be
written again.

A publication is one row (``historic.schema``): SQLite takes a batch as one ``executemany``,
PostgreSQL as one ``COPY`` per shape of publication (class, attribute names and value types).
A store made with the earlier layout (a ``body`` column and an ``attributes`` table) is
migrated when it is opened, in one transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import orjson
from sqlalchemy import (
    Connection,
    Engine,
    Select,
    create_engine,
    delete,
    event,
    func,
    insert,
    inspect,
    select,
)
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError, StatementError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from historic.errors import StoreError, StoreUnavailable
from historic.predicates import Fields, filter_clause
from historic.schema import (
    KINDS,
    LAYOUT,
    column_type,
    fields,
    layout,
    metadata,
    publications,
    rejected,
    specs,
)
from padres.errors import StorageError
from padres.model.codec import from_dict, to_dict
from padres.model.messages import Filter, Publication, checked_before
from padres.security.files import private_file

__all__ = ["Rejection", "Store", "Written", "reason"]

log = logging.getLogger("padres.store")

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND: Final = timedelta(microseconds=1)
_UNIQUE_VIOLATION: Final = "23505"
"""PostgreSQL's SQLSTATE for a duplicate key."""
_HEADER: Final = ("publisher", "id", "time", "stamp", "attributes")
"""The columns of a row before its attributes' columns, in the order ``_row`` gives them."""
_HEADER_TYPES: Final = ("text", "text", "int8", "text", "text")
"""Their PostgreSQL types, as ``COPY`` writes them in binary."""

_WHOLE: Final = (
    publications.c.id,
    publications.c.publisher,
    publications.c.stamp,
    publications.c.attributes,
)
"""What a publication is read back from (``_publication``)."""
_ORDER: Final = (publications.c.time, publications.c.pk)

Shape = tuple[str, tuple[str, ...], tuple[type, ...]]
"""What decides which columns a publication's attributes go to: its class, its attribute
names and the types of their values, in order."""


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


def micros(at: datetime) -> int:
    """``at`` (aware) in microseconds since 1970-01-01 UTC: the ``time`` column. Raises
    ``OverflowError`` for a time with no equivalent in UTC (in the years 1 and 9999 only)."""
    if at.year in (1, 9999):
        at.astimezone(UTC)
    return (at - _EPOCH) // _MICROSECOND


class Store:
    """Publications in a SQL database (see the module docstring)."""

    def __init__(self, url: str = "sqlite:///padres-history.sqlite") -> None:
        self.url = url
        try:
            self.engine: Engine = create_engine(url)
        except SQLAlchemyError as exc:
            raise StoreError(f"cannot open the store at {_safe(url)}: {exc}") from exc
        self.dialect = self.engine.dialect.name
        try:
            if self.dialect not in ("sqlite", "postgresql"):
                raise StoreError(f"unsupported database {self.dialect!r}: use sqlite or postgresql")
            if self.dialect == "sqlite":
                event.listen(self.engine, "connect", _sqlite_pragmas)
                if self.engine.url.database not in (None, "", ":memory:"):
                    private_file(self.engine.url.database)
            with self.engine.begin() as conn:
                _prepare(conn)
        except (SQLAlchemyError, StoreError, OSError) as exc:
            self.engine.dispose()
            if isinstance(exc, StoreError):
                raise
            raise StoreError(f"cannot open the store at {_safe(url)}: {exc}") from exc
        insert_: Any = sqlite_insert if self.dialect == "sqlite" else postgresql_insert
        self._insert_rejected = insert_(rejected).on_conflict_do_nothing().returning(rejected.c.pk)
        self._rows = _Rows(self.dialect)
        self._driver_error: type[Exception] = self.engine.dialect.loaded_dbapi.Error
        """What the driver raises itself (``COPY`` goes to the driver directly)."""

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
            try:
                return self._insert(batch.values(), again=False)
            except self._driver_error as exc:
                if getattr(exc, "sqlstate", None) != _UNIQUE_VIOLATION:
                    raise
            return self._insert(batch.values(), again=True)  # some were stored already
        except (SQLAlchemyError, ArithmeticError, ValueError, TypeError, self._driver_error) as exc:
            raise self._failure(exc, f"storing {len(batch)} publications failed") from exc

    def _insert(self, pubs: Iterable[Publication], *, again: bool) -> int:
        try:
            with self.engine.begin() as conn:
                return self._rows.insert(conn, pubs, again=again)
        except BaseException:
            if self._rows.placed:  # the columns it made are undone: read them again
                self._rows = _Rows(self.dialect)
            raise

    def _class_fields(self, conn: Connection, class_name: str) -> Fields:
        """The field columns of ``class_name``, as they are in the database now."""
        found: dict[str, dict[str, str]] = {}
        statement = select(fields.c.name, fields.c.kind, fields.c.column).where(
            fields.c["class"] == class_name
        )
        for name, kind, column in conn.execute(statement):
            found.setdefault(name, {})[kind] = column
        return found

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
            return self._set_aside(pubs[0], reason(exc))

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
            raise self._failure(exc, f"setting aside publication {pub.id} failed") from exc

    def rejected(self) -> list[Rejection]:
        """The publications set aside, oldest first."""
        statement = select(rejected).order_by(rejected.c.pk)
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(statement).all()
        except SQLAlchemyError as exc:
            raise self._failure(exc, "reading the rejected publications failed") from exc
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
        try:
            with self.engine.connect() as conn:
                where = [filter_clause(flt, self.dialect, self._class_fields(conn, flt.class_name))]
                if since is not None:
                    where.append(publications.c.time >= micros(since))
                if until is not None:
                    where.append(publications.c.time < micros(until))
                statement = select(*_WHOLE).where(*where).order_by(*_ORDER).limit(limit)
                for rows in _fetch(conn, statement, size):
                    yield _publications(rows)
        except (SQLAlchemyError, self._driver_error) as exc:
            raise self._failure(exc, "query failed") from exc

    def older(self, before: datetime, size: int = 5000) -> Iterator[list[tuple[int, Publication]]]:
        """Every stored publication with a time before ``before``, with its row key (for
        ``remove``), in time order, ``size`` at a time, read as they are consumed."""
        statement = (
            select(publications.c.pk, *_WHOLE)
            .where(publications.c.time < micros(before))
            .order_by(*_ORDER)
        )
        try:
            with self.engine.connect() as conn:
                result = conn.execution_options(yield_per=size).execute(statement)
                for part in result.partitions(size):
                    yield [(row[0], _publication(*row[1:])) for row in part]
        except SQLAlchemyError as exc:
            raise self._failure(exc, "reading old publications failed") from exc

    def remove(self, keys: Sequence[int]) -> int:
        """Delete the publications with these row keys (from ``older``), in one transaction;
        returns how many were deleted."""
        removed = 0
        try:
            with self.engine.begin() as conn:
                for i in range(0, len(keys), 500):
                    chunk = keys[i : i + 500]
                    removed += conn.execute(
                        delete(publications).where(publications.c.pk.in_(chunk))
                    ).rowcount
        except SQLAlchemyError as exc:
            raise self._failure(exc, "removing publications failed") from exc
        return removed

    def specs(self) -> list[str]:
        """The specs the database node stores (see ``historic.node``)."""
        try:
            with self.engine.connect() as conn:
                return [row[0] for row in conn.execute(select(specs.c.spec).order_by(specs.c.spec))]
        except SQLAlchemyError as exc:
            raise self._failure(exc, "reading the specs") from exc

    def keep_spec(self, spec: str, kept: bool) -> None:
        """Record that the node stores ``spec`` (or no longer does)."""
        try:
            with self.engine.begin() as conn:
                conn.execute(delete(specs).where(specs.c.spec == spec))
                if kept:
                    conn.execute(insert(specs).values(spec=spec))
        except SQLAlchemyError as exc:
            raise self._failure(exc, "recording a spec") from exc

    def count(self) -> int:
        """How many publications are stored."""
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(publications)).scalar_one())

    def _failure(self, exc: Exception, what: str) -> StoreError:
        """``exc`` as a ``StoreError``: ``StoreUnavailable`` when trying again later may work."""
        transient = isinstance(
            exc, (OperationalError, PoolTimeout, self.engine.dialect.loaded_dbapi.OperationalError)
        ) or (isinstance(exc, DBAPIError) and exc.connection_invalidated)
        kind = StoreUnavailable if transient else StoreError
        return kind(f"{what}: {reason(exc)}")


class _Rows:
    """How publications become rows of ``publications``: the field columns of each shape of
    publication (read from ``fields``, or made), and the batched insert."""

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect
        self._fields: dict[str, dict[str, dict[str, str]]] = {}
        """class -> attribute -> kind -> column, as far as this store has read ``fields``."""
        self._columns: dict[Shape, tuple[str, ...]] = {}
        """The columns of each shape of publication written so far."""
        self.placed = False
        """Whether the last ``insert`` placed shapes not seen before."""

    def insert(self, conn: Connection, pubs: Iterable[Publication], *, again: bool) -> int:
        """Insert ``pubs`` (distinct) in ``conn``'s transaction; returns how many were new.
        PostgreSQL copies them straight in unless ``again`` (some may be stored already:
        then they go through a temporary table that skips those)."""
        rows: dict[Shape, list[tuple[Any, ...]]] = {}
        dumps = orjson.dumps
        for p in pubs:
            attrs = p.attributes
            values = attrs.values()
            shape: Shape = (p.class_name, tuple(attrs), tuple(map(type, values)))
            ts = p.timestamp
            row = (p.publisher, p.id, micros(ts), ts.isoformat(), dumps(attrs).decode(), *values)
            group = rows.get(shape)
            if group is None:
                group = rows[shape] = []
            group.append(row)
        unknown = [shape for shape in rows if shape not in self._columns]
        self.placed = bool(unknown)
        if unknown:
            self._place(conn, unknown)
        new = 0
        for shape, group in rows.items():
            columns = ", ".join(f'"{c}"' for c in (*_HEADER, *self._columns[shape]))
            if self.dialect == "sqlite":
                marks = ", ".join("?" * (len(_HEADER) + len(shape[1])))
                sql = (
                    f"INSERT INTO publications ({columns}) VALUES ({marks}) ON CONFLICT DO NOTHING"
                )
                new += conn.exec_driver_sql(sql, group).rowcount
            elif again:
                new += _copy_new(conn, columns, _copy_types(shape), group)
            else:
                _copy(conn, "publications", columns, _copy_types(shape), group)
                new += len(group)
        return new

    def _place(self, conn: Connection, shapes: list[Shape]) -> None:
        """Find or make the field columns of ``shapes``' attributes (see ``historic.schema``),
        in ``conn``'s transaction: forgotten (``Store.add``) if it fails."""
        if self.dialect == "postgresql":  # one writer at a time adds columns
            conn.exec_driver_sql("LOCK TABLE fields IN EXCLUSIVE MODE")
        self._read_fields(conn)
        made = {c["name"] for c in inspect(conn).get_columns("publications")}
        for shape in shapes:
            class_name, names, types = shape
            by_name = self._fields.setdefault(class_name, {})
            columns = []
            for name, t in zip(names, types, strict=True):
                kind = KINDS[t]
                column = "class" if name == "class" else by_name.get(name, {}).get(kind)
                if column is None:
                    column = self._new_field(conn, class_name, name, kind, made)
                columns.append(column)
            self._columns[shape] = tuple(columns)

    def _new_field(
        self, conn: Connection, class_name: str, name: str, kind: str, made: set[str]
    ) -> str:
        """Give ``name`` of ``class_name`` a column of ``kind``: the first of that kind no
        attribute of the class has, added to ``publications`` if no class had it yet."""
        by_name = self._fields[class_name]
        used = {c for kinds in by_name.values() for c in kinds.values()}
        n = 0
        while f"{kind}{n}" in used:
            n += 1
        column = f"{kind}{n}"
        # The insert first: on SQLite it is what opens the transaction the column joins.
        conn.execute(
            insert(fields).values(
                {"class": class_name, "name": name, "kind": kind, "column": column}
            )
        )
        if column not in made:
            conn.exec_driver_sql(
                f"ALTER TABLE publications ADD COLUMN {column} {column_type(self.dialect, kind)}"
            )
            made.add(column)
        by_name.setdefault(name, {})[kind] = column
        return column

    def _read_fields(self, conn: Connection) -> None:
        self._fields = {}
        for row in conn.execute(select(fields)):
            by_name = self._fields.setdefault(row[0], {})
            by_name.setdefault(row[1], {})[row[2]] = row[3]


def _fetch(conn: Connection, statement: Select[Any], size: int) -> Iterator[list[Any]]:
    """The rows of ``statement``, ``size`` at a time, read as they are consumed, straight from
    the driver (per-row processing would cost more than the database's own work here)."""
    compiled = statement.compile(dialect=conn.dialect)
    raw: Any = conn.connection.driver_connection
    if conn.dialect.name == "postgresql":
        cursor = raw.cursor(name="padres_query")  # on the server: read as consumed
        parameters: Any = compiled.params
    else:
        cursor = raw.cursor()
        parameters = [compiled.params[name] for name in compiled.positiontup or ()]
    try:
        cursor.execute(str(compiled), parameters)
        while rows := cursor.fetchmany(size):
            yield rows
    finally:
        cursor.close()


_COPY_TYPES: Final = {int: "int8", float: "float8", str: "text", bool: "bool"}
"""The PostgreSQL type a value of each Python type is copied as (in binary)."""


def _copy_types(shape: Shape) -> tuple[str, ...]:
    """The PostgreSQL types of the columns of a row of ``shape``, in order."""
    return (*_HEADER_TYPES, *(_COPY_TYPES[t] for t in shape[2]))


def _copy(
    conn: Connection, table: str, columns: str, types: tuple[str, ...], rows: list[tuple[Any, ...]]
) -> None:
    """PostgreSQL: ``COPY`` ``rows`` into ``columns`` of ``table``, in binary (no value is
    written out as text and parsed again), ``types`` the columns' types."""
    raw: Any = conn.connection.driver_connection
    statement = f"COPY {table} ({columns}) FROM STDIN (FORMAT BINARY)"
    with raw.cursor() as cursor, cursor.copy(statement) as copy:
        copy.set_types(types)
        for row in rows:
            copy.write_row(row)


def _copy_new(
    conn: Connection, columns: str, types: tuple[str, ...], rows: list[tuple[Any, ...]]
) -> int:
    """PostgreSQL: ``rows`` through a temporary table into ``publications``, skipping those
    stored already; returns how many were new."""
    conn.exec_driver_sql(
        "CREATE TEMPORARY TABLE padres_batch ON COMMIT DROP AS "
        f"SELECT {columns} FROM publications WITH NO DATA"
    )
    _copy(conn, "padres_batch", columns, types, rows)
    new = conn.exec_driver_sql(
        f"INSERT INTO publications ({columns}) SELECT {columns} FROM padres_batch "
        "ON CONFLICT DO NOTHING"
    ).rowcount
    conn.exec_driver_sql("DROP TABLE padres_batch")
    return new


def _prepare(conn: Connection) -> None:
    """Make the tables, or migrate a store of the earlier layout, or refuse one of another."""
    tables = set(inspect(conn).get_table_names())
    if "layout" in tables:
        found = conn.execute(select(layout.c.name)).scalars().all()
        if found != [LAYOUT]:
            raise StoreError(
                f"the store has the layout {', '.join(found) or '(none)'}, not {LAYOUT}: it was "
                "made by another version of padres; open it with that version, or use a new "
                "database"
            )
        return
    old = "publications" in tables
    if old:
        columns = {c["name"] for c in inspect(conn).get_columns("publications")}
        if "body" not in columns or "attributes" not in tables:
            raise StoreError(
                "the database has a publications table that padres did not make: "
                "use another database (or another PostgreSQL schema)"
            )
        conn.exec_driver_sql("ALTER TABLE publications RENAME TO publications_1")
        if conn.dialect.name == "postgresql":  # what keeps its name: the key and its sequence
            conn.exec_driver_sql("ALTER INDEX publications_pkey RENAME TO publications_1_pkey")
            conn.exec_driver_sql(
                "ALTER SEQUENCE IF EXISTS publications_pk_seq RENAME TO publications_1_pk_seq"
            )
    metadata.create_all(conn)
    conn.execute(insert(layout).values(name=LAYOUT))
    if old:
        _migrate(conn)


def _migrate(conn: Connection) -> None:
    """Move the publications of the earlier layout (renamed ``publications_1``) to this one."""
    log.warning("migrating the store to the layout %s", LAYOUT)
    rows = _Rows(conn.dialect.name)
    old = conn.exec_driver_sql(
        "SELECT body FROM publications_1 ORDER BY pk", execution_options={"yield_per": 1000}
    )
    moved = 0
    for part in old.partitions(1000):
        moved += rows.insert(conn, [_publication_of(body) for (body,) in part], again=True)
    conn.exec_driver_sql("DROP TABLE attributes")
    conn.exec_driver_sql("DROP TABLE publications_1")
    log.warning("migrated %d publications", moved)


def _publication_of(body: Any) -> Publication:
    """A publication of the earlier layout, from its wire form."""
    pub = from_dict(orjson.loads(body) if isinstance(body, (str, bytes)) else body)
    if not isinstance(pub, Publication):
        raise StoreError(f"the store holds a {type(pub).__name__} where a publication belongs")
    return pub


def _publication(ident: str, publisher: str, stamp: str, attributes: str) -> Publication:
    return Publication(ident, orjson.loads(attributes), datetime.fromisoformat(stamp), publisher)


def _publications(rows: Sequence[Sequence[Any]]) -> list[Publication]:
    """The publications of rows read for a query, built without checking the rules of the
    language again: a broker checked them before they were stored (this takes building one
    from 7 to 2 µs), and a broker takes a node's answers without checking them again."""
    with checked_before():
        return [_publication(*row) for row in rows]


def reason(exc: BaseException) -> str:
    """A short account of what went wrong: the first line of the original error (the driver's,
    without the SQL and its parameters)."""
    if isinstance(exc, StorageError) and exc.__cause__ is not None:
        exc = exc.__cause__
    if isinstance(exc, StatementError) and exc.orig is not None:
        exc = exc.orig
    first = (str(exc).strip().splitlines() or [""])[0]
    text = f"{type(exc).__name__}: {first}"[:500]
    return text.encode("utf-8", "backslashreplace").decode().replace("\x00", "\\x00")


def _aware(at: datetime) -> datetime:
    """A time read back: SQLite returns UTC without its zone."""
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def _sqlite_pragmas(connection: Any, _record: Any) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")  # the WAL is synced at each commit: durable
    cursor.execute("PRAGMA cache_size=-65536")  # 64 MiB: index inserts stay in memory
    cursor.close()


def _safe(url: str) -> str:
    """The URL without its password, for messages."""
    head, sep, tail = url.partition("@")
    if not sep or "://" not in head:
        return url
    scheme, _, credentials = head.partition("://")
    return f"{scheme}://{credentials.split(':')[0]}@{tail}"
