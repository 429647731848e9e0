"""The load job: inputs -> Parquet files partitioned by class and period, sorted by time within
each file, one typed column per attribute; then the catalog.

Spark reads the inputs in pieces of whole lines and parses them on the executors with the
project's own parser (``spark.inputs``), once, handing the rows back to the JVM as Arrow
batches (attribute values in one map per type) that it keeps cached. Spark SQL over those
finds the bad lines and each class's columns and periods, then writes each class with its typed
columns. The job writes to ``<archive>/_staging/<load>/`` first. Only when every class is
written are the files moved into place
(``<archive>/class=<class>/period=<period>/<load>-<n>.parquet``), their footers read, and the
catalog told of them in one transaction. A missing input, a bad line or a failed job leaves the
archive and the catalog as they were.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import pyarrow as pa

from spark.catalog import Catalog, default_url
from spark.columns import ID, PUBLISHER, SUFFIXES, TIME, attribute_of, type_of
from spark.errors import ArchiveError, InputError
from spark.inputs import PIECE_BYTES, Bad, Piece, Reading, expand, parse_piece, pieces
from spark.session import DEFAULT_MASTER, session
from spark.stats import FileStats, read_stats

__all__ = ["LoadReport", "load"]

MAX_ERRORS: Final = 5
"""How many bad lines a failed load names."""
CLASS: Final = "class"
PERIOD: Final = "period"
BAD: Final = "_bad"

_MAPS: Final = {int: "ints", float: "floats", str: "strings", bool: "booleans"}
"""The parsed rows keep attribute values in one map per type, so one parse serves every class."""
_ROWS: Final = pa.schema(
    [
        (ID, pa.string()),
        (PUBLISHER, pa.string()),
        (TIME, pa.timestamp("us", "UTC")),
        (CLASS, pa.string()),
        (PERIOD, pa.string()),
        ("ints", pa.map_(pa.string(), pa.int64())),
        ("floats", pa.map_(pa.string(), pa.float64())),
        ("strings", pa.map_(pa.string(), pa.string())),
        ("booleans", pa.map_(pa.string(), pa.bool_())),
        (BAD, pa.string()),
    ]
)
_PIECES_DDL: Final = "path string, start long, end long, first long"
_ROWS_DDL: Final = (
    f"{ID} string, {PUBLISHER} string, {TIME} timestamp, {CLASS} string, {PERIOD} string, "
    "ints map<string,bigint>, floats map<string,double>, strings map<string,string>, "
    f"booleans map<string,boolean>, {BAD} string"
)


@dataclass(slots=True)
class LoadReport:
    load: str
    files: int = 0
    rows: int = 0
    classes: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class _Class:
    """What the inputs hold of one class."""

    rows: int
    periods: int
    columns: list[str]


def _parse(reading: Reading, batches: Iterator[Any]) -> Iterator[Any]:
    """On the executors: each input piece's lines as rows of ``_ROWS``, a bad line as a row
    with only ``BAD`` set (and empty maps)."""
    for batch in batches:
        header: list[list[Any]] = [[] for _ in range(5)]
        bad: list[str | None] = []
        offsets: dict[type, list[int]] = {t: [0] for t in _MAPS}
        keys: dict[type, list[str]] = {t: [] for t in _MAPS}
        items: dict[type, list[Any]] = {t: [] for t in _MAPS}
        for row in batch.to_pylist():
            for r in parse_piece(reading, Piece(**row)):
                if isinstance(r, Bad):
                    for column in header:
                        column.append(None)
                    bad.append(f"{r.where}: {r.error}")
                else:
                    for column, value in zip(
                        header, (r.id, r.publisher, r.time, r.class_name, r.period), strict=True
                    ):
                        column.append(value)
                    bad.append(None)
                    for attribute, value in r.values:
                        kind = type(value)
                        keys[kind].append(attribute)
                        items[kind].append(value)
                for t, ends in offsets.items():
                    ends.append(len(keys[t]))
        maps = [
            pa.MapArray.from_arrays(
                pa.array(offsets[t], pa.int32()),
                pa.array(keys[t], pa.string()),
                pa.array(items[t], _ROWS.field(kind).type.item_type),
            )
            for t, kind in _MAPS.items()
        ]
        columns = [pa.array(c, f.type) for c, f in zip(header, _ROWS, strict=False)]
        yield pa.RecordBatch.from_arrays(
            [*columns, *maps, pa.array(bad, pa.string())], schema=_ROWS
        )


def _classes(rows: Any) -> dict[str, _Class]:
    """What the parsed rows hold, class by class (Spark SQL over the cached rows)."""
    from pyspark.sql import functions as F

    good = rows.where(F.col(BAD).isNull())
    sizes = good.groupBy(CLASS).agg(F.count("*").alias("n"), F.countDistinct(PERIOD).alias("p"))
    columns: dict[str, set[str]] = {}
    for t, kind in _MAPS.items():
        keys = good.select(CLASS, F.explode(F.map_keys(kind)).alias("a")).distinct()
        for c, a in keys.collect():
            columns.setdefault(c, set()).add(f"{a}__{SUFFIXES[t]}")
    return {c: _Class(n, p, sorted(columns.get(c, ()))) for c, n, p in sizes.collect()}


def load(
    inputs: Sequence[str],
    archive: Path,
    reading: Reading,
    *,
    catalog_url: str | None = None,
    master: str = DEFAULT_MASTER,
    progress: Callable[[str], None] = lambda _: None,
    piece_bytes: int = PIECE_BYTES,
) -> LoadReport:
    """Load ``inputs`` into ``archive`` (see the module docstring); a task reads about
    ``piece_bytes`` of them at a time."""
    started = time.perf_counter()
    paths = expand(inputs, reading)
    archive = archive.resolve()
    archive.mkdir(parents=True, exist_ok=True)
    catalog = Catalog(catalog_url or default_url(str(archive)))
    report = LoadReport(time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8])
    staging = archive / "_staging" / report.load
    cached: list[Any] = []
    try:
        spark = session(master)
        progress(
            f"load {report.load}: reading {len(paths)} input file(s) on {spark.sparkContext.master}"
        )
        cut = [piece for path in paths for piece in pieces(path, piece_bytes)]
        inputs_df = spark.createDataFrame(cut, _PIECES_DDL).repartition(max(1, len(cut)))
        rows = inputs_df.mapInArrow(partial(_parse, reading), _ROWS_DDL).persist()
        cached.append(rows)
        bad = [r[0] for r in rows.where(rows[BAD].isNotNull()).select(BAD).take(MAX_ERRORS)]
        if bad:
            count = rows.where(rows[BAD].isNotNull()).count()
            raise InputError(f"{count} bad line(s), nothing loaded: " + "; ".join(bad))
        classes = _classes(rows)
        if not classes:
            raise InputError("the inputs hold no publication")
        report.rows = sum(c.rows for c in classes.values())
        progress(
            f"parsed {report.rows:,} publications of {len(classes)} class(es) "
            f"in {time.perf_counter() - started:.1f} s"
        )
        _write(rows, classes, staging, report, progress)
        stats = _move(archive, staging, sorted(classes), report.load)
        try:
            report.files = catalog.add(str(archive), report.load, stats)
        except ArchiveError:
            for f in stats:
                (archive / f.path).unlink(missing_ok=True)
            raise
    except ArchiveError:
        raise
    except Exception as exc:
        raise ArchiveError(f"load {report.load} failed: {_first_line(exc)}") from exc
    finally:
        for frame in cached:
            frame.unpersist()
        shutil.rmtree(staging, ignore_errors=True)
        catalog.close()
    report.seconds = time.perf_counter() - started
    progress(f"catalogued {report.files} file(s) in {report.seconds:.1f} s")
    return report


def _write(
    rows: Any,
    classes: dict[str, _Class],
    staging: Path,
    report: LoadReport,
    progress: Callable[[str], None],
) -> None:
    """Each class's rows in their typed columns, one file per period, sorted by time."""
    from pyspark.sql import functions as F

    tasks = 2 * rows.sparkSession.sparkContext.defaultParallelism
    for n, (class_name, held) in enumerate(sorted(classes.items())):
        progress(f"writing {class_name}: {held.rows:,} rows, {held.periods} period(s)")
        typed = [F.col(_MAPS[type_of(c)])[attribute_of(c)].alias(c) for c in held.columns]
        (
            rows.where(F.col(CLASS) == class_name)
            .select(ID, PUBLISHER, TIME, PERIOD, *typed)
            .repartition(min(held.periods, tasks), PERIOD)
            .sortWithinPartitions(PERIOD, TIME)
            .write.partitionBy(PERIOD)
            .parquet(str(staging / str(n)))
        )
        report.classes[class_name] = held.rows


def _move(archive: Path, staging: Path, classes: list[str], load: str) -> list[FileStats]:
    """Move the staged files into place and read their statistics. Should this fail, the files
    moved so far are removed again; the catalog does not name them yet in any case."""
    moved: list[Path] = []
    stats: list[FileStats] = []
    try:
        for n, class_name in enumerate(classes):
            for k, staged in enumerate(sorted((staging / str(n)).glob("period=*/*.parquet"))):
                period = staged.parent.name.partition("=")[2]
                relative = f"class={quote(class_name, safe='')}/period={period}/{load}-{k}.parquet"
                target = archive / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(staged, target)
                moved.append(target)
                stats.append(read_stats(archive, relative, class_name, period))
    except BaseException:
        for path in moved:
            path.unlink(missing_ok=True)
        raise
    return stats


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        if "Error" in line or "Exception" in line:
            return line.strip()[:500]
    return (text.splitlines() or [type(exc).__name__])[0][:500]
