"""``padres bench overlay --processes N``: the random cyclic overlay of ``padres bench overlay``
made of N real broker processes, each on a test host of its own (``padres.testing.hosts``; on
this machine's loopback, said in the report, where hosts cannot be made), with real clients,
checked by the simulation's oracle (``overlay.Oracle``).

Clients connected to random brokers advertise, subscribe, publish, unsubscribe, unadvertise
and leave, in rounds: a round's operations are issued one after another, 50 a second, each
going on while the next begin (a request returns once its routing has settled
across the overlay). When every request has returned, the round waits for every delivery the
oracle says it owes, and then until nothing more arrives; then the oracle checks the round: at
most once, only to matching subscriptions, and to every subscription that was acknowledged,
with the publisher's advertisement, before the publication was sent. A delivery that comes
in a later round is still checked against at most once. At the end every client leaves and
every broker's routing tables, read from its ``/health``, must empty.

Unlike the simulation's: what is withdrawn (unsubscribed, unadvertised) is always something
already acknowledged; a client hands its application only the deliveries of subscriptions it
still holds, so a delivery for a withdrawn one is seen only beside one for a subscription held;
and composite subscriptions are left to the simulation: which publications reached a broker,
which their check needs, cannot be read from a process.

Reported: how long the brokers took to listen and to link, each broker's memory (resident
set), the messages the brokers sent one another (``to_neighbours`` of ``/health``),
deliveries, the deliveries the oracle required, and the violations (there must be none).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from padres.bench import machine
from padres.bench.overlay import Held, Oracle, conforming, random_filter, topology
from padres.bench.usage import get_json
from padres.broker import Covering
from padres.client.connection import Client, Delivery
from padres.errors import PadresError
from padres.model.protocol import Notify, http_url
from padres.testing.hosts import MOST, Hosts, unavailable
from padres.testing.processes import BrokerProcess, free_ports

__all__ = ["report", "run"]

PORT = 8001
"""Every broker listens on this port of its own host."""
STARTING = 3
"""Brokers started at once (each takes about two CPU seconds to start)."""
OWED_WITHIN = 60.0
"""Seconds a round waits for the deliveries it owes before the oracle calls them missed."""
QUIET = 0.5
"""Seconds without a new delivery after which a round's deliveries are all in."""
PACE = 50.0
"""Operations issued a second, on average."""


