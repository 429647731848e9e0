"""The query job: a filter answered by Spark, from the files the plan keeps (or from every file
of the class, for comparison), with the filter as a Spark expression pushed down into the
Parquet scan."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from padres.model.messages import Filter, Publication
from spark.archive import Archive
from spark.columns import ID, PUBLISHER, TIME, publication
from spark.expression import expression
from spark.session import DEFAULT_LOG, DEFAULT_MASTER, session

__all__ = ["QueryResult", "spark_query"]

_MICROS: Final = "_time_us"
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(slots=True)
class QueryResult:
    """What a query found, and what it read to find it."""

    publications: list[Publication]
    files_read: int
    files: int
    rows_read: int
    seconds: float


def _frame(spark: Any, paths: list[str]) -> Any:
    return spark.read.option("mergeSchema", "true").parquet(*paths)


def spark_query(
    archive: Archive,
    flt: Filter,
    *,
    master: str = DEFAULT_MASTER,
    prune: bool = True,
    spark_log: str = DEFAULT_LOG,
) -> QueryResult:
    """``flt``'s matches in ``archive``, in time order, computed by Spark. ``prune=False``
    reads every file of the class with Spark's Parquet filter pushdown off: a full scan.
    ``spark_log``: the least severe of Spark's log lines shown."""
    started = time.perf_counter()
    plan = archive.plan(flt)
    files = plan.read if prune else archive.files(flt.class_name)
    if not files:
        return QueryResult([], 0, plan.of, 0, time.perf_counter() - started)
    spark = session(master, log=spark_log)
    spark.conf.set("spark.sql.parquet.filterPushdown", str(prune).lower())
    frame = _frame(spark, archive.paths(files))
    # Times leave Spark as microseconds: PySpark would turn them into naive local times.
    from pyspark.sql import functions

    found = (
        frame.where(expression(flt, frame.columns))
        .withColumn(_MICROS, functions.unix_micros(frame[TIME]))
        .drop(TIME)
        .orderBy(_MICROS, PUBLISHER, ID)
    )
    pubs = [_row(flt.class_name, row.asDict()) for row in found.toLocalIterator()]
    return QueryResult(
        pubs, len(files), plan.of, sum(f.rows for f in files), time.perf_counter() - started
    )


def _row(class_name: str, row: dict[str, Any]) -> Publication:
    row[TIME] = _EPOCH + timedelta(microseconds=row.pop(_MICROS))
    return publication(class_name, row)
