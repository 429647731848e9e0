"""``padres bench network``: a 3-broker chain of real processes on loopback.

B1 - B2 - B3, each a ``padres broker`` process. One subscriber client per broker holds a third
of the subscriptions (the stock workload: real quotes, PADRES-style subscriptions) as one
``Client.subscribe_many`` group with one handler; one
publisher at B1 sends real quotes. Two figures:

- throughput: quotes sent as fast as the publisher can, in frames of 500, until every expected
  delivery has arrived; publications per second end to end;
- latency at a fixed rate (5,000 per second by default): each quote carries its send time;
  p50 and p99 of arrival minus send time over every delivery.

The expected deliveries come from the Rete matcher run in this process over the same quotes
and subscriptions, and the run fails loudly if the overlay delivered anything else.

The three subscriber clients run in this process beside the publisher, as they always have
(``apart=False``), or each in a process of its own (``apart=True``, ``padres.bench.apart``);
such a process settles its garbage collector once subscribed, as a broker does
(``padres.runtime.collector.freeze``).

Either way the throughput phase is metered (``padres.bench.usage``): the CPU seconds of the
brokers and of the clients' processes, and the bytes each broker sent on all its connections
(its ``sent_bytes``, before any compression) and the publisher sent to its broker, per
delivery; and the bytes received on the wire (TCP's count, framing and compression
included) by the brokers (what the publisher and the links carried, mostly) and, with the
subscribers apart, by the subscribers.

``compress``: the subscriber clients offer compression (``Client(compress=True)``), which the
brokers accept at their default level: what they receive is deflated (permessage-deflate).
``compress_links``: the brokers compress their links too (``--compress-links``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableSequence, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from msgspec.structs import replace

from padres.bench import machine
from padres.bench.apart import Apart, Link, serve
from padres.bench.usage import Meter, get_json, per_delivery, processes, received
from padres.bench.workloads import STOCK_ADVERTISEMENT, stock_publications, stock_subscriptions
from padres.client.connection import Client, Delivery
from padres.client.transport import Dialler, Transport, dial
from padres.matching.rete_matcher import ReteMatcher
from padres.model.codec import decode, encode
from padres.model.messages import Publication, Subscription
from padres.model.protocol import Error, Notify
from padres.runtime import collector
from padres.testing.processes import BrokerProcess

__all__ = ["Counted", "Counter", "Deliveries", "Work", "measure", "report", "run", "settled"]


class Counter(Protocol):
    """A subscriber side's tally: deliveries counted (once per client and publication) and
    latencies (seconds) of those that carried their send time."""

    @property
    def count(self) -> int: ...

    @property
    def latencies(self) -> list[float]: ...

    def reset(self) -> None: ...


class Deliveries:
    """Counts one client's deliveries, and publications delivered twice. The client holds
    its share of the subscriptions as one ``subscribe_many`` group, whose handler is called
    once per publication (as a NATS subscriber matching its own share counts each quote
    once)."""

    def __init__(self, shown: MutableSequence[int] | None = None) -> None:
        """``shown``: where the count is written as it changes, for another process
        (``apart.Link.count``)."""
        self.reset()
        self.duplicates = 0
        self._shown = shown

    def reset(self) -> None:
        self.count = 0
        self.latencies: list[float] = []
        self._seen: set[str] = set()

    def __call__(self, delivery: Delivery) -> None:
        if isinstance(delivery, Notify):
            pid = delivery.publication.id
            if pid in self._seen:
                self.duplicates += 1
                return
            self._seen.add(pid)
            self.count += 1
            if self._shown is not None:
                self._shown[0] = self.count
            sent = delivery.publication.attributes.get("sent")
            if isinstance(sent, float):
                self.latencies.append(time.time() - sent)


def _expected(shares: list[list[Subscription]], pubs: list[Publication]) -> int:
    total = 0
    for subs in shares:
        matcher = ReteMatcher()
        for sub in subs:
            matcher.add(sub)
        for start in range(0, len(pubs), 100):  # the alpha network is fastest on batches
            results = matcher.network.match_batch(pubs[start : start + 100])
            total += sum(1 for r in results if r.conditions)
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


def _exactly(counters: Sequence[Counter], expected: int) -> None:
    got = sum(c.count for c in counters)
    if got != expected:
        raise RuntimeError(f"{got} deliveries counted where {expected} were expected")


async def measure(
    send: Callable[[list[Publication]], Awaitable[None]],
    counters: Sequence[Counter],
    work: Work,
    meter: Meter | None = None,
) -> dict[str, Any]:
    """Throughput (``work.batch`` sent as fast as ``send`` takes it, in chunks of 500, until
    every expected delivery has been counted) and latency at ``work.rate`` (each publication
    carries its send time in ``sent``). Any more deliveries than expected fail the run.
    ``meter``: what the throughput phase cost, per delivery (``usage.per_delivery``)."""
    if meter is not None:
        meter.start()
    started = time.perf_counter()
    for start in range(0, len(work.batch), 500):
        await send(work.batch[start : start + 500])
    finished = await _wait(counters, work.expected, 120)
    throughput = len(work.batch) / (finished - started)
    usage = {} if meter is None else per_delivery(meter.stop(), work.expected)
    _exactly(counters, work.expected)
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
    await asyncio.sleep(0.2)  # anything delivered twice has come by now
    _exactly(counters, work.expected_paced)
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
        **usage,
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


class _CountedTransport:
    """A transport that adds up the bytes of the frames it sends."""

    def __init__(self, inner: Transport, counted: Counted) -> None:
        self._inner = inner
        self._counted = counted
        self.url = inner.url

    @property
    def reason(self) -> str:
        return self._inner.reason

    @reason.setter
    def reason(self, value: str) -> None:
        self._inner.reason = value

    async def send(self, frame: bytes) -> None:
        await self._inner.send(frame)
        self._counted.sent_bytes += len(frame)

    def frames(self) -> AsyncIterator[bytes]:
        return self._inner.frames()

    async def close(self) -> None:
        await self._inner.close()


class Counted:
    """A dialler of a broker's WebSocket endpoint whose transports count the bytes of the
    frames a client sends (without the WebSocket's framing): ``sent_bytes``."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self._dial: Dialler = dial([url], timeout=timeout, tls=None)
        self.sent_bytes = 0

    async def __call__(self) -> Transport:
        return _CountedTransport(await self._dial(), self)


def _subscriber(
    link: Link, url: str, name: str, share: list[bytes], compress: bool = False
) -> None:
    """A subscriber client in a process of its own: subscribes ``share`` (encoded
    subscriptions) and counts as ``Deliveries`` does, steered through ``link``; ``compress``:
    it offers compression."""
    asyncio.run(_subscribe_and_serve(link, url, name, share, compress))


async def _subscribe_and_serve(
    link: Link, url: str, name: str, share: list[bytes], compress: bool
) -> None:
    counter = Deliveries(link.count)
    subs = [decode(data) for data in share]
    filters = [sub.filter for sub in subs if isinstance(sub, Subscription)]
    if len(filters) != len(subs):
        raise TypeError("a subscriber was given something other than subscriptions")
    async with Client(url, name, timeout=60, compress=compress) as client:
        await client.subscribe_many(filters, counter, id="s")
        collector.freeze()  # loaded: settled as a broker settles it
        await serve(link, counter)


def _sent(brokers: Sequence[BrokerProcess], publisher: Counted) -> Callable[[], dict[str, int]]:
    """Reads the bytes sent so far by each broker (B1, B2, ...) and by the publisher."""
    health = {f"B{i + 1}": f"http://127.0.0.1:{p.port}/health" for i, p in enumerate(brokers)}

    def read() -> dict[str, int]:
        sent = {name: int(get_json(url)["sent_bytes"]) for name, url in health.items()}
        return {**sent, "publisher": publisher.sent_bytes}

    return read


async def _bench(
    brokers: Sequence[BrokerProcess],
    subs: int,
    pubs: int,
    rate: float,
    seconds: float,
    data: Path | None,
    apart: bool,
    compress: bool,
) -> dict[str, Any]:
    urls = [p.url for p in brokers]
    quotes = stock_publications(data)
    workload = list(stock_subscriptions(subs, quotes, seed=1))
    shares = [workload[i :: len(urls)] for i in range(len(urls))]
    work = Work.of(shares, quotes, pubs, rate, seconds)
    async with contextlib.AsyncExitStack() as stack:
        refused: list[Error] = []
        dialler = Counted(urls[0])
        publisher = await stack.enter_async_context(
            Client(urls[0], "bench-pub", on_error=refused.append, transport=dialler)
        )
        counters: list[Counter] = []
        duplicates: list[Deliveries] = []
        for i, (url, share) in enumerate(zip(urls, shares, strict=True)):
            if apart:
                encoded = [encode(sub) for sub in share]
                remote = await Apart.start(_subscriber, url, f"bench-sub{i}", encoded, compress)
                stack.callback(remote.stop)
                counters.append(remote)
                continue
            client = await stack.enter_async_context(
                Client(url, f"bench-sub{i}", timeout=60, compress=compress)
            )
            counter = Deliveries()
            counters.append(counter)
            duplicates.append(counter)
            await client.subscribe_many([sub.filter for sub in share], counter, id="s")
        await publisher.advertise(STOCK_ADVERTISEMENT)
        await publisher.advertise(STOCK_ADVERTISEMENT + ",[sent,isPresent,0]")
        await settled(publisher)

        async def send(chunk: list[Publication]) -> None:
            if refused:
                raise RuntimeError(f"the broker refused a publication: {refused[0].text}")
            await publisher.publish_many(chunk)

        broker_pids = [p.pid for p in brokers if p.pid is not None]
        wire = {"servers": broker_pids}
        if apart:
            subscribers = [c.pid for c in counters if isinstance(c, Apart)]
            roles = {"servers": broker_pids, "subscribers": subscribers, "publisher": [os.getpid()]}
            wire["subscribers"] = subscribers
        else:
            roles = {"servers": broker_pids, "clients": [os.getpid()]}
        meter = Meter(processes(roles), _sent(brokers, dialler), received(wire))
        figures = await measure(send, counters, work, meter)
    return {
        "machine": machine(),
        "brokers": len(urls),
        "subscriptions": subs,
        "subscribers_apart": apart,
        "compressed": compress,
        "duplicates": sum(c.duplicates for c in duplicates),
        **figures,
    }


def run(
    subs: int = 10_000,
    pubs: int = 50_000,
    rate: float = 5_000,
    seconds: float = 5.0,
    data: Path | None = None,
    *,
    apart: bool = False,
    compress: bool = False,
    compress_links: bool = False,
) -> dict[str, Any]:
    """The chain's figures; ``apart``: each subscriber client in a process of its own;
    ``compress``: the subscribers' connections compressed; ``compress_links``: the links."""
    procs = [BrokerProcess("B1")]
    procs[0].start()
    options = ["--compress-links"] if compress_links else []
    try:
        for name in ("B2", "B3"):
            proc = BrokerProcess(name, neighbours=[procs[-1].url], options=options)
            proc.start()
            procs.append(proc)
        figures = asyncio.run(_bench(procs, subs, pubs, rate, seconds, data, apart, compress))
        return {**figures, "links_compressed": compress_links}
    finally:
        for proc in procs:
            proc.stop()


def _usage_lines(r: dict[str, Any]) -> list[str]:
    """What a metered run's throughput phase cost per delivery, as report lines."""
    cpu = r.get("cpu_us_per_delivery")
    sent = r.get("bytes_per_delivery")
    if not cpu or not sent:
        return []
    names = {
        "servers": "servers",
        "subscribers": "subscribers",
        "publisher": "publisher",
        "clients": "publisher and subscribers (one process)",
    }
    spent = ", ".join(f"{names.get(k, k)} {v:,.1f}" for k, v in cpu.items())
    parts = ", ".join(f"{k} {v:,.0f}" for k, v in sent.items() if k != "total")
    lines = [f"  per delivery: CPU {spent} us; bytes sent {sent['total']:,.0f} ({parts})"]
    got = r.get("bytes_received_per_delivery") or {}
    if got:
        whom = {
            "servers": "servers (from the publisher and the links)",
            "subscribers": "subscribers",
        }
        took = ", ".join(f"{whom.get(k, k)} {v:,.1f}" for k, v in got.items())
        lines.append(f"  per delivery: bytes received on the wire (TCP's count): {took}")
    return lines


def report(r: dict[str, Any]) -> str:
    where = "each in its own process" if r.get("subscribers_apart") else "in one process"
    if r.get("compressed"):
        where += ", compressed (permessage-deflate)"
    if r.get("links_compressed"):
        where += "; links compressed"
    return "\n".join(
        [
            f"{r['brokers']}-broker chain (real processes, loopback), {r['subscriptions']:,} "
            f"subscriptions spread over the brokers, publisher at the first, subscribers {where}",
            f"  throughput: {r['publications_per_second']:,.0f} publications per second end to "
            f"end ({r['throughput_pubs']:,} quotes, {r['throughput_deliveries']:,} deliveries, "
            f"{r['duplicates']} duplicates)",
            f"  latency at {r['rate']:,.0f} per second: p50 {r['latency_p50_ms']:.2f} ms, "
            f"p99 {r['latency_p99_ms']:.2f} ms ({r['latency_samples']:,} deliveries)",
            *_usage_lines(r),
        ]
    )
