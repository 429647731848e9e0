"""``padres bench paths``: adaptive paths between test hosts, against brokers that keep theirs.

A cycle of four brokers A-B-C-D, each on a test host of its own (``padres.testing.hosts``),
with the default heartbeat (a silent link is given up after 10 s): the publisher at A, the
subscribers at C, whose link to B goes through the fault proxy. D joins last, so that the
trees reach C through B first and D's way comes as an offer. Two faults:

- **slow**: the proxy delays B-C by 200 ms each way while a plain publication goes every
  20 ms; the latency of each (from its publishing to its delivery, both on this machine's
  clock): the median before, in the first second after, and from ``settle`` seconds after
  on;
- **frozen**: the broker carrying the publications to C (B or D) is frozen (SIGSTOP) for
  ``frozen`` seconds, then thawed, while a plain publication goes every 10 ms and a
  guaranteed one every 50 ms to a durable subscription at C: the longest time no plain
  publication arrived after the freeze, the plain ones lost or taken twice, and whether the
  durable subscription took every guaranteed one once, in order.

The baseline is the same with ``--no-adaptive-paths`` (trees keep their parents until the
link is lost). ``tests/test_paths_hosts.py`` runs the adaptive side with the same code.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Final

import orjson

from padres.bench import machine
from padres.client.connection import Client, Delivery
from padres.errors import HostsError
from padres.model.protocol import Notify, http_url
from padres.testing.hosts import Host, Hosts, unavailable
from padres.testing.processes import BrokerProcess
from padres.testing.proxy import Proxy

__all__ = ["Ring", "frozen", "report", "ring", "run", "slowed"]

PORT: Final = 8001
"""Every broker listens on this port of its own host."""
DELAY: Final = 0.2
"""Seconds the proxy delays B-C each way."""
LINKED_WITHIN: Final = 30.0


@dataclass
class Ring:
    """The cycle, its clients, and what reached them."""

    hosts: Hosts
    brokers: dict[str, BrokerProcess]
    proxy: Proxy
    publisher: Client
    sent: dict[int, float] = field(default_factory=dict)
    """Plain publication number -> when it was published (``time.monotonic``)."""
    arrived: list[tuple[int, float]] = field(default_factory=list)
    """Plain publications delivered at C, in order: (number, when)."""
    durable: list[int] = field(default_factory=list)
    """Guaranteed publications taken by the durable subscription at C, in order."""
    count: int = 0
    guaranteed: int = 0

    def health(self, name: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"{http_url(self.brokers[name].url)}/health") as r:
            return orjson.loads(r.read())  # type: ignore[no-any-return]

    def moves(self, name: str) -> int:
        return int(self.health(name)["paths"]["moves"])

    async def steady(self, within: float = 15.0) -> None:
        """Wait until no tree at C is moving (none has a former parent not let go of)."""
        deadline = time.monotonic() + within
        while self.health("C")["paths"]["moving"]:
            if time.monotonic() > deadline:
                raise TimeoutError("the trees at C kept moving")
            await asyncio.sleep(0.1)

    async def publish(self, seconds: float, every: float, guaranteed_every: float = 0.0) -> None:
        """Plain publications every ``every`` seconds for ``seconds`` (and guaranteed ones
        every ``guaranteed_every``, if given)."""
        until = time.monotonic() + seconds
        due = time.monotonic()
        while (now := time.monotonic()) < until:
            self.count += 1
            self.sent[self.count] = now
            await self.publisher.publish({"class": "T", "n": self.count})
            if guaranteed_every and now >= due:
                due = now + guaranteed_every
                self.guaranteed += 1
                body = {"class": "G", "n": self.guaranteed}
                await self.publisher.publish(body, guaranteed=True)
            await asyncio.sleep(every)

    def latencies(self, since: float, until: float = float("inf")) -> list[float]:
        """Seconds each plain publication published in [since, until) took to arrive."""
        return [at - self.sent[n] for n, at in self.arrived if since <= self.sent[n] < until]


def _broker(name: str, host: Host, adaptive: bool) -> BrokerProcess:
    options = [] if adaptive else ["--no-adaptive-paths"]
    proc = BrokerProcess(name, port=PORT, host=host.address, within=host.prefix, options=options)
    proc.url = f"ws://{host.address}:{PORT}/ws"
    return proc


@contextlib.asynccontextmanager
async def ring(adaptive: bool = True) -> AsyncIterator[Ring]:
    """The cycle on four test hosts, linked, its trees through B, its clients connected
    (``HostsError`` where hosts cannot be made)."""
    why = unavailable()
    if why is not None:
        raise HostsError(why)
    with Hosts(4) as hosts:
        proxy = Proxy(PORT, host=hosts[1].address, listen=hosts.gateway)
        via = await proxy.start()
        a, b, c, d = (
            _broker(name, host, adaptive) for name, host in zip("ABCD", hosts, strict=True)
        )
        b.neighbours, c.neighbours, d.neighbours = [a.url], [via], [a.url, c.url]
        brokers = {"A": a, "B": b, "C": c, "D": d}
        try:
            await asyncio.gather(*(asyncio.to_thread(p.start) for p in (a, b, c)))
            async with (
                Client(a.url, "pub", timeout=20) as publisher,
                Client(c.url, "sub", timeout=20) as subscriber,
            ):
                state = Ring(hosts, brokers, proxy, publisher)
                await _linked(state, {"A": ["B"], "B": ["A", "C"], "C": ["B"]})
                await publisher.advertise("[class,eq,'T'],[n,isPresent,0]")
                await publisher.advertise("[class,eq,'G'],[n,isPresent,0]")

                def plain(delivery: Delivery) -> None:
                    assert isinstance(delivery, Notify)
                    number = int(delivery.publication.attributes["n"])
                    state.arrived.append((number, time.monotonic()))

                def durable(delivery: Delivery) -> None:
                    assert isinstance(delivery, Notify)
                    state.durable.append(int(delivery.publication.attributes["n"]))

                await subscriber.subscribe("[class,eq,'T']", plain)
                await subscriber.subscribe("[class,eq,'G']", durable, durable="g")
                await asyncio.to_thread(d.start)
                wanted = {"A": ["B", "D"], "B": ["A", "C"], "C": ["B", "D"], "D": ["A", "C"]}
                await _linked(state, wanted)
                await asyncio.sleep(1.0)  # D's offers reach C, the links are measured
                yield state
        finally:
            await proxy.cut()
            await asyncio.gather(*(asyncio.to_thread(p.stop) for p in brokers.values()))


async def _linked(state: Ring, wanted: dict[str, list[str]]) -> None:
    deadline = time.monotonic() + LINKED_WITHIN
    while not all(state.health(name)["neighbours"] == w for name, w in wanted.items()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the brokers did not link as {wanted} in time")
        await asyncio.sleep(0.1)


async def slowed(state: Ring, seconds: float = 6.0, settle: float = 3.0) -> dict[str, Any]:
    """The slow fault (see the module docstring); the link is fast again afterwards."""
    await state.steady()
    moves = state.moves("C")
    began = time.monotonic()
    await state.publish(1.0, 0.02)
    state.proxy.delay = DELAY
    delayed = time.monotonic()
    try:
        await state.publish(seconds, 0.02)
        await asyncio.sleep(1.0)  # the last ones arrive
    finally:
        state.proxy.delay = 0.0
    before = state.latencies(began, delayed)
    first = state.latencies(delayed, delayed + 1.0)
    after = state.latencies(delayed + settle)
    return {
        "delay_ms": DELAY * 1000,
        "before_ms": _median_ms(before),
        "first_second_ms": _median_ms(first),
        "first_second_max_ms": round(max(first, default=0.0) * 1000, 1),
        "after_ms": _median_ms(after),
        "after_p90_ms": round(_quantile(after, 0.9) * 1000, 1),
        "settle_seconds": settle,
        "moves": state.moves("C") - moves,
        "published": sum(1 for t in state.sent.values() if t >= began),
        "arrived": len(state.latencies(began)),
    }


async def frozen(state: Ring, seconds: float = 6.0) -> dict[str, Any]:
    """The frozen fault (see the module docstring)."""
    await state.steady()
    moves = state.moves("C")
    first = state.count + 1
    await state.publish(1.0, 0.01, 0.05)
    parents = state.health("C")["paths"]["parents"]
    on_path = max(parents, key=lambda name: parents[name])  # both trees, as a rule
    state.brokers[on_path].pause()
    stopped = time.monotonic()
    try:
        await state.publish(seconds, 0.01, 0.05)
    finally:
        state.brokers[on_path].resume()
    await state.publish(2.0, 0.01, 0.05)
    with contextlib.suppress(TimeoutError):
        await state.publisher.flush(20.0)
    deadline = time.monotonic() + 20.0
    while len(state.durable) < state.guaranteed and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)
    times = sorted([stopped, *(at for _, at in state.arrived if at > stopped)])
    numbers = [n for n, _ in state.arrived if n >= first]
    wanted = list(range(1, state.guaranteed + 1))
    return {
        "frozen": on_path,
        "frozen_seconds": seconds,
        "gap_seconds": round(max(b - a for a, b in pairwise(times)), 3),
        "published": state.count - first + 1,
        "lost": len(set(range(first, state.count + 1)) - set(numbers)),
        "twice": len(numbers) - len(set(numbers)),
        "guaranteed": state.guaranteed,
        "guaranteed_once_in_order": state.durable == wanted,
        "guaranteed_taken": len(state.durable),
        "moves": state.moves("C") - moves,
    }


def _median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 1) if values else float("nan")


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def _both(adaptive: bool, freeze: float) -> dict[str, Any]:
    async with ring(adaptive) as state:
        slow = await slowed(state)
        stop = await frozen(state, freeze)
    return {"slow": slow, "frozen": stop}


def run(
    freeze: float = 6.0,
    baseline: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Both faults with adaptive paths, then (with ``baseline``) without."""
    say = progress or (lambda line: None)
    why = unavailable()
    if why is not None:
        return {"machine": machine(), "unavailable": why}
    say("adaptive paths: slowed, then frozen")
    result: dict[str, Any] = {"machine": machine(), "adaptive": asyncio.run(_both(True, freeze))}
    if baseline:
        say("--no-adaptive-paths: slowed, then frozen")
        result["fixed"] = asyncio.run(_both(False, freeze))
    return result


