"""A standalone Spark cluster on loopback, from the installed pyspark: one master and its
workers as child processes, for tests, benchmarks and trying the cluster path on one machine
(``padres archive cluster``). A real cluster is started with Spark's own scripts; the archive's
jobs take its master URL (``--master spark://host:7077``) all the same."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Final

from spark.errors import ArchiveError
from spark.session import java

__all__ = ["LocalCluster"]

_MASTER_URL: Final = re.compile(r"Starting Spark master at (spark://\S+)")
_REGISTERED: Final = re.compile(r"Successfully registered with master")


def _spark_home() -> Path:
    try:
        import pyspark
    except ImportError as exc:
        raise ArchiveError("pyspark is not installed: pip install 'padres[archive]'") from exc
    return Path(pyspark.__file__).parent


class _Daemon:
    """One of the cluster's JVMs, its log read line by line for what it announces."""

    def __init__(self, name: str, args: list[str], work: Path) -> None:
        home = _spark_home()
        env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_NO_DAEMONIZE": "1",
        }
        self.name = name
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self.proc = subprocess.Popen(
            [str(home / "bin" / "spark-class"), *args],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, name=f"{name}-log", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout or ():
            with self._changed:
                self.lines.append(line.rstrip())
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        seen = 0
        with self._changed:
            while True:
                for line in self.lines[seen:]:
                    if found := pattern.search(line):
                        return found
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    tail = "\n".join(self.lines[-15:])
                    raise ArchiveError(f"the Spark {self.name} did not start:\n{tail}")
                self._changed.wait(min(left, 0.5))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class LocalCluster:
    """``with LocalCluster(work_dir) as url:`` a master and ``workers`` workers on loopback;
    every process is stopped on the way out, even when one fails to start."""

    def __init__(
        self, work: Path, workers: int = 1, cores: int = 1, memory: str = "1g", timeout: float = 90
    ) -> None:
        self.work = work
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.timeout = timeout
        self.url = ""
        self._daemons: list[_Daemon] = []

    def start(self) -> str:
        java()
        self.work.mkdir(parents=True, exist_ok=True)
        try:
            master = _Daemon(
                "master",
                [
                    "org.apache.spark.deploy.master.Master",
                    "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
                ],
                self.work,
            )  # fmt: skip
            self._daemons.append(master)
            self.url = master.wait_for(_MASTER_URL, self.timeout).group(1)
            for n in range(self.workers):
                worker = _Daemon(
                    f"worker {n + 1}",
                    [
                        "org.apache.spark.deploy.worker.Worker", self.url,
                        "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
                        "--cores", str(self.cores), "--memory", self.memory,
                        "--work-dir", str(self.work / f"worker-{n + 1}"),
                    ],
                    self.work,
                )  # fmt: skip
                self._daemons.append(worker)
                worker.wait_for(_REGISTERED, self.timeout)
        except BaseException:
            self.stop()
            raise
        return self.url

    def stop(self) -> None:
        for daemon in reversed(self._daemons):
            daemon.stop()
        self._daemons.clear()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
