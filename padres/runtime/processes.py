"""Broker processes on this machine: start ``padres broker``, learn its port, stop or kill it.

Used by the network tests and ``padres bench network``; each broker is a real process with a
real socket, started by the project's own command.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import IO

__all__ = ["BrokerProcess"]

_READY = re.compile(r"listening on (ws://\S+)")


class BrokerProcess:
    """One ``padres broker`` child process."""

    def __init__(
        self,
        broker_id: str,
        *,
        port: int = 0,
        neighbors: Sequence[str] = (),
        options: Sequence[str] = (),
        log: IO[bytes] | None = None,
    ) -> None:
        self.id = broker_id
        self.port = port
        self.neighbors = list(neighbors)
        self.options = list(options)
        self.url = ""
        self._log = log
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> str:
        """Start the process and wait until it listens; returns its URL."""
        self.stop()  # a restart: let go of the previous process
        args = [sys.executable, "-m", "padres.cli", "broker", "--id", self.id]
        args += ["--port", str(self.port), "--quiet", *self.options]
        for n in self.neighbors:
            args += ["--neighbor", n]
        self._proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=self._log if self._log is not None else subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert self._proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = b""
        while time.monotonic() < deadline:
            line = self._proc.stdout.readline()
            found = _READY.search(line.decode(errors="replace"))
            if found:
                self.url = found.group(1)
                self.port = int(self.url.rsplit(":", 1)[1].split("/")[0])
                return self.url
            if not line and self._proc.poll() is not None:
                break
        self.kill()
        raise RuntimeError(f"broker {self.id} did not start (last output: {line!r})")

    def kill(self) -> None:
        """Kill the process at once (SIGKILL), as a crash would."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait(10)

    def pause(self) -> None:
        """Freeze the process (SIGSTOP): alive, but silent, as a hung machine would be."""
        if self._proc is not None:
            self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._proc is not None:
            self._proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self.resume()
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        if self._proc is not None and self._proc.stdout is not None:
            self._proc.stdout.close()
            self._proc = None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None
