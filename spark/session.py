"""Starting Spark for the archive's jobs: on this machine (``local[N]``) or on a standalone
cluster (``spark://host:7077``).

Spark's own log lines are kept off the console unless asked for: the JVM starts with a log4j2
configuration (``-Dlog4j2.configurationFile``) whose console appender passes only events at
``log`` or above (``error`` by default, so errors still show), and its console progress bar is
off (the load shows rows and rates instead). The JVM's standard error is read through a pipe
and passed on but for the one warning the JVM itself prints at start (the incubator module
Spark enables), which no configuration turns off."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from functools import cache
from pathlib import Path
from typing import IO, TYPE_CHECKING, Final

from spark.errors import ArchiveError, JavaMissing

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["DEFAULT_LOG", "DEFAULT_MASTER", "LOG_LEVELS", "java", "log4j2", "session"]

DEFAULT_MASTER: Final = "local[2]"
LOG_LEVELS: Final = ("off", "error", "warn", "info", "debug")
"""What ``--spark-log`` accepts: the least severe of Spark's log lines shown."""
DEFAULT_LOG: Final = "error"
_JVM_NOISE: Final = (b"WARNING: Using incubator modules:",)
"""Lines the JVM prints at start whatever the log configuration says."""


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


def log4j2(level: str) -> str:
    """The log4j2 configuration of Spark's driver: Spark's lines at ``level`` or above, on
    standard error. The root logger stays at ``warn`` or finer, so that Spark does not announce
    a default level of its own at start; the console appender's threshold does the hiding."""
    if level not in LOG_LEVELS:
        raise ArchiveError(f"Spark log level {level!r}: one of {', '.join(LOG_LEVELS)}")
    root = level if level in ("info", "debug") else "warn"
    return "\n".join(
        [
            f"rootLogger.level = {root}",
            "rootLogger.appenderRef.console.ref = console",
            "appender.console.type = Console",
            "appender.console.name = console",
            "appender.console.target = SYSTEM_ERR",
            "appender.console.filter.threshold.type = ThresholdFilter",
            f"appender.console.filter.threshold.level = {level}",
            "appender.console.layout.type = PatternLayout",
            "appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex",
            "",
        ]
    )


@cache
def _log4j2_file(level: str) -> Path:
    """``log4j2(level)`` in a file for the JVM's start, removed when this process exits."""
    folder = Path(tempfile.mkdtemp(prefix="padres-spark-"))
    atexit.register(shutil.rmtree, folder, True)
    path = folder / f"log4j2-{level}.properties"
    path.write_text(log4j2(level), encoding="utf-8")
    return path


def _pass_on(stream: IO[bytes]) -> None:
    """The JVM's standard error, line by line, to ours, but for its start-up noise."""
    with stream:
        for line in stream:
            if not line.startswith(_JVM_NOISE):
                os.write(2, line)


def session(
    master: str = DEFAULT_MASTER, name: str = "padres-archive", log: str = DEFAULT_LOG
) -> SparkSession:
    """A Spark session for the archive's jobs (the active one if there is one).

    Times are UTC, timestamps are written as microseconds, and the executors' Python is this
    interpreter, so they parse with this installation of padres. Spark's log lines less severe
    than ``log`` are hidden (see the module docstring; the configuration file takes effect when
    this process starts its JVM, the level also for a JVM already running)."""
    java()
    config = _log4j2_file(log)
    try:
        from pyspark import SparkConf, SparkContext
        from pyspark.java_gateway import launch_gateway
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise ArchiveError("pyspark is not installed: pip install 'padres[archive]'") from exc
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    conf = SparkConf().setMaster(master).setAppName(name)
    conf.setAll(
        [
            ("spark.sql.session.timeZone", "UTC"),
            ("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS"),
            ("spark.sql.shuffle.partitions", "8"),
            ("spark.ui.enabled", "false"),
            ("spark.ui.showConsoleProgress", "false"),
            ("spark.driver.bindAddress", "127.0.0.1"),
            ("spark.driver.host", "127.0.0.1"),
            ("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={config}"),
            ("spark.executorEnv.PYSPARK_PYTHON", sys.executable),
            ("spark.python.worker.reuse", "true"),
            ("spark.executor.memory", "512m"),
            ("spark.driver.memory", "4g"),
        ]
    )
    active = SparkSession.getActiveSession()
    if active is not None and active.sparkContext.master != master:
        active.stop()  # one session per process: a job for another master needs its own
    # The first session of the process starts the JVM, its standard error piped through
    # ``_pass_on``; later ones reuse it (PySpark keeps the gateway on the class).
    if getattr(SparkContext, "_gateway", None) is None:
        piped = {"stderr": subprocess.PIPE}
        gateway = launch_gateway(conf, popen_kwargs=piped)  # type: ignore[no-untyped-call]
        proc = getattr(gateway, "proc", None)
        if proc is not None and proc.stderr is not None:
            threading.Thread(
                target=_pass_on, args=(proc.stderr,), name="spark-stderr", daemon=True
            ).start()
        SparkContext(conf=conf, gateway=gateway)
    spark = SparkSession.builder.config(conf=conf).getOrCreate()
    spark.sparkContext.setLogLevel(log.upper())
    return spark