def report(r: dict[str, Any]) -> str:
    if "unavailable" in r:
        return f"test hosts cannot be made here: {r['unavailable']}"
    lines = ["a cycle A-B-C-D on four test hosts, default heartbeat, publisher at A, C subscribes"]
    for side, label in (("adaptive", "adaptive paths"), ("fixed", "--no-adaptive-paths")):
        if side not in r:
            continue
        s, f = r[side]["slow"], r[side]["frozen"]
        lines += [
            f"{label}:",
            f"  B-C slowed by {s['delay_ms']:.0f} ms each way: median latency {s['before_ms']} ms "
            f"before, {s['first_second_ms']} ms in the first second (max "
            f"{s['first_second_max_ms']} ms), {s['after_ms']} ms from {s['settle_seconds']:g} s "
            f"on (p90 {s['after_p90_ms']} ms); {s['moves']} moves at C",
            f"  {f['frozen']} frozen for {f['frozen_seconds']:g} s: plain publications stopped "
            f"for {f['gap_seconds']} s at most; {f['lost']} of {f['published']} lost, "
            f"{f['twice']} taken twice; guaranteed: {f['guaranteed_taken']} of "
            f"{f['guaranteed']} taken, once and in order: {f['guaranteed_once_in_order']}; "
            f"{f['moves']} moves at C",
        ]
    return "\n".join(lines)
