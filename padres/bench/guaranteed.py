"""``padres bench guaranteed``: what guaranteed delivery costs, and how fast it recovers.

Three ``padres broker`` processes in a chain (A - B - C) on loopback, each with its journal in
a temporary directory. A publisher at A, a subscriber at C. Figures, each the median of
``repeat`` runs:

- plain: publications sent as fast as the publisher can (frames of 500) to a plain
  subscription, until all have arrived: publications per second end to end;
- guaranteed, for each ``--sync`` policy: the same publications sent guaranteed to a durable
  subscription, until all have arrived (and every one is acknowledged): per second, and the
  ratio to plain in the same run;
- recovery: guaranteed publications at a fixed rate while B is killed (SIGKILL) and restarted
  on its port; the time from its restart until the subscriber has everything published so far,
  and a check that it got each publication exactly once, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from padres.bench import machine
from padres.broker.sqlite_journal import Sync
from padres.client.connection import Client, Delivery
from padres.model.messages import Publication
from padres.model.protocol import Notify
from padres.testing.processes import BrokerProcess, free_ports

__all__ = ["report", "run"]


class _Inbox:
    def __init__(self) -> None:
        self.numbers: list[int] = []

    def __call__(self, delivery: Delivery) -> None:
        if isinstance(delivery, Notify):
            self.numbers.append(int(delivery.publication.attributes["n"]))


class _Chain:
    """A - B - C, on fixed ports so that a broker can be restarted where it was; ``options``
    gives each broker's journal options by name; the brokers' ids are ``prefix`` and their
    names."""

    def __init__(self, options: Callable[[str], list[str]], prefix: str = "") -> None:
        ports = free_ports(3)
        self.procs: dict[str, BrokerProcess] = {}
        for i, name in enumerate("ABC"):
            neighbours = [f"ws://127.0.0.1:{ports[i - 1]}"] if i else []
            self.procs[name] = BrokerProcess(
                prefix + name, port=ports[i], neighbours=neighbours, options=options(name)
            )

    def __enter__(self) -> dict[str, str]:
        try:
            return {name: proc.start() for name, proc in self.procs.items()}
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs.values():
            proc.stop()


def _publications(count: int) -> list[Publication]:
    """Numbered publications, with ids no earlier run used (a broker recognises a guaranteed
    publication sent again by its publisher and id)."""
    now = datetime.now(UTC)
    run = os.urandom(4).hex()
    return [Publication(f"q{n}.{run}", {"class": "T", "n": n}, now) for n in range(count)]


async def _until(inbox: _Inbox, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(inbox.numbers) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(inbox.numbers)} of {count} publications arrived")
        await asyncio.sleep(0.002)


async def _throughput(urls: dict[str, str], count: int, guaranteed: bool) -> float:
    async with contextlib.AsyncExitStack() as stack:
        pub = await stack.enter_async_context(Client(urls["A"], "pub", timeout=60))
        sub = await stack.enter_async_context(Client(urls["C"], "sub", timeout=60))
        inbox = _Inbox()
        if guaranteed:
            await sub.subscribe("[class,eq,'T']", inbox, durable="bench")
        else:
            await sub.subscribe("[class,eq,'T']", inbox)
        await pub.advertise("[class,eq,'T'],[n,isPresent,0]")
        pubs = _publications(count)
        started = time.perf_counter()
        for i in range(0, count, 500):
            await pub.publish_many(pubs[i : i + 500], guaranteed=guaranteed)
        await pub.flush(timeout=120)
        await _until(inbox, count, 120)
        elapsed = time.perf_counter() - started
        if inbox.numbers != list(range(count)):
            raise RuntimeError("the publications did not arrive exactly once, in order")
        if guaranteed:
            await sub.unsubscribe("bench")
        return count / elapsed


async def _recovery(chain: _Chain, urls: dict[str, str], rate: float) -> dict[str, Any]:
    """Publish at ``rate`` for six seconds, killing B after two; how long after B is back
    does the subscriber have everything?"""
    count = int(rate * 6)
    async with contextlib.AsyncExitStack() as stack:
        pub = await stack.enter_async_context(Client(urls["A"], "pub", reconnect=True))
        sub = await stack.enter_async_context(Client(urls["C"], "sub", reconnect=True))
        inbox = _Inbox()
        await sub.subscribe("[class,eq,'T']", inbox, durable="recovery")
        await pub.advertise("[class,eq,'T'],[n,isPresent,0]")
        restarted: list[float] = []

        async def kill() -> None:
            await asyncio.sleep(2)
            chain.procs["B"].kill()
            await asyncio.sleep(0.5)
            await asyncio.to_thread(chain.procs["B"].start)
            restarted.append(time.monotonic())

        async def publish() -> None:
            started = time.monotonic()
            for n, p in enumerate(_publications(count)):
                await pub.publish(p, guaranteed=True)
                ahead = started + n / rate - time.monotonic()
                if ahead > 0:
                    await asyncio.sleep(ahead)

        await asyncio.gather(kill(), publish())
        await pub.flush(timeout=60)
        await _until(inbox, count, 60)
        caught_up = time.monotonic()
        exact = inbox.numbers == list(range(count))
        await sub.unsubscribe("recovery")
        return {
            "published": count,
            "received": len(inbox.numbers),
            "exactly_once_in_order": exact,
            "catch_up_s": round(caught_up - restarted[0], 3),
        }


def run(
    count: int = 20_000, repeat: int = 3, rate: float = 2_000, journal: str | None = None
) -> dict[str, Any]:
    """The figures (see the module docstring); ``journal``: also with the brokers' journals in
    PostgreSQL at this URL."""
    result: dict[str, Any] = {"machine": machine(), "count": count, "repeat": repeat}
    with tempfile.TemporaryDirectory(prefix="padres-bench-") as tmp:
        for label, options, prefix in _journals(Path(tmp), journal):
            with _Chain(options, prefix) as urls:
                plain = [asyncio.run(_throughput(urls, count, False)) for _ in range(repeat)]
                kept = [asyncio.run(_throughput(urls, count, True)) for _ in range(repeat)]
            result[label] = {
                "plain_per_s": round(statistics.median(plain)),
                "guaranteed_per_s": round(statistics.median(kept)),
                "ratio": round(statistics.median(kept) / statistics.median(plain), 3),
            }
        chain = _Chain(lambda name: ["--data", str(Path(tmp) / "recovery" / name)])
        with chain as urls:
            result["recovery"] = asyncio.run(_recovery(chain, urls, rate))
    return result


def _sqlite(tmp: Path, sync: Sync, name: str) -> list[str]:
    return ["--data", str(tmp / sync.value / name), "--sync", sync.value]


def _journals(tmp: Path, url: str | None) -> Iterator[tuple[str, Callable[[str], list[str]], str]]:
    """Per journal measured, its label, each broker's options and the prefix of their ids:
    SQLite with each ``--sync`` policy, then PostgreSQL at ``url`` if given, under ids of
    this run only (their journals dropped afterwards)."""
    for sync in Sync:
        yield f"--sync {sync.value}", partial(_sqlite, tmp, sync), ""
    if url is not None:
        from padres.broker.postgres_journal import drop_journal

        prefix = f"bench{os.urandom(3).hex()}"
        try:
            yield "--journal postgresql", lambda name: ["--journal", url], prefix
        finally:
            for name in "ABC":
                drop_journal(url, prefix + name)


def report(result: dict[str, Any]) -> str:
    lines = [
        f"{result['machine']}",
        f"3-broker chain, {result['count']:,} publications, median of {result['repeat']}:",
    ]
    for label, r in result.items():
        if isinstance(r, dict) and "ratio" in r:
            lines.append(
                f"  {label:<21} plain {r['plain_per_s']:>8,}/s   guaranteed "
                f"{r['guaranteed_per_s']:>8,}/s   guaranteed/plain {r['ratio']:.2f}"
            )
    rec = result["recovery"]
    lines.append(
        f"  B killed and restarted mid-stream: {rec['received']:,} of {rec['published']:,} "
        f"received, exactly once in order: {rec['exactly_once_in_order']}, "
        f"caught up {rec['catch_up_s']} s after the restart"
    )
    return "\n".join(lines)
