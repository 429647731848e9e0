"""The archive's index: a catalog of its loads and files in SQL (SQLAlchemy Core; SQLite by
default, PostgreSQL by URL, the historic store's database if given its URL).

``archive_loads``: one row per load: the archive it belongs to (its root directory), its id,
when it was catalogued, its rows and files. ``archive_inputs``: one row per input file of a
load: its path, size, modification time and SHA-256. ``archive_files``: one row per Parquet
file: the archive, its path there, class, period, first and last publication time, row count,
size and the load that wrote it. ``archive_columns``: one row per file and column: the
attribute, the value type, the minimum and maximum in the column of that type (``i``, ``f``,
``s``, ``b``, as the historic store types its attributes) and the null count.

A load adds its files in one transaction, after they are written and moved into place (removing
those of the loads it replaces in the same transaction): the catalog names only complete files,
and a file it does not name is never read. Removing a load deletes its rows in one transaction
too; its files are deleted after.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Connection,
    DateTime,
    Engine,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    delete,
    event,
    func,
    select,
)
from sqlalchemy.exc import SQLAlchemyError

from rete.operators import Value
from spark.columns import attribute_of, type_of
from spark.errors import CatalogError, UnknownLoad
from spark.inputs import InputFile
from spark.stats import ColumnStats, FileStats

__all__ = ["Catalog", "ClassRange", "LoadRecord", "default_url"]

metadata = MetaData()

loads = Table(
    "archive_loads",
    metadata,
    Column("pk", Integer, primary_key=True, autoincrement=True),
    Column("archive", Text, nullable=False),
    Column("load", String(64), nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("rows", BigInteger, nullable=False),
    Column("files", Integer, nullable=False),
    UniqueConstraint("archive", "load", name="archive_load_identity"),
)

inputs = Table(
    "archive_inputs",
    metadata,
    Column("load", Integer, ForeignKey("archive_loads.pk", ondelete="CASCADE"), nullable=False),
    Column("path", Text, nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("modified", DateTime(timezone=True), nullable=False),
    Column("sha256", String(64), nullable=False),
    Index("archive_inputs_load", "load"),
    Index("archive_inputs_sha256", "sha256"),
)

files = Table(
    "archive_files",
    metadata,
    Column("pk", Integer, primary_key=True, autoincrement=True),
    Column("archive", Text, nullable=False),
    Column("path", Text, nullable=False),
    Column("class", String(256), nullable=False),
    Column("period", String(32), nullable=False),
    Column("start", DateTime(timezone=True), nullable=False),
    Column("end", DateTime(timezone=True), nullable=False),
    Column("rows", BigInteger, nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("load", String(64), nullable=False),
    UniqueConstraint("archive", "path", name="archive_file_identity"),
    Index("archive_files_class_time", "archive", "class", "start", "end"),
    Index("archive_files_load", "archive", "load"),
)

columns = Table(
    "archive_columns",
    metadata,
    Column("file", Integer, ForeignKey("archive_files.pk", ondelete="CASCADE"), nullable=False),
    Column("name", Text, nullable=False),
    Column("attribute", Text, nullable=False),
    Column("kind", String(1), nullable=False),
    Column("i_min", BigInteger),
    Column("i_max", BigInteger),
    Column("f_min", Float(precision=53)),
    Column("f_max", Float(precision=53)),
    Column("s_min", Text),
    Column("s_max", Text),
    Column("b_min", Boolean),
    Column("b_max", Boolean),
    Column("nulls", BigInteger, nullable=False),
    Index("archive_columns_file", "file"),
)

_KINDS: Final = {int: "i", float: "f", str: "s", bool: "b"}


def default_url(archive: str) -> str:
    """The catalog's database when none is named: SQLite inside the archive."""
    return f"sqlite:///{archive}/catalog.sqlite"


@dataclass(frozen=True, slots=True)
class ClassRange:
    """What an archive holds of one class: its time range, rows and files."""

    class_name: str
    start: datetime
    end: datetime
    rows: int
    files: int


@dataclass(frozen=True, slots=True)
class LoadRecord:
    """One load of an archive: its id, when it was catalogued, its rows, files and inputs.
    ``at`` is None (and ``inputs`` empty) for a load catalogued before loads were recorded."""

    load: str
    at: datetime | None
    rows: int
    files: int
    inputs: tuple[InputFile, ...] = ()


def _utc(at: datetime) -> datetime:
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def _sqlite_foreign_keys(connection: Any, _record: Any) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


