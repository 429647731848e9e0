"""Subscriber clients of a benchmark in processes of their own, and how the benchmark steers them.

The benchmark starts each with ``Apart.start(target, *args)``: a new interpreter (``spawn``)
runs ``target(link, *args)``, which sets its client up and hands its tally (a
``network.Counter``) to ``serve``. The ``Link`` holds a pipe for the few commands, one small
message each way:

- to the subscriber: ``("reset", epoch)`` (start counting again), ``("report",)`` (send the
  latencies), ``("stop",)``;
- from it: ``("ready",)`` once it is subscribed, ``("report", epoch, latencies)``;

and two numbers in memory both processes share: the epoch of the subscriber's last reset,
written by ``serve``, and its count, which the tally writes there itself as it counts
(``Link.count``, given to the tally by the target). The benchmark reads the count without a
word to the subscriber, which is woken by nothing but its commands: being steered costs it
next to nothing beside its deliveries (a subscriber that looked at a pipe every 10 ms spent
about 20 ms of CPU a second doing so on a busy machine, more than a microsecond per delivery
in the chain). A count of an earlier epoch is read as nothing. On the benchmark's side an
``Apart`` is itself a ``Counter``: ``measure`` reads it as it reads one in its own process.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Protocol

__all__ = ["Apart", "Link", "Tally", "serve"]


class Tally(Protocol):
    """A subscriber's count of deliveries and their latencies (``network.Counter``)."""

    @property
    def count(self) -> int: ...

    @property
    def latencies(self) -> list[float]: ...

    def reset(self) -> None: ...


@dataclass(frozen=True)
class Link:
    """The subscriber's end: the command pipe, and the shared epoch and count."""

    conn: Connection
    epoch: Any
    """A ``multiprocessing.RawArray`` of one 64-bit integer."""
    count: Any
    """Likewise: the tally writes its count to ``count[0]`` whenever it changes."""


async def serve(link: Link, tally: Tally) -> None:
    """The subscriber's side: say it is ready, answer resets and reports, return once told to
    stop (or once the benchmark has gone). ``tally`` keeps ``link.count`` itself."""
    conn = link.conn
    loop = asyncio.get_running_loop()
    stopped = loop.create_future()
    epoch = 0

    def command() -> None:
        nonlocal epoch
        try:
            match conn.recv():
                case ("reset", int(epoch)):
                    tally.reset()
                    link.count[0] = 0
                    link.epoch[0] = epoch
                    return
                case ("report",):
                    conn.send(("report", epoch, tally.latencies))
                    return
        except (EOFError, BrokenPipeError):
            pass
        loop.remove_reader(conn.fileno())  # told to stop, or the benchmark has gone
        stopped.set_result(None)

    conn.send(("ready",))
    loop.add_reader(conn.fileno(), command)
    await stopped


class Apart:
    """The benchmark's side of one subscriber process: a ``Counter`` that counts what it says."""

    def __init__(self, target: Callable[..., None], *args: Any) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._link = Link(child, context.RawArray("q", 1), context.RawArray("q", 1))
        self._process = context.Process(target=target, args=(self._link, *args), daemon=True)
        self._child = child
        self._epoch = 0

    @property
    def pid(self) -> int:
        if self._process.pid is None:
            raise RuntimeError("the subscriber process has not started")
        return self._process.pid

    @classmethod
    async def start(cls, target: Callable[..., None], *args: Any, timeout: float = 120) -> Apart:
        """Start ``target(link, *args)`` in a new process; return once it says it is ready."""
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
        return apart

    @property
    def count(self) -> int:
        """The subscriber's count since the last reset."""
        return int(self._link.count[0]) if self._link.epoch[0] == self._epoch else 0

    @property
    def latencies(self) -> list[float]:
        """Asked of the subscriber, and waited for."""
        self._conn.send(("report",))
        while True:
            if not self._conn.poll(60):
                raise TimeoutError("a subscriber process did not report its latencies")
            match self._conn.recv():
                case ("report", int(epoch), list(latencies)) if epoch == self._epoch:
                    return latencies

    def reset(self) -> None:
        """Start counting again; returns once the subscriber has (what it gets from then on
        is counted anew, nothing before is)."""
        self._epoch += 1
        self._conn.send(("reset", self._epoch))
        deadline = time.monotonic() + 60
        while self._link.epoch[0] != self._epoch:
            if time.monotonic() > deadline:
                raise TimeoutError("a subscriber process did not start counting again")
            time.sleep(0.001)

    def stop(self) -> None:
        """Tell the subscriber to stop, and make sure it has."""
        if not self._conn.closed:
            with contextlib.suppress(OSError):  # it has gone already
                self._conn.send(("stop",))
            self._conn.close()
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(10)
