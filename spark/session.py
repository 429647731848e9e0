"""Starting Spark for the archive's jobs: on this machine (``local[N]``) or on a standalone
cluster (``spark://host:7077``)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Final

from spark.errors import ArchiveError, JavaMissing

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["DEFAULT_MASTER", "java", "session"]

DEFAULT_MASTER: Final = "local[2]"


def java() -> Path:
    """The Java runtime Spark will use, or ``JavaMissing`` saying how to get one."""
    home = os.environ.get("JAVA_HOME")
    found = Path(home, "bin", "java") if home else None
    if found is None or not found.exists():
        which = shutil.which("java")
        found = Path(which) if which else None
    if found is None:
        raise JavaMissing(
            "the archive runs on Apache Spark, which needs Java 17 or newer: install a JDK "
            "(apt-get install openjdk-17-jre-headless, say) or set JAVA_HOME"
        )
    return found


def session(master: str = DEFAULT_MASTER, name: str = "padres-archive") -> SparkSession:
    """A Spark session for the archive's jobs (the active one if there is one).

    Times are UTC, timestamps are written as microseconds, and the executors' Python is this
    interpreter, so they parse with this installation of padres. On a terminal, Spark's
    progress bar shows each stage's tasks."""
    java()
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise ArchiveError("pyspark is not installed: pip install 'padres[archive]'") from exc
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(name)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", str(sys.stderr.isatty()).lower())
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config("spark.python.worker.reuse", "true")
        .config("spark.executor.memory", "512m")
        .config("spark.driver.memory", "4g")
    )
    active = SparkSession.getActiveSession()
    if active is not None and active.sparkContext.master != master:
        active.stop()  # one session per process: a job for another master needs its own
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
