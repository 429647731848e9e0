"""``padres bench network``: a 3-broker chain of real processes on loopback.

B1 - B2 - B3, each a ``padres broker`` process. One subscriber client per broker holds a third
of the subscriptions (the stock workload: real quotes, PADRES-style subscriptions); one
publisher at B1 sends real quotes. Two figures:

- throughput: quotes sent as fast as the publisher can, in frames of 500, until every expected
  delivery has arrived; publications per second end to end;
- latency at a fixed rate (5,000 per second by default): each quote carries its send time;
  p50 and p99 of arrival minus send time over every delivery.

The expected deliveries come from the Rete matcher run in this process over the same quotes
and subscriptions, and the run fails loudly if the overlay delivered anything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from msgspec.structs import replace

from padres.bench import machine
from padres.bench.workloads import STOCK_ADVERTISEMENT, stock_publications, stock_subscriptions
from padres.client.connection import Client, Delivery
from padres.matching.rete_matcher import ReteMatcher
from padres.model.messages import Publication, Subscription
from padres.model.protocol import Error, Notify
from padres.testing.processes import BrokerProcess

__all__ = ["Counter", "Work", "measure", "report", "run", "settled"]


class Counter(Protocol):
    """A subscriber side's tally: deliveries counted (once per client and publication) and
    latencies (seconds) of those that carried their send time."""

    count: int
    latencies: list[float]

    def reset(self) -> None: ...


class _Counter:
    """Counts one client's deliveries (a delivery naming several of its subscriptions is
    handed to each of them: it counts once), and publications delivered twice."""

    def __init__(self) -> None:
        self.reset()
        self.duplicates = 0
        self._last: Delivery | None = None

    def reset(self) -> None:
        self.count = 0
        self.latencies: list[float] = []
        self._seen: set[str] = set()

    def __call__(self, delivery: Delivery) -> None:
        if delivery is self._last:
            return
        self._last = delivery
        if isinstance(delivery, Notify):
            pid = delivery.publication.id
            if pid in self._seen:
                self.duplicates += 1
                return
            self._seen.add(pid)
            self.count += 1
            sent = delivery.publication.attributes.get("sent")
            if isinstance(sent, float):
                self.latencies.append(time.time() - sent)


def _expected(shares: list[list[Subscription]], pubs: list[Publication]) -> int:
    total = 0
    for subs in shares:
        matcher = ReteMatcher()
        for sub in subs:
            matcher.add(sub)
        total += sum(1 for p in pubs if matcher.match(p).subscriptions)
    return total


@dataclass(frozen=True)
class Work:
    """What is published, and how many deliveries it should make: ``batch`` as fast as
    possible, ``paced`` at ``rate`` per second."""

    batch: list[Publication]
    paced: list[Publication]
    rate: float
    expected: int
    expected_paced: int

    @classmethod
    def of(
        cls,
        shares: list[list[Subscription]],
        quotes: list[Publication],
        pubs: int,
        rate: float,
        seconds: float,
    ) -> Work:
        """The quotes for subscriptions split in ``shares`` (one per subscriber client). It is
        worked out before connecting: matching here blocks the event loop, and a client that
        does not answer its broker's pings meanwhile would be dropped."""
        batch = quotes[:pubs]
        paced = quotes[pubs : pubs + int(rate * seconds)] or quotes[: int(rate * seconds)]
        return cls(batch, paced, rate, _expected(shares, batch), _expected(shares, paced))


async def _wait(counters: Sequence[Counter], expected: int, timeout: float) -> float:
    deadline = time.perf_counter() + timeout
    while sum(c.count for c in counters) < expected:
        if time.perf_counter() > deadline:
            got = sum(c.count for c in counters)
            raise RuntimeError(f"only {got} of {expected} deliveries arrived")
        await asyncio.sleep(0.002)
    return time.perf_counter()


