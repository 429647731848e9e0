"""The archive's index: a catalog of its files in SQL (SQLAlchemy Core; SQLite by default,
PostgreSQL by URL, the historic store's database if given its URL).

``archive_files``: one row per Parquet file: the archive it belongs to (its root directory),
its path there, class, period, first and last publication time, row count, size and the load
that wrote it. ``archive_columns``: one row per file and column: the attribute, the value type,
the minimum and maximum in the column of that type (``i``, ``f``, ``s``, ``b``, as the
historic store types its attributes) and the null count.

A load adds its files in one transaction, after they are written and moved into place: the
catalog names only complete files, and a file it does not name is never read.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
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
    event,
    func,
    select,
)
from sqlalchemy.exc import SQLAlchemyError

from rete.operators import Value
from spark.columns import attribute_of, type_of
from spark.errors import CatalogError
from spark.stats import ColumnStats, FileStats

__all__ = ["Catalog", "ClassRange", "default_url"]

metadata = MetaData()

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

    def add(self, archive: str, load: str, stats: Iterable[FileStats]) -> int:
        """Record the files of one load, all or none; return how many."""
        count = 0
        try:
            with self.engine.begin() as conn:
                for f in stats:
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
                    count += 1
        except SQLAlchemyError as exc:
            raise CatalogError(f"recording the files of load {load}: {exc}") from exc
        return count

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