def _rss_mib(pid: int | None) -> float:
    """The resident set of process ``pid``, in MiB (0 if it is gone)."""
    if pid is None:
        return 0.0
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Driver:
    """Issues random operations through real clients and checks each round with the oracle."""

    def __init__(self, urls: list[str], clients: int, rng: random.Random) -> None:
        self.urls = urls
        self.count = clients
        self.rng = rng
        self.oracle = Oracle()
        self.live: dict[str, Client] = {}
        self.notes: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
        """Each client's deliveries: publication id, subscriptions."""
        self._last: dict[str, Delivery] = {}
        """Each client's latest notification."""
        self._came: dict[tuple[str, str], set[str]] = {}
        """(client, publication id) -> the subscriptions it came for, so far."""
        self._consumed: dict[str, int] = {}
        self._ever: set[tuple[str, str]] = set()
        """(client, publication id) of every delivery so far."""
        self.late = 0
        """Deliveries that came in a later round than their publication's."""
        self.failed: list[str] = []
        self._ids = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def connect(self) -> None:
        for i in range(self.count):
            name = f"c{i}"
            client = Client(self.rng.choice(self.urls), name, timeout=120)
            await client.connect()
            self.live[name] = client
            self.notes[name] = []
            self._consumed[name] = 0

    def _callback(self, name: str) -> Callable[[Delivery], None]:
        notes = self.notes[name]

        def delivered(delivery: Delivery) -> None:
            # A notification of several of the client's subscriptions comes to each of them,
            # one after another: it is noted once.
            if self._last.get(name) is delivery or not isinstance(delivery, Notify):
                return
            self._last[name] = delivery
            pid = delivery.publication.id
            notes.append((pid, delivery.subscriptions))
            self._came.setdefault((name, pid), set()).update(delivery.subscriptions)

        return delivered

    def _next(self, prefix: str) -> str:
        self._ids += 1
        return f"{prefix}{self._ids}"

    async def round(self, operations: int) -> None:
        """Issue ``operations``, ``PACE`` a second, then wait and check."""
        o = self.oracle
        o.round += 1
        o.touched.clear()
        o.pubs.clear()
        ops = self.rng.choices(
            ("adv", "unadv", "sub", "unsub", "pub", "pub", "pub", "leave"),
            weights=(3, 1, 4, 1, 6, 6, 6, 0.2),
            k=operations,
        )
        for op in ops:
            self._spawn(getattr(self, f"_op_{op}")())
            await asyncio.sleep(self.rng.uniform(0, 2 / PACE))
        while self._tasks:
            await asyncio.gather(*self._tasks)
        await self._delivered()
        fresh: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
        for name, notes in self.notes.items():
            fresh[name] = notes[self._consumed[name] :]
            self._consumed[name] = len(notes)
        ours = {pub.id for pub, _, _, _ in o.pubs}
        for name, notes in fresh.items():
            for pid, _ in notes:
                if (name, pid) in self._ever and pid not in ours:
                    o.violations.append(f"{name} received {pid} again, in a later round")
                self._ever.add((name, pid))
                self.late += pid not in ours
        o.check(fresh, self.live.keys())

    async def _delivered(self) -> None:
        """Wait for every delivery the round owes, then until nothing more comes."""
        owed = set(self.oracle.owed(self.live.keys()))
        deadline = time.monotonic() + OWED_WITHIN
        while owed and time.monotonic() < deadline:
            owed = {(n, p, s) for n, p, s in owed if s not in self._came.get((n, p), ())}
            await asyncio.sleep(0.1)
        total = -1
        while total != sum(map(len, self.notes.values())):
            total = sum(map(len, self.notes.values()))
            await asyncio.sleep(QUIET)

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _request(self, name: str, what: str, work: Any) -> bool:
        """Await ``work``, a request of client ``name``; False if it failed (a violation
        unless the client has left meanwhile)."""
        try:
            await work
        except PadresError as exc:
            if name in self.live:
                self.failed.append(f"{name}: {what} failed: {exc}")
            return False
        return True

    # -- operations --------------------------------------------------------------------------

    def _client(self) -> str | None:
        return self.rng.choice(sorted(self.live)) if self.live else None

    def _acked(self, held: dict[tuple[str, str], Held]) -> tuple[str, str] | None:
        """One of ``held`` (advertisements or subscriptions) whose client has its
        acknowledgement: withdrawing one still in flight is left to the simulation."""
        keys = sorted(k for k in held if k in self.oracle.acked)
        return self.rng.choice(keys) if keys else None

    async def _op_adv(self) -> None:
        name = self._client()
        if name is None:
            return
        aid = self._next("a")
        flt = random_filter(self.rng)
        key = (name, aid)
        self.oracle.advs[key] = Held(name, flt, self.oracle.round)
        self.oracle.touched.add(key)
        made = self.live[name].advertise(flt, id=aid)
        if await self._request(name, aid, made) and key in self.oracle.advs:
            self.oracle.acked.add(key)

    async def _op_unadv(self) -> None:
        key = self._acked(self.oracle.advs)
        if key is not None:
            del self.oracle.advs[key]
            self.oracle.touched.add(key)
            self.oracle.acked.discard(key)
            await self._request(key[0], key[1], self.live[key[0]].unadvertise(key[1]))

    async def _op_sub(self) -> None:
        name = self._client()
        if name is None:
            return
        sid = self._next("s")
        flt = random_filter(self.rng)
        key = (name, sid)
        self.oracle.subs[key] = Held(name, flt, self.oracle.round)
        self.oracle.touched.add(key)
        made = self.live[name].subscribe(flt, self._callback(name), id=sid)
        if await self._request(name, sid, made) and key in self.oracle.subs:
            self.oracle.acked.add(key)

    async def _op_unsub(self) -> None:
        key = self._acked(self.oracle.subs)
        if key is not None:
            del self.oracle.subs[key]
            self.oracle.touched.add(key)
            self.oracle.acked.discard(key)
            await self._request(key[0], key[1], self.live[key[0]].unsubscribe(key[1]))

    async def _op_pub(self) -> None:
        keys = sorted(self.oracle.advs)
        if not keys:
            return
        key = self.rng.choice(keys)
        pub = conforming(self.rng, self.oracle.advs[key].filter, self._next("p"))
        if pub is not None:
            self.oracle.pubs.append((pub, key[0], key[1], frozenset(self.oracle.acked)))
            await self._request(key[0], pub.id, self.live[key[0]].publish(pub))

    async def _op_leave(self) -> None:
        name = self._client()
        if name is not None:
            await self.leave(name)

    async def leave(self, name: str) -> None:
        o = self.oracle
        for held in (o.subs, o.advs):
            for key in [k for k in held if k[0] == name]:
                del held[key]
                o.touched.add(key)
                o.acked.discard(key)
        await self.live.pop(name).close()

    async def finish(self) -> None:
        for name in list(self.live):
            await self.leave(name)


