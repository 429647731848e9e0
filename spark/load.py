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

A load is refused, nothing written, when the archive holds its inputs already (the same content,
recognised by SHA-256 before Spark starts) or any of its publications (the same publisher and
id, looked for in the files of the same classes whose time ranges meet the load's), naming the
earlier loads; with ``replace`` it replaces them instead, whole, in the catalog transaction
that adds it.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial, reduce
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import pyarrow as pa

from padres.model.times import format_time
from spark.archive import discard
from spark.catalog import Catalog, LoadRecord, default_url
from spark.columns import ID, PUBLISHER, SUFFIXES, TIME, attribute_of, type_of
from spark.errors import AlreadyLoaded, ArchiveError, InputError
from spark.inputs import PIECE_BYTES, Bad, InputFile, Piece, Reading, cut, expand, parse_piece
from spark.progress import EVERY, Ticker, per_second, size
from spark.session import DEFAULT_LOG, DEFAULT_MASTER, session
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


_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(slots=True)
class LoadReport:
    """What a load did: its id, files, rows (by class), time, and the earlier loads it
    replaced."""

    load: str
    files: int = 0
    rows: int = 0
    classes: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    replaced: list[LoadRecord] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Class:
    """What the inputs hold of one class: rows, periods, columns and time range."""

    rows: int
    periods: int
    columns: list[str]
    start: datetime
    end: datetime


def _parse(reading: Reading, lines: Any, batches: Iterator[Any]) -> Iterator[Any]:
    """On the executors: each input piece's lines as rows of ``_ROWS``, a bad line as a row
    with only ``BAD`` set (and empty maps). ``lines`` (an accumulator) counts them, for the
    driver's progress."""
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
        lines.add(len(bad))
        yield pa.RecordBatch.from_arrays(
            [*columns, *maps, pa.array(bad, pa.string())], schema=_ROWS
        )


def _classes(rows: Any) -> dict[str, _Class]:
    """What the parsed rows hold, class by class (Spark SQL over the cached rows)."""
    from pyspark.sql import functions as F

    good = rows.where(F.col(BAD).isNull())
    sizes = good.groupBy(CLASS).agg(
        F.count("*"),
        F.countDistinct(PERIOD),
        F.unix_micros(F.min(TIME)),  # as microseconds: PySpark would make naive local times
        F.unix_micros(F.max(TIME)),
    )
    columns: dict[str, set[str]] = {}
    for t, kind in _MAPS.items():
        keys = good.select(CLASS, F.explode(F.map_keys(kind)).alias("a")).distinct()
        for c, a in keys.collect():
            columns.setdefault(c, set()).add(f"{a}__{SUFFIXES[t]}")
    return {
        c: _Class(n, p, sorted(columns.get(c, ())), _time(start), _time(end))
        for c, n, p, start, end in sizes.collect()
    }


def _time(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


def _described(record: LoadRecord) -> str:
    """An earlier load, for an operator: ``load 2026...-1a2b3c4d (loaded 2026-11-28T03:32:55Z,
    1,000 rows from in.jsonl)``."""
    what = f"{record.rows:,} rows"
    if record.inputs:
        names = [Path(i.path).name for i in record.inputs]
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        what += " from " + ", ".join(names[:3]) + more
    else:
        what += f" in {record.files} file(s)"
    if record.at is not None:
        what = f"loaded {format_time(record.at.replace(microsecond=0))}, {what}"
    return f"load {record.load} ({what})"


def _read(
    paths: list[Path], total: int, piece_bytes: int, progress: Callable[[str], None], every: float
) -> tuple[list[Piece], list[InputFile]]:
    """The inputs (``total`` bytes) cut into pieces and fingerprinted, in one pass over each
    (on the driver)."""
    done = [0]

    def read(count: int) -> None:
        done[0] += count

    def line(count: int, seconds: float) -> str:
        return f"read {size(count)} of {size(total)} of input ({size(count / seconds)} per s)"

    cut_pieces: list[Piece] = []
    given: list[InputFile] = []
    with Ticker(progress, line, lambda: done[0], every):
        for path in paths:
            found, fingerprint = cut(path, piece_bytes, read)
            cut_pieces.extend(found)
            given.append(fingerprint)
    return cut_pieces, given


def _earlier_inputs(
    catalog: Catalog, archive: str, given: list[InputFile], replace: bool
) -> set[str]:
    """The loads that read any of ``given`` before (by content): ``AlreadyLoaded`` unless
    they are to be replaced. Two inputs of the same content are an ``InputError``."""
    seen: dict[str, str] = {}
    for i in given:
        if i.sha256 in seen:
            raise InputError(f"inputs {seen[i.sha256]} and {i.path} hold the same content")
        seen[i.sha256] = i.path
    earlier = catalog.loaded(archive, seen)
    if earlier and not replace:
        records = {r.load: r for r in catalog.loads(archive, set(earlier.values()))}
        told = [f"{seen[d]}, by {_described(records[load])}" for d, load in earlier.items()]
        raise AlreadyLoaded(
            "nothing loaded: the archive holds "
            + ("this input" if len(earlier) == 1 else f"{len(earlier)} of these inputs")
            + " already: "
            + "; ".join(told),
            tuple(sorted(set(earlier.values()))),
        )
    return set(earlier.values())


def _earlier_publications(
    rows: Any,
    classes: dict[str, _Class],
    catalog: Catalog,
    archive: Path,
    replacing: set[str],
    replace: bool,
    progress: Callable[[str], None],
) -> set[str]:
    """The loads (other than ``replacing``) that hold any of the parsed publications (the
    same publisher and id), looked for in the files of the same classes whose time ranges
    meet the new rows': ``AlreadyLoaded`` unless they are to be replaced."""
    from pyspark.sql import functions as F

    earlier: dict[str, list[str]] = {}
    for class_name, held in classes.items():
        for path, load in catalog.overlapping(str(archive), class_name, held.start, held.end):
            if load not in replacing:
                earlier.setdefault(load, []).append(str(archive / path))
    if not earlier:
        return set()
    files = sum(len(paths) for paths in earlier.values())
    progress(f"looking for these publications in {files} file(s) of {len(earlier)} earlier load(s)")
    spark = rows.sparkSession
    held = reduce(
        lambda a, b: a.unionByName(b),
        [
            spark.read.parquet(*paths).select(PUBLISHER, ID, F.lit(load).alias("load"))
            for load, paths in earlier.items()
        ],
    )
    new = rows.where(F.col(BAD).isNull()).select(PUBLISHER, ID)
    found = dict(
        new.join(held, [PUBLISHER, ID])
        .groupBy("load")
        .agg(F.countDistinct(PUBLISHER, ID))
        .collect()
    )
    if found and not replace:
        records = {r.load: r for r in catalog.loads(str(archive), set(found))}
        told = [f"{n:,} in {_described(records[load])}" for load, n in sorted(found.items())]
        raise AlreadyLoaded(
            f"nothing loaded: the archive holds {sum(found.values()):,} of these publications "
            "already (the same publisher and id): " + "; ".join(told),
            tuple(sorted(found)),
            sum(found.values()),
        )
    return set(found)


def load(
    inputs: Sequence[str],
    archive: Path,
    reading: Reading,
    *,
    catalog_url: str | None = None,
    master: str = DEFAULT_MASTER,
    progress: Callable[[str], None] = lambda _: None,
    piece_bytes: int = PIECE_BYTES,
    replace: bool = False,
    spark_log: str = DEFAULT_LOG,
    every: float = EVERY,
) -> LoadReport:
    """Load ``inputs`` into ``archive`` (see the module docstring); a task reads about
    ``piece_bytes`` of them at a time. ``progress`` is told what the load does, and every
    ``every`` seconds of a long step how far it got. ``replace``: replace the earlier loads
    that hold these inputs or publications rather than refuse. ``spark_log``: the least severe
    of Spark's log lines shown."""
    started = time.perf_counter()
    paths = expand(inputs, reading)
    archive = archive.resolve()
    archive.mkdir(parents=True, exist_ok=True)
    catalog = Catalog(catalog_url or default_url(str(archive)))
    report = LoadReport(time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8])
    staging = archive / "_staging" / report.load
    cached: list[Any] = []
    try:
        total = sum(path.stat().st_size for path in paths)
        progress(f"load {report.load}: {len(paths)} input file(s), {size(total)}")
        cut_pieces, given = _read(paths, total, piece_bytes, progress, every)
        replacing = _earlier_inputs(catalog, str(archive), given, replace)
        progress(f"starting Spark on {master}")
        spark = session(master, log=spark_log)
        parsing = time.perf_counter()
        lines = spark.sparkContext.accumulator(0)
        inputs_df = spark.createDataFrame(cut_pieces, _PIECES_DDL).repartition(
            max(1, len(cut_pieces))
        )
        rows = inputs_df.mapInArrow(partial(_parse, reading, lines), _ROWS_DDL).persist()
        cached.append(rows)

        def parsed(count: int, seconds: float) -> str:
            return f"parsed {count:,} rows ({per_second(count, seconds)})"

        with Ticker(progress, parsed, lambda: int(lines.value), every):
            bad = [r[0] for r in rows.where(rows[BAD].isNotNull()).select(BAD).take(MAX_ERRORS)]
            if bad:
                count = rows.where(rows[BAD].isNotNull()).count()
                raise InputError(f"{count} bad line(s), nothing loaded: " + "; ".join(bad))
            classes = _classes(rows)
        if not classes:
            raise InputError("the inputs hold no publication")
        report.rows = sum(c.rows for c in classes.values())
        seconds = time.perf_counter() - parsing
        progress(
            f"parsed {report.rows:,} publications of {len(classes)} class(es) "
            f"in {seconds:.1f} s ({per_second(report.rows, seconds)})"
        )
        replacing |= _earlier_publications(
            rows, classes, catalog, archive, replacing, replace, progress
        )
        report.replaced = catalog.loads(str(archive), replacing) if replacing else []
        _write(rows, classes, staging, report, progress)
        stats = _move(archive, staging, sorted(classes), report.load)
        record = LoadRecord(report.load, None, report.rows, len(stats), tuple(given))
        try:
            replaced = catalog.add(str(archive), record, stats, replacing)
        except ArchiveError:
            for f in stats:
                (archive / f.path).unlink(missing_ok=True)
            raise
        report.files = len(stats)
        failed = discard(archive, replaced)
        if failed:
            progress("deleting the replaced files failed: " + "; ".join(failed[:5]))
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
    for earlier in report.replaced:
        progress(f"replaced {_described(earlier)}")
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
        writing = time.perf_counter()
        typed = [F.col(_MAPS[type_of(c)])[attribute_of(c)].alias(c) for c in held.columns]
        (
            rows.where(F.col(CLASS) == class_name)
            .select(ID, PUBLISHER, TIME, PERIOD, *typed)
            .repartition(min(held.periods, tasks), PERIOD)
            .sortWithinPartitions(PERIOD, TIME)
            .write.partitionBy(PERIOD)
            .parquet(str(staging / str(n)))
        )
        seconds = time.perf_counter() - writing
        progress(f"wrote {held.rows:,} rows in {seconds:.1f} s ({per_second(held.rows, seconds)})")
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
