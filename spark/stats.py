"""Per-file statistics, read from the footers Spark writes: a file's time range, row count, and
each column's minimum, maximum and null count (what Delta Lake and Iceberg keep per file)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from rete.operators import Value
from spark.columns import HEADER, TIME
from spark.errors import ArchiveError

__all__ = ["ColumnStats", "FileStats", "read_stats"]


@dataclass(frozen=True, slots=True)
class ColumnStats:
    """One column of one file. ``low``/``high`` are None when the file gives no bounds (every
    value null, or a writer that kept no statistics): then nothing can be ruled out by them."""

    low: Value | None
    high: Value | None
    nulls: int


@dataclass(frozen=True, slots=True)
class FileStats:
    """One file of the archive: ``path`` is relative to the archive's root."""

    path: str
    class_name: str
    period: str
    start: datetime
    end: datetime
    """The first and the last publication time in the file (both inclusive)."""
    rows: int
    size: int
    columns: dict[str, ColumnStats] = field(default_factory=dict)


def _merge(chunks: list[Any]) -> tuple[Any, Any, int]:
    low = high = None
    nulls = 0
    bounded = True
    for stats in chunks:
        if stats is None:
            return None, None, -1
        nulls += stats.null_count if stats.has_null_count else 0
        if not stats.has_min_max:
            bounded = bounded and stats.num_values == 0  # no bounds are needed for nulls only
            continue
        low = stats.min if low is None or stats.min < low else low
        high = stats.max if high is None or stats.max > high else high
    return (low, high, nulls) if bounded else (None, None, nulls)


def read_stats(root: Path, path: str, class_name: str, period: str) -> FileStats:
    """The statistics of the Parquet file ``root/path``, from its footer."""
    try:
        meta = pq.ParquetFile(root / path).metadata
    except (OSError, ValueError) as exc:
        raise ArchiveError(f"cannot read the footer of {root / path}: {exc}") from exc
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    columns: dict[str, ColumnStats] = {}
    for i, name in enumerate(names):
        chunks = [meta.row_group(g).column(i).statistics for g in range(meta.num_row_groups)]
        low, high, nulls = _merge(chunks)
        if nulls < 0:  # no statistics at all: bounds and null count unknown
            nulls = 0
        columns[name] = ColumnStats(low, high, nulls)
    times = columns.pop(TIME)
    if times.low is None or times.high is None:
        raise ArchiveError(f"{root / path} has no time statistics")
    for name in HEADER:
        columns.pop(name, None)
    return FileStats(
        path,
        class_name,
        period,
        _utc(times.low),
        _utc(times.high),
        meta.num_rows,
        (root / path).stat().st_size,
        columns,
    )


def _utc(at: Any) -> datetime:
    if not isinstance(at, datetime):
        raise ArchiveError(f"a time statistic is {type(at).__name__}, not a timestamp")
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