def _figures(brokers: list[BrokerProcess]) -> Iterator[dict[str, Any]]:
    for proc in brokers:
        yield get_json(f"{http_url(proc.url)}/health")


async def _emptied(brokers: list[BrokerProcess], within: float) -> list[str]:
    """Wait until every broker's routing tables are empty; the ids of those that are not."""
    deadline = time.monotonic() + within
    while True:
        figures = await asyncio.to_thread(lambda: list(_figures(brokers)))
        left = [f["broker"] for f in figures if f["advertisements"] or f["subscriptions"]]
        if not left or time.monotonic() > deadline:
            return left
        await asyncio.sleep(0.5)


async def _linked(brokers: list[BrokerProcess], degree: dict[str, int], within: float) -> None:
    deadline = time.monotonic() + within
    while True:
        figures = await asyncio.to_thread(lambda: list(_figures(brokers)))
        short = [f["broker"] for f in figures if len(f["neighbours"]) < degree[f["broker"]]]
        if not short:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"brokers not linked after {within} s: {', '.join(short[:5])}")
        await asyncio.sleep(0.5)


def _end(broker: BrokerProcess) -> None:
    """Kill a broker whose figures are in: draining a hundred would take minutes."""
    broker.kill()
    broker.stop()


def _each(
    brokers: list[BrokerProcess], do: Callable[[BrokerProcess], object], parallel: int
) -> None:
    """``do`` to every broker, ``parallel`` at a time."""
    with ThreadPoolExecutor(parallel) as pool:
        for _ in pool.map(do, brokers):
            pass


def _brokers(count: int, edges: list[tuple[str, str]], hosts: Hosts | None) -> list[BrokerProcess]:
    """Broker processes B0..B<count-1>, each dialling the neighbours of ``edges`` it comes
    after (the first of a pair is dialled by the second)."""
    if hosts is not None:
        where = [(h.address, PORT, h.prefix) for h in hosts]
    else:
        where = [("127.0.0.1", port, []) for port in free_ports(count)]
    urls = {f"B{i}": f"ws://{a}:{port}/ws" for i, (a, port, _) in enumerate(where)}
    return [
        BrokerProcess(
            f"B{i}",
            port=port,
            host=address,
            within=prefix,
            neighbours=[urls[a] for a, b in edges if b == f"B{i}"],
        )
        for i, (address, port, prefix) in enumerate(where)
    ]


