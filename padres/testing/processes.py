"""Broker and database processes on this machine: start ``padres broker`` (learning its port)
or ``padres db``, stop or kill them.

Used by the network tests, the scenarios and ``padres bench``; each is a real process with a
real socket, started by the project's own command.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import IO, Final

__all__ = ["BrokerProcess", "DatabaseProcess", "faketime", "free_ports", "wait_for_port"]


FAKETIME_LIBRARIES: Final = (
    "/usr/lib/*/faketime/libfaketimeMT.so.1",
    "/usr/local/lib/faketime/libfaketimeMT.so.1",
    "/usr/lib/faketime/libfaketimeMT.so.1",
)
"""Where libfaketime (multi-threaded) is installed (Debian's ``faketime`` package, or built)."""


def faketime(skew: float) -> dict[str, str]:
    """The environment that runs a process with its clock ``skew`` seconds off this machine's
    (libfaketime, preloaded); ``RuntimeError`` when it is not installed."""
    found = [path for pattern in FAKETIME_LIBRARIES for path in glob.glob(pattern)]
    if not found:
        raise RuntimeError("a skewed clock needs libfaketime (Debian: apt-get install faketime)")
    return {"LD_PRELOAD": found[0], "FAKETIME": f"{skew:+g}s"}


def free_ports(count: int) -> list[int]:
    """``count`` ports free on 127.0.0.1 now, for brokers that must come back on their port."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    """Wait until something listens on 127.0.0.1:``port``; ``TimeoutError`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")
        time.sleep(0.05)


class _Child:
    """A ``padres`` child process that prints a line matching ``ready`` once it is up."""

    def __init__(
        self,
        name: str,
        ready: str,
        log: IO[bytes] | None,
        env: Mapping[str, str] | None = None,
        within: Sequence[str] = (),
    ) -> None:
        """``within``: what runs the command elsewhere, put before it (``Host.prefix``)."""
        self.name = name
        self._ready = re.compile(ready)
        self._log = log
        self._env = dict(env or {})
        self._within = list(within)
        self._proc: subprocess.Popen[bytes] | None = None

    def _start(self, args: list[str], timeout: float) -> re.Match[str]:
        self.stop()  # a restart: let go of the previous process
        self._proc = subprocess.Popen(
            [*self._within, sys.executable, "-m", "padres.cli", *args],
            stdout=subprocess.PIPE,
            stderr=self._log if self._log is not None else subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self._env},
        )
        assert self._proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = b""
        while time.monotonic() < deadline:
            line = self._proc.stdout.readline()
            found = self._ready.search(line.decode(errors="replace"))
            if found:
                return found
            if not line and self._proc.poll() is not None:
                break
        self.kill()
        raise RuntimeError(f"{self.name} did not start (last output: {line!r})")

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

    def terminate(self, timeout: float = 30.0) -> int:
        """Ask the process to stop (SIGTERM), as a service manager does, and wait for it;
        returns its exit status."""
        assert self._proc is not None
        self._proc.terminate()
        return self._proc.wait(timeout)

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

    @property
    def pid(self) -> int | None:
        """The process id while it runs."""
        return self._proc.pid if self._proc is not None else None


class BrokerProcess(_Child):
    """One ``padres broker`` child process."""

    def __init__(
        self,
        broker_id: str,
        *,
        port: int = 0,
        neighbours: Sequence[str] = (),
        options: Sequence[str] = (),
        log: IO[bytes] | None = None,
        skew: float = 0.0,
        quiet: bool = True,
        host: str = "127.0.0.1",
        within: Sequence[str] = (),
    ) -> None:
        """``skew``: seconds its clock runs off this machine's (see ``faketime``); ``log``:
        where its standard error goes (nowhere if None), warnings only if ``quiet``;
        ``host``: the address it listens on; ``within``: what runs it on another host
        (``padres.testing.hosts``: ``Host.prefix``)."""
        env = faketime(skew) if skew else None
        super().__init__(f"broker {broker_id}", r"listening on (wss?://\S+)", log, env, within)
        self.id = broker_id
        self.host = host
        self.port = port
        self.neighbours = list(neighbours)
        self.options = list(options)
        self.quiet = quiet
        self.url = ""

    def start(self, timeout: float = 20.0) -> str:
        """Start the process and wait until it listens; returns its URL."""
        args = ["broker", "--id", self.id, "--host", self.host, "--port", str(self.port)]
        args += self.options
        if self.quiet:
            args.append("--quiet")
        for n in self.neighbours:
            args += ["--neighbour", n]
        self.url = self._start(args, timeout).group(1)
        self.port = int(self.url.rsplit(":", 1)[1].split("/")[0])
        return self.url


class DatabaseProcess(_Child):
    """One ``padres db`` child process, storing ``stores`` (filters) from the start, and
    running the internal subscriptions ``executes`` (``padres db --execute``)."""

    def __init__(
        self,
        db_id: str,
        broker: str | Sequence[str],
        url: str,
        *,
        stores: Sequence[str] = (),
        executes: Sequence[str] = (),
        log: IO[bytes] | None = None,
    ) -> None:
        """``broker``: its broker's URL, or several to fail over between."""
        super().__init__(f"database {db_id}", r"database \S+ attached to", log)
        self.id = db_id
        self.brokers = [broker] if isinstance(broker, str) else list(broker)
        self.url = url
        self.stores = list(stores)
        self.executes = list(executes)

    def start(self, timeout: float = 20.0) -> None:
        args = ["db", "--id", self.id, "--url", self.url, "--quiet"]
        for broker in self.brokers:
            args += ["--broker", broker]
        for spec in self.stores:
            args += ["--store", spec]
        for internal in self.executes:
            args += ["--execute", internal]
        self._start(args, timeout)