async def measure(
    send: Callable[[list[Publication]], Awaitable[None]],
    counters: Sequence[Counter],
    work: Work,
) -> dict[str, Any]:
    """Throughput (``work.batch`` sent as fast as ``send`` takes it, in chunks of 500, until
    every expected delivery has been counted) and latency at ``work.rate`` (each publication
    carries its send time in ``sent``)."""
    started = time.perf_counter()
    for start in range(0, len(work.batch), 500):
        await send(work.batch[start : start + 500])
    finished = await _wait(counters, work.expected, 120)
    throughput = len(work.batch) / (finished - started)
    for c in counters:
        c.reset()
    tick = 0.01
    per_tick = max(1, int(work.rate * tick))
    begin = time.perf_counter()
    for i in range(0, len(work.paced), per_tick):
        now = time.time()
        chunk = [
            replace(q, id=f"l{i + j}", attributes={**q.attributes, "sent": now})
            for j, q in enumerate(work.paced[i : i + per_tick])
        ]
        await send(chunk)
        delay = begin + (i // per_tick + 1) * tick - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
    await _wait(counters, work.expected_paced, 60)
    latencies = sorted(x * 1000 for c in counters for x in c.latencies)
    return {
        "throughput_pubs": len(work.batch),
        "throughput_deliveries": work.expected,
        "publications_per_second": throughput,
        "rate": work.rate,
        "paced_pubs": len(work.paced),
        "latency_p50_ms": statistics.median(latencies) if latencies else None,
        "latency_p99_ms": latencies[int(0.99 * (len(latencies) - 1))] if latencies else None,
        "latency_samples": len(latencies),
    }


async def settled(client: Client, quiet: float = 1.0, timeout: float = 60.0) -> None:
    """Wait until the client's broker has held the same subscriptions (at least one) for
    ``quiet`` seconds: those made elsewhere have found their way to it."""
    loop = asyncio.get_running_loop()
    last: tuple[str, ...] = ()
    since = loop.time()
    deadline = since + timeout
    while not last or loop.time() - since < quiet:
        rows = await client.query("subscriptions")
        if rows != last:
            last, since = rows, loop.time()
        if loop.time() > deadline:
            raise TimeoutError(f"routing did not settle within {timeout} s")
        await asyncio.sleep(0.2)  # a broker answers at most 10 queries a second per connection


async def _bench(
    urls: list[str], subs: int, pubs: int, rate: float, seconds: float, data: Path | None
) -> dict[str, Any]:
    quotes = stock_publications(data)
    workload = list(stock_subscriptions(subs, quotes, seed=1))
    shares = [workload[i :: len(urls)] for i in range(len(urls))]
    work = Work.of(shares, quotes, pubs, rate, seconds)
    async with contextlib.AsyncExitStack() as stack:
        refused: list[Error] = []
        publisher = await stack.enter_async_context(
            Client(urls[0], "bench-pub", on_error=refused.append)
        )
        counters = []
        for i, (url, share) in enumerate(zip(urls, shares, strict=True)):
            client = await stack.enter_async_context(Client(url, f"bench-sub{i}", timeout=60))
            counter = _Counter()
            counters.append(counter)
            for sub in share:
                await client.subscribe(sub.filter, counter, id=sub.id)
        await publisher.advertise(STOCK_ADVERTISEMENT)
        await publisher.advertise(STOCK_ADVERTISEMENT + ",[sent,isPresent,0]")
        await settled(publisher)

        async def send(chunk: list[Publication]) -> None:
            if refused:
                raise RuntimeError(f"the broker refused a publication: {refused[0].text}")
            await publisher.publish_many(chunk)

        figures = await measure(send, counters, work)
    return {
        "machine": machine(),
        "brokers": len(urls),
        "subscriptions": subs,
        "duplicates": sum(c.duplicates for c in counters),
        **figures,
    }


def run(
    subs: int = 10_000,
    pubs: int = 50_000,
    rate: float = 5_000,
    seconds: float = 5.0,
    data: Path | None = None,
) -> dict[str, Any]:
    procs = [BrokerProcess("B1")]
    procs[0].start()
    try:
        for name in ("B2", "B3"):
            proc = BrokerProcess(name, neighbours=[procs[-1].url])
            proc.start()
            procs.append(proc)
        return asyncio.run(_bench([p.url for p in procs], subs, pubs, rate, seconds, data))
    finally:
        for proc in procs:
            proc.stop()


def report(r: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"{r['brokers']}-broker chain (real processes, loopback), {r['subscriptions']:,} "
            "subscriptions spread over the brokers, publisher at the first",
            f"  throughput: {r['publications_per_second']:,.0f} publications per second end to "
            f"end ({r['throughput_pubs']:,} quotes, {r['throughput_deliveries']:,} deliveries, "
            f"{r['duplicates']} duplicates)",
            f"  latency at {r['rate']:,.0f} per second: p50 {r['latency_p50_ms']:.2f} ms, "
            f"p99 {r['latency_p99_ms']:.2f} ms ({r['latency_samples']:,} deliveries)",
        ]
    )