async def _bench(
    brokers: list[BrokerProcess],
    edges: list[tuple[str, str]],
    clients: int,
    rounds: int,
    operations: int,
    rng: random.Random,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    degree = {p.id: 0 for p in brokers}
    for a, b in edges:
        degree[a] += 1
        degree[b] += 1
    started = time.perf_counter()
    await _linked(brokers, degree, 120)
    linked = time.perf_counter() - started
    progress(f"every link up after {linked:.1f} s more")
    rss_linked = [_rss_mib(p.pid) for p in brokers]
    driver = Driver([p.url for p in brokers], clients, rng)
    await driver.connect()
    began = time.perf_counter()
    try:
        for i in range(rounds):
            seen = len(driver.oracle.violations)
            await driver.round(operations)
            progress(
                f"round {i + 1}/{rounds}: {driver.oracle.deliveries:,} deliveries, "
                f"{len(driver.oracle.violations)} violations, "
                f"{time.perf_counter() - began:.1f} s"
            )
            for violation in driver.oracle.violations[seen:][:10]:
                progress(f"  {violation}")
        rounds_seconds = time.perf_counter() - began
        rss_rounds = [_rss_mib(p.pid) for p in brokers]
        figures = await asyncio.to_thread(lambda: list(_figures(brokers)))
        routes = sum(f["subscriptions"] for f in figures)
        trees = sum(f["advertisements"] for f in figures)
    finally:
        await driver.finish()
    left = await _emptied(brokers, 60)
    o = driver.oracle
    if left:
        o.violations.append(f"routing state left at {', '.join(left[:5])}")
    o.violations += driver.failed
    sent = [f["to_neighbours"] for f in await asyncio.to_thread(lambda: list(_figures(brokers)))]
    return {
        "linked_seconds": linked,
        "rounds_seconds": rounds_seconds,
        "rss_mib_linked": _spread(rss_linked),
        "rss_mib_rounds": _spread(rss_rounds),
        "routing_messages": sum(s["sent"] for s in sent),
        "routing_bytes": sum(s["sent_bytes"] for s in sent),
        "routes_at_end_of_rounds": routes,
        "trees_at_end_of_rounds": trees,
        "deliveries": o.deliveries,
        "checked": o.checked,
        "late": driver.late,
        "violations": o.violations,
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {"mean": sum(values) / len(values), "max": max(values), "min": min(values)}


def run(
    processes: int = 100,
    clients: int = 200,
    rounds: int = 5,
    operations: int = 100,
    seed: int = 1,
    covering: Covering = Covering.LAZY,
    progress: Callable[[str], None] | None = None,
    *,
    extra_links: float = 0.5,
    hosts: bool = True,
) -> dict[str, Any]:
    """Start the overlay, run the rounds, check them; returns figures and any violations.
    ``hosts``: on test hosts where they can be made (else, and if False, on loopback)."""
    say = progress or (lambda line: None)
    rng = random.Random(seed)
    edges = topology(processes, extra_links, rng)
    while processes >= 3 and len(edges) < processes:  # at least one cycle, however small
        a, b = sorted(rng.sample(range(processes), 2))
        if (f"B{a}", f"B{b}") not in edges and (f"B{b}", f"B{a}") not in edges:
            edges.append((f"B{a}", f"B{b}"))
    if not hosts:
        why: str | None = "as asked"
    elif processes > MOST:
        why = f"test hosts are {MOST} at most"
    else:
        why = unavailable()
    with contextlib.ExitStack() as stack:
        made = stack.enter_context(Hosts(processes)) if why is None else None
        brokers = _brokers(processes, edges, made)
        for proc in brokers:
            proc.options = ["--covering", covering.value]
        stack.callback(_each, brokers, _end, STARTING)
        where = "test hosts" if made else f"loopback ({why})"
        say(f"starting {processes} brokers on {where}, {len(edges)} links")
        began = time.perf_counter()
        _each(brokers, lambda p: p.start(60), STARTING)
        startup = time.perf_counter() - began
        say(f"{processes} brokers listening after {startup:.1f} s")
        figures = asyncio.run(_bench(brokers, edges, clients, rounds, operations, rng, say))
        say("stopping the brokers")
    return {
        "machine": machine(),
        "processes": processes,
        "hosts": made is not None,
        "where": where,
        "links": len(edges),
        "clients": clients,
        "rounds": rounds,
        "operations": rounds * operations,
        "seed": seed,
        "covering": covering.value,
        "startup_seconds": startup,
        **figures,
    }


def _cycles(count: int) -> str:
    return "1 cycle" if count == 1 else f"{count} cycles"


def report(r: dict[str, Any]) -> str:
    rss = r["rss_mib_rounds"]
    lines = [
        f"{r['processes']} broker processes on {r['where']}, {r['links']} links "
        f"({_cycles(r['links'] - r['processes'] + 1)}), "
        f"{r['clients']} clients, {r['operations']:,} operations in {r['rounds']} rounds, "
        f"covering {r['covering']}, seed {r['seed']}",
        f"  startup: every broker listening after {r['startup_seconds']:.1f} s, every link up "
        f"{r['linked_seconds']:.1f} s later",
        f"  memory per broker (resident): {r['rss_mib_linked']['mean']:.0f} MiB linked, "
        f"{rss['mean']:.0f} MiB after the rounds (max {rss['max']:.0f})",
        f"  {r['routing_messages']:,} messages between brokers ({r['routing_bytes']:,} bytes); "
        f"rounds took {r['rounds_seconds']:.1f} s",
        f"  {r['deliveries']:,} deliveries ({r['late']} in a later round); "
        f"{r['checked']:,} required deliveries checked",
        f"  routing entries at the end of the rounds: {r['routes_at_end_of_rounds']:,} "
        f"subscriptions, {r['trees_at_end_of_rounds']:,} advertisements",
        f"  oracle: {len(r['violations'])} violations"
        + "".join(f"\n    {v}" for v in r["violations"][:20]),
    ]
    if not any("routing state left" in v for v in r["violations"]):
        lines.append("  after every client left: every routing table empty")
    return "\n".join(lines)
