"""Subscriber clients of a benchmark in processes of their own, and how the benchmark steers them.

The benchmark starts each with ``Apart.start(target, *args)``: a new interpreter (``spawn``)
runs ``target(conn, *args)``, which sets its client up and hands its tally (a
``network.Counter``) to ``serve``. Over the pipe ``conn``, one small message each way:

- to the subscriber: ``("reset", epoch)`` (start counting again), ``("report",)`` (send the
  latencies), ``("stop",)``;
- from it: ``("ready",)`` once it is subscribed, ``("count", epoch, n)`` whenever its count has
  changed (at most every 10 ms) and at once after a reset, which the benchmark waits for,
  ``("report", epoch, latencies)``.

A count of an earlier epoch, still in the pipe after a reset, is ignored. On the benchmark's
side an ``Apart`` is itself a ``Counter``: ``measure`` reads it as it reads one in its own
process.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Protocol

__all__ = ["Apart", "Tally", "serve"]

_POLL = 0.01
"""Seconds between a subscriber's looks at its pipe and its count."""


class Tally(Protocol):
    """A subscriber's count of deliveries and their latencies (``network.Counter``)."""

    @property
    def count(self) -> int: ...

    @property
    def latencies(self) -> list[float]: ...

    def reset(self) -> None: ...


async def serve(conn: Connection, tally: Tally) -> None:
    """The subscriber's side: say it is ready, pass its count on as it changes, answer resets
    and reports, return once told to stop (or once the benchmark has gone)."""
    epoch, told = 0, -1
    conn.send(("ready",))
    while True:
        try:
            while conn.poll():
                match conn.recv():
                    case ("reset", int(epoch)):
                        tally.reset()
                        told = -1
                    case ("report",):
                        conn.send(("report", epoch, tally.latencies))
                    case _:
                        return
            if tally.count != told:
                told = tally.count
                conn.send(("count", epoch, told))
        except (EOFError, BrokenPipeError):
            return
        await asyncio.sleep(_POLL)


class Apart:
    """The benchmark's side of one subscriber process: a ``Counter`` that counts what it says."""

    def __init__(self, target: Callable[..., None], *args: Any) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=target, args=(child, *args), daemon=True)
        self._child = child
        self._epoch = 0
        self._count = 0

    @property
    def pid(self) -> int:
        if self._process.pid is None:
            raise RuntimeError("the subscriber process has not started")
        return self._process.pid

    @classmethod
    async def start(cls, target: Callable[..., None], *args: Any, timeout: float = 120) -> Apart:
        """Start ``target(conn, *args)`` in a new process; return once it says it is ready."""
        apart = cls(target, *args)
        try:
            apart._process.start()
        finally:
            apart._child.close()
        try:
            if not await asyncio.to_thread(apart._conn.poll, timeout):
                raise TimeoutError(f"a subscriber process was not ready within {timeout} s")
            if apart._conn.recv() != ("ready",):
                raise RuntimeError("a subscriber process did not start as it should")
        except (EOFError, BrokenPipeError):
            apart.stop()
            raise RuntimeError("a subscriber process ended before it was ready") from None
        except BaseException:
            apart.stop()
            raise
        asyncio.get_running_loop().add_reader(apart._conn.fileno(), apart._read)
        return apart

    def _read(self) -> None:
        try:
            while self._conn.poll():
                self._take(self._conn.recv())
        except (EOFError, OSError):
            asyncio.get_running_loop().remove_reader(self._conn.fileno())

    def _take(self, message: tuple[Any, ...]) -> list[float] | None:
        match message:
            case ("count", int(epoch), int(count)) if epoch == self._epoch:
                self._count = count
            case ("report", int(epoch), list(latencies)) if epoch == self._epoch:
                return latencies
        return None

    @property
    def count(self) -> int:
        return self._count

    @property
    def latencies(self) -> list[float]:
        """Asked of the subscriber, and waited for."""
        self._conn.send(("report",))
        while True:
            if not self._conn.poll(60):
                raise TimeoutError("a subscriber process did not report its latencies")
            latencies = self._take(self._conn.recv())
            if latencies is not None:
                return latencies

    def reset(self) -> None:
        """Start counting again; returns once the subscriber has (what it gets from then on
        is counted anew, nothing before is)."""
        self._epoch += 1
        self._count = -1
        self._conn.send(("reset", self._epoch))
        while self._count < 0:
            if not self._conn.poll(60):
                raise TimeoutError("a subscriber process did not start counting again")
            self._take(self._conn.recv())

    def stop(self) -> None:
        """Tell the subscriber to stop, and make sure it has."""
        if not self._conn.closed:
            with contextlib.suppress(RuntimeError):  # no loop running: nothing to remove
                asyncio.get_running_loop().remove_reader(self._conn.fileno())
            with contextlib.suppress(OSError):  # it has gone already
                self._conn.send(("stop",))
            self._conn.close()
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(10)