class Catalog:
    """The files of the archives recorded in one database."""

    def __init__(self, url: str) -> None:
        try:
            self.engine: Engine = create_engine(url)
            if self.engine.dialect.name == "sqlite":
                event.listen(self.engine, "connect", _sqlite_foreign_keys)
            metadata.create_all(self.engine)
        except SQLAlchemyError as exc:
            raise CatalogError(f"cannot open the catalog at {url}: {exc}") from exc

    def close(self) -> None:
        self.engine.dispose()

    def add(
        self,
        archive: str,
        record: LoadRecord,
        stats: Iterable[FileStats],
        replacing: Collection[str] = (),
    ) -> list[str]:
        """Record one load and its files, all or none, removing the loads it replaces in the
        same transaction; return the paths of the replaced loads' files (to delete)."""
        try:
            with self.engine.begin() as conn:
                replaced = self._remove(conn, archive, replacing)
                key = conn.execute(
                    loads.insert().values(
                        archive=archive,
                        load=record.load,
                        at=record.at or datetime.now(UTC),
                        rows=record.rows,
                        files=record.files,
                    )
                ).inserted_primary_key
                if key is None:
                    raise CatalogError(f"the catalog gave no key for load {record.load}")
                if record.inputs:
                    conn.execute(
                        inputs.insert(),
                        [
                            {
                                "load": key[0],
                                "path": i.path,
                                "size": i.size,
                                "modified": i.modified,
                                "sha256": i.sha256,
                            }
                            for i in record.inputs
                        ],
                    )
                for f in stats:
                    self._add_file(conn, archive, record.load, f)
        except SQLAlchemyError as exc:
            raise CatalogError(f"recording the files of load {record.load}: {exc}") from exc
        return replaced

    @staticmethod
    def _add_file(conn: Connection, archive: str, load: str, f: FileStats) -> None:
        inserted = conn.execute(
            files.insert().values(
                archive=archive,
                path=f.path,
                **{"class": f.class_name},
                period=f.period,
                start=f.start,
                end=f.end,
                rows=f.rows,
                size=f.size,
                load=load,
            )
        ).inserted_primary_key
        if inserted is None:
            raise CatalogError(f"the catalog gave no key for {f.path}")
        rows = [_column_row(inserted[0], name, c) for name, c in f.columns.items()]
        if rows:
            conn.execute(columns.insert(), rows)

    @staticmethod
    def _remove(conn: Connection, archive: str, ids: Collection[str]) -> list[str]:
        """Delete the rows of loads ``ids``; return their files' paths."""
        if not ids:
            return []
        held = files.c.archive == archive
        found = conn.execute(
            select(files.c.pk, files.c.path).where(held, files.c.load.in_(list(ids)))
        ).all()
        pks = [pk for pk, _ in found]
        if pks:
            conn.execute(delete(columns).where(columns.c.file.in_(pks)))
            conn.execute(delete(files).where(files.c.pk.in_(pks)))
        recorded = select(loads.c.pk).where(loads.c.archive == archive, loads.c.load.in_(list(ids)))
        conn.execute(delete(inputs).where(inputs.c.load.in_(recorded)))
        conn.execute(delete(loads).where(loads.c.archive == archive, loads.c.load.in_(list(ids))))
        return sorted(path for _, path in found)

    def remove(self, archive: str, load: str) -> tuple[LoadRecord, list[str]]:
        """Forget load ``load`` (its record and files, in one transaction): what it was, and
        the paths of its files (to delete); ``UnknownLoad`` if the archive has no such load."""
        try:
            with self.engine.begin() as conn:
                found = self._loads(conn, archive, [load])
                if not found:
                    raise UnknownLoad(f"the archive {archive} holds no load {load!r}", load)
                return found[0], self._remove(conn, archive, [load])
        except SQLAlchemyError as exc:
            raise CatalogError(f"removing load {load}: {exc}") from exc

    def loads(self, archive: str, ids: Collection[str] | None = None) -> list[LoadRecord]:
        """The archive's loads (or those of ``ids``), oldest first."""
        try:
            with self.engine.connect() as conn:
                return self._loads(conn, archive, ids)
        except SQLAlchemyError as exc:
            raise CatalogError(f"reading the catalog: {exc}") from exc

    @staticmethod
    def _loads(conn: Connection, archive: str, ids: Collection[str] | None) -> list[LoadRecord]:
        query = select(loads).where(loads.c.archive == archive)
        if ids is not None:
            query = query.where(loads.c.load.in_(list(ids)))
        found = list(conn.execute(query.order_by(loads.c.at, loads.c.load)).mappings())
        given: dict[int, list[InputFile]] = {row["pk"]: [] for row in found}
        if given:
            wanted = select(inputs).where(inputs.c.load.in_(list(given))).order_by(inputs.c.path)
            for row in conn.execute(wanted).mappings():
                given[row["load"]].append(
                    InputFile(row["path"], row["size"], _utc(row["modified"]), row["sha256"])
                )
        records = [
            LoadRecord(
                row["load"], _utc(row["at"]), row["rows"], row["files"], tuple(given[row["pk"]])
            )
            for row in found
        ]
        # Files of loads catalogued before loads were recorded: one record per load id.
        known = select(loads.c.load).where(loads.c.archive == archive)
        older = (
            select(files.c.load, func.sum(files.c.rows), func.count())
            .where(files.c.archive == archive, files.c.load.not_in(known))
            .group_by(files.c.load)
            .order_by(files.c.load)
        )
        if ids is not None:
            older = older.where(files.c.load.in_(list(ids)))
        unrecorded = [
            LoadRecord(load, None, int(rows), int(n)) for load, rows, n in conn.execute(older)
        ]
        return unrecorded + records

    def loaded(self, archive: str, digests: Collection[str]) -> dict[str, str]:
        """Which of the input contents ``digests`` (SHA-256) earlier loads read, and which
        load read each (the latest, if several did)."""
        if not digests:
            return {}
        query = (
            select(inputs.c.sha256, loads.c.load)
            .join(loads, inputs.c.load == loads.c.pk)
            .where(loads.c.archive == archive, inputs.c.sha256.in_(list(digests)))
            .order_by(loads.c.at)
        )
        try:
            with self.engine.connect() as conn:
                return {digest: load for digest, load in conn.execute(query)}
        except SQLAlchemyError as exc:
            raise CatalogError(f"reading the catalog: {exc}") from exc

    def overlapping(
        self, archive: str, class_name: str, start: datetime, end: datetime
    ) -> list[tuple[str, str]]:
        """The files of ``class_name`` whose time ranges meet ``[start, end]``: path and load."""
        query = select(files.c.path, files.c.load).where(
            files.c.archive == archive,
            files.c["class"] == class_name,
            files.c.start <= end,
            files.c.end >= start,
        )
        try:
            with self.engine.connect() as conn:
                return [(path, load) for path, load in conn.execute(query.order_by(files.c.path))]
        except SQLAlchemyError as exc:
            raise CatalogError(f"reading the catalog: {exc}") from exc

    def files(self, archive: str, class_name: str | None = None) -> list[FileStats]:
        """The archive's files (of one class), in time order."""
        query = select(files).where(files.c.archive == archive)
        if class_name is not None:
            query = query.where(files.c["class"] == class_name)
        try:
            with self.engine.connect() as conn:
                found = list(conn.execute(query.order_by(files.c.start, files.c.path)).mappings())
                stats: dict[int, dict[str, ColumnStats]] = {row["pk"]: {} for row in found}
                if stats:
                    wanted = select(columns).where(columns.c.file.in_(list(stats)))
                    for row in conn.execute(wanted).mappings():
                        stats[row["file"]][row["name"]] = _column_stats(row)
        except SQLAlchemyError as exc:
            raise CatalogError(f"reading the catalog: {exc}") from exc
        return [
            FileStats(
                row["path"],
                row["class"],
                row["period"],
                _utc(row["start"]),
                _utc(row["end"]),
                row["rows"],
                row["size"],
                stats[row["pk"]],
            )
            for row in found
        ]

    def classes(self, archive: str) -> list[ClassRange]:
        """What the archive holds, class by class."""
        query = (
            select(
                files.c["class"],
                func.min(files.c.start),
                func.max(files.c.end),
                func.sum(files.c.rows),
                func.count(),
            )
            .where(files.c.archive == archive)
            .group_by(files.c["class"])
            .order_by(files.c["class"])
        )
        try:
            with self.engine.connect() as conn:
                return [
                    ClassRange(c, _utc(start), _utc(end), int(rows), int(n))
                    for c, start, end, rows, n in conn.execute(query)
                ]
        except SQLAlchemyError as exc:
            raise CatalogError(f"reading the catalog: {exc}") from exc


def _column_row(pk: int, name: str, c: ColumnStats) -> dict[str, Any]:
    kind = _KINDS[type_of(name)]
    row: dict[str, Any] = {"file": pk, "name": name, "attribute": attribute_of(name)}
    row.update(kind=kind, nulls=c.nulls)
    row.update({f"{k}_{end}": None for k in _KINDS.values() for end in ("min", "max")})
    row[f"{kind}_min"], row[f"{kind}_max"] = c.low, c.high
    return row


def _column_stats(row: Any) -> ColumnStats:
    kind = row["kind"]
    low: Value | None = row[f"{kind}_min"]
    high: Value | None = row[f"{kind}_max"]
    return ColumnStats(low, high, row["nulls"])
