"""A subscription's priority and scope: the order a client's subscriptions matching one
publication get it in, and subscriptions that see only their own broker's publishers.

In the simulation first (every kind of subscription, durable ones resumed), then with real
broker processes: the client library, ``padres sub`` and the REST API, and the refusals of bad
values."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from padres.client.connection import Client, Delivery
from padres.client.handling import Sequencer
from padres.errors import InvalidMessage
from padres.language.parser import parse_advertisement, parse_subscription
from padres.model.messages import Publication
from padres.model.protocol import Durable, Error, Notify, Scope, Subscribe
from padres.runtime.simulation import SimClient, Simulation
from padres.testing.processes import BrokerProcess
from tests.support import eventually, wait_linked

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
T0 = datetime(2026, 1, 1, tzinfo=UTC)
ADVERTISEMENT = "[class,eq,'T'],[n,isPresent,0]"


def _line() -> tuple[Simulation, SimClient, SimClient]:
    """Brokers A - B - C; a publisher of T at A and one at B."""
    sim = Simulation(5)
    for name in "ABC":
        sim.add_broker(name)
    sim.link("A", "B")
    sim.link("B", "C")
    sim.run()
    at_a, at_b = sim.attach("pa", "A"), sim.attach("pb", "B")
    for publisher in (at_a, at_b):
        sim.send(publisher, parse_advertisement(ADVERTISEMENT, id="a"))
    sim.run()
    return sim, at_a, at_b


def _publish(sim: Simulation, publisher: SimClient, n: int) -> None:
    sim.send(publisher, Publication(f"p{n}", {"class": "T", "n": n}, T0))
    sim.run()


def _got(client: SimClient) -> list[tuple[int, tuple[str, ...]]]:
    return [(int(n.publication.attributes["n"]), n.subscriptions) for n in client.notifications]


def test_one_clients_subscriptions_get_a_publication_in_priority_order() -> None:
    """Plain subscriptions are listed in one notify, durable ones get one each, both in
    priority order, higher first, ties in the order they were made (the reference: a sort)."""
    sim, at_a, _ = _line()
    sub = sim.attach("s", "C")
    made = [("s1", 0), ("s2", 5), ("s3", -2), ("s4", 5), ("s5", 0), ("s6", 2**31 - 1)]
    for sid, priority in made:
        sim.send(sub, Subscribe(parse_subscription("[class,eq,'T']", id=sid), priority=priority))
    durables = [("d1", 1), ("d2", 3), ("d3", 1)]
    for name, priority in durables:
        sim.send(sub, Durable(parse_subscription("[class,eq,'T']", id=name), priority=priority))
    sim.run()
    _publish(sim, at_a, 1)

    def reference(subs: list[tuple[str, int]]) -> tuple[str, ...]:
        order = sorted(range(len(subs)), key=lambda i: (-subs[i][1], i))
        return tuple(subs[i][0] for i in order)

    plain = [n.subscriptions for n in sub.notifications if not n.seq]
    assert plain == [reference(made)] == [("s6", "s2", "s4", "s1", "s5", "s3")]
    lone = [n.subscriptions[0] for n in sub.notifications if n.seq]
    assert tuple(lone) == reference(durables) == ("d2", "d1", "d3")

    # a durable subscription resumed with another priority takes it
    sim.send(sub, Durable(parse_subscription("[class,eq,'T']", id="d3"), acked=1, priority=9))
    sim.run()
    sub.notifications.clear()
    _publish(sim, at_a, 2)
    assert [n.subscriptions[0] for n in sub.notifications if n.seq] == ["d3", "d2", "d1"]


def test_a_local_subscription_sees_its_own_brokers_publishers_only_and_stays_there() -> None:
    sim, at_a, at_b = _line()
    sub = sim.attach("s", "B")
    sim.send(sub, Subscribe(parse_subscription("[class,eq,'T']", id="mine"), scope=Scope.LOCAL))
    sim.send(sub, parse_subscription("[class,eq,'T']", id="all"))
    sim.send(
        sub, Durable(parse_subscription("[class,eq,'T'],[n,>,0]", id="kept"), scope=Scope.LOCAL)
    )
    sim.run()
    assert not sub.errors
    _publish(sim, at_a, 1)
    _publish(sim, at_b, 2)
    assert _got(sub) == [(1, ("all",)), (2, ("kept",)), (2, ("mine", "all"))]
    # never forwarded: A knows only the global one, and B sent only that one
    routes_a = {r.sub.filter for r in sim.brokers["A"].routes}
    assert len(routes_a) == 1
    local = [r for r in sim.brokers["B"].routes if r.local]
    assert len(local) == 2 and not any(r.sent or r.hidden_by for r in local)
    # a later advertisement at A is not followed; one at B is
    late_a, late_b = sim.attach("la", "A"), sim.attach("lb", "B")
    for late in (late_a, late_b):
        sim.send(late, parse_advertisement("[class,eq,'T'],[n,>,100]", id="a"))
    sim.run()
    sub.notifications.clear()
    _publish(sim, late_a, 101)
    _publish(sim, late_b, 102)
    assert _got(sub) == [(101, ("all",)), (102, ("kept",)), (102, ("mine", "all"))]

    # a durable subscription keeps its scope: resuming it with another is refused
    sim.send(sub, Durable(parse_subscription("[class,eq,'T'],[n,>,0]", id="kept"), acked=2))
    sim.run()
    assert sub.errors[-1] == Error(
        "durable subscription 'kept' exists with scope local, not global", "kept"
    )

    # and through a restart of its broker, on its journal, while its client is away
    sim.crash("B")
    sim.add_broker("B")
    sim.link("A", "B")
    sim.link("B", "C")
    sim.run()
    restored = [r for r in sim.brokers["B"].routes if r.local]
    assert len(restored) == 1 and not restored[0].sent  # the durable one, still local
    _publish(sim, at_a, 103)  # from A: not queued for it
    for client in (sub, at_b):
        sim.reattach(client)
    sim.send(at_b, parse_advertisement(ADVERTISEMENT, id="a"))
    sub.notifications.clear()
    kept = parse_subscription("[class,eq,'T'],[n,>,0]", id="kept")
    sim.send(sub, Durable(kept, acked=2, scope=Scope.LOCAL))
    sim.run()
    assert _got(sub) == []
    _publish(sim, at_a, 105)
    _publish(sim, at_b, 104)
    assert _got(sub) == [(104, ("kept",))]


def test_a_subscription_with_a_time_window_takes_neither_scope_nor_priority() -> None:
    sim, _, _ = _line()
    sub = sim.attach("s", "B")
    windowed = "[class,eq,'T'],[time,>=,'2025-01-01T00:00']"
    sim.send(sub, Subscribe(parse_subscription(windowed, id="h1"), scope=Scope.LOCAL))
    sim.send(sub, Subscribe(parse_subscription(windowed, id="h2"), priority=3))
    sim.run()
    first, second = (e.text for e in sub.errors)
    assert "subscription 'h1' has a time window" in first and "scope local" in first
    assert "subscription 'h2' has a time window" in second and "priority" in second


# -- real brokers ------------------------------------------------------------------------------


@dataclass
class Pair:
    """Brokers A and B, linked, with their journals on disk."""

    a: BrokerProcess
    b: BrokerProcess

    def http(self, broker: BrokerProcess) -> str:
        return f"http://127.0.0.1:{broker.port}"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    data = tmp_path_factory.mktemp("pair")
    a = BrokerProcess("A", options=["--data", str(data / "a")])
    b = BrokerProcess("B", options=["--data", str(data / "b")])
    try:
        a.start()
        b.neighbours = [a.url]
        b.start()
        wait_linked(["AB"], {"A": a.url, "B": b.url})
        yield Pair(a, b)
    finally:
        b.stop()
        a.stop()


class Calls:
    """A callback per subscription recording, in one list, which subscription got which n."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int]] = []

    def of(self, name: str) -> Callable[[Delivery], None]:
        def called(delivery: Delivery) -> None:
            assert isinstance(delivery, Notify)
            self.log.append((name, int(delivery.publication.attributes["n"])))

        return called


@asynccontextmanager
async def _publishers(pair: Pair, tag: str) -> AsyncIterator[tuple[Client, Client]]:
    """A publisher of class ``tag`` at A and one at B."""
    async with Client(pair.a.url, f"pa-{tag}") as at_a, Client(pair.b.url, f"pb-{tag}") as at_b:
        for publisher in (at_a, at_b):
            await publisher.advertise(f"[class,eq,'{tag}'],[n,isPresent,0]")
        yield at_a, at_b


async def test_handlers_run_in_priority_order_and_local_ones_see_local_publishers(
    pair: Pair,
) -> None:
    """One client at B: callbacks of plain and durable subscriptions, with priorities and
    ties; publications from A and B, each matching all of them."""
    calls = Calls()
    flt = "[class,eq,'Q']"
    async with _publishers(pair, "Q") as (at_a, at_b), Client(pair.b.url, "handlers") as client:
        plain = [("low", -1, "global"), ("mine", 4, "local"), ("high", 9, "global")]
        plain += [("tie", 4, "global")]
        for name, priority, scope in plain:
            await client.subscribe(flt, calls.of(name), id=name, priority=priority, scope=scope)
        lasting = [("d-low", 0, "global"), ("d-high", 2, "local")]
        for name, priority, scope in lasting:
            await client.subscribe(
                flt, calls.of(name), durable=name, priority=priority, scope=scope
            )
        rows = await client.query("subscriptions")
        local = [row for row in rows if "scope=local" in row]
        assert len(local) == 2 and all(" to=- " in row for row in local)  # never sent to A
        assert any("priority=9" in row for row in rows)
        try:
            await at_a.publish({"class": "Q", "n": 1})
            await eventually(lambda: len(calls.log) == 4)
            await at_b.publish({"class": "Q", "n": 2})
            await eventually(lambda: len(calls.log) == 4 + 6)
        finally:
            for name, _, _ in lasting:
                await client.unsubscribe(name)
    from_a = [name for name, n in calls.log if n == 1]
    from_b = [name for name, n in calls.log if n == 2]
    # durable ones first (one message each, in priority order), then the plain ones
    assert from_a == ["d-low", "high", "tie", "low"]
    assert from_b == ["d-high", "d-low", "high", "mine", "tie", "low"]


class Slow:
    """Coroutine handlers that take ``pause`` seconds; ``slow`` fails its first attempt at
    each publication."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int]] = []
        self.failed: set[int] = set()

    def handler(self, name: str, pause: float) -> Callable[[Delivery], Awaitable[None]]:
        async def handle(delivery: Delivery) -> None:
            assert isinstance(delivery, Notify)
            n = int(delivery.publication.attributes["n"])
            await asyncio.sleep(pause)
            if name == "slow" and n not in self.failed:
                self.failed.add(n)
                raise RuntimeError("not yet")
            self.log.append((name, n))

        return handle


@pytest.mark.parametrize("shared", [True, False])
async def test_handlers_sharing_a_sequencer_take_deliveries_in_the_order_they_came(
    pair: Pair, shared: bool
) -> None:
    """Coroutine handlers with retries: the slowest has the highest priority, and fails
    its first attempt at each publication. Sharing a sequencer, they run one delivery at a
    time, in priority order; without one, each runs in its own task and the fast ones finish
    first."""
    slow, tag = Slow(), "shared" if shared else "apart"
    sequencer = Sequencer() if shared else None
    async with (
        _publishers(pair, f"S{tag}") as (_, at_b),
        Client(pair.b.url, f"ordered-{tag}") as client,
    ):
        for name, priority, pause in (("fast", 0, 0.0), ("slow", 5, 0.05), ("mid", 2, 0.01)):
            await client.subscribe(
                f"[class,eq,'S{tag}']",
                slow.handler(name, pause),
                id=name,
                priority=priority,
                retries=1,
                backoff=0.01,
                sequencer=sequencer,
            )
        for n in (1, 2):
            await at_b.publish({"class": f"S{tag}", "n": n})
        await eventually(lambda: len(slow.log) == 6)
    in_order = [(name, n) for n in (1, 2) for name in ("slow", "mid", "fast")]
    if shared:
        assert slow.log == in_order
    else:
        assert slow.log[:2] == [("fast", 1), ("fast", 2)] and sorted(slow.log) == sorted(in_order)


async def test_a_sequencer_lets_each_delivery_go_in_turn() -> None:
    turns = Sequencer()
    first, second, third, fourth = (turns.take() for _ in range(4))
    assert len(turns) == 4
    await turns.turn(first)  # at once: nothing came before
    waiting = asyncio.ensure_future(turns.turn(third))
    turns.leave(second)  # dropped before its turn: it holds nobody back
    await asyncio.sleep(0)
    assert not waiting.done()
    turns.leave(first)
    await asyncio.wait_for(waiting, 1)
    turns.leave(third)
    await turns.turn(fourth)
    turns.leave(fourth)
    assert len(turns) == 0


async def test_the_client_refuses_bad_values_before_sending(pair: Pair) -> None:
    async with Client(pair.b.url, "careless") as client:
        with pytest.raises(InvalidMessage, match="out of range"):
            await client.subscribe("[class,eq,'T']", priority=2**31)
        with pytest.raises(InvalidMessage, match="whole number"):
            await client.subscribe("[class,eq,'T']", priority=True)
        with pytest.raises(InvalidMessage, match="scope 'near' is not one of global, local"):
            await client.subscribe("[class,eq,'T']", scope="near")


def _padres(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "padres.cli", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def test_padres_sub_takes_a_scope_and_a_priority_and_refuses_bad_ones(pair: Pair) -> None:
    async with _publishers(pair, "C") as (at_a, at_b):
        everything = await at_b.subscribe("[class,eq,'C']")  # brings A's publications to B
        out, rows = await _cli_subscriber(pair, at_a, at_b)
        got = [await everything.get(5) for _ in "ab"]
        assert [n.publication.attributes["n"] for n in got if isinstance(n, Notify)] == [1, 2]
    assert any("priority=3 scope=local" in row for row in rows), rows
    assert out.splitlines() == ["s1 <- [class,'C'],[n,2]"]

    refusals = [
        (["--priority", "high"], 2, "invalid int value: 'high'"),
        (["--priority", str(2**31)], 1, "--priority: priority 2147483648 is out of range"),
        (["--scope", "near"], 2, "invalid choice: 'near'"),
    ]
    for options, code, words in refusals:
        bad = _padres("sub", "--broker", pair.b.url, *options, "[class,eq,'C']")
        _, err = await asyncio.to_thread(bad.communicate, timeout=20)
        assert bad.returncode == code and words in err, err


async def _cli_subscriber(pair: Pair, at_a: Client, at_b: Client) -> tuple[str, tuple[str, ...]]:
    """What ``padres sub --scope local`` at B prints of a publication from A and one from B,
    and B's subscriptions while it runs."""
    proc = _padres(
        "sub", "--broker", pair.b.url, "--name", "cli", "--scope", "local", "--priority", "3",
        "--count", "1", "--timeout", "20", "[class,eq,'C']",
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stderr.readline), 20)
        assert line.startswith("subscribed"), line
        rows = await at_b.query("subscriptions")
        await at_a.publish({"class": "C", "n": 1})  # from A: not for a local subscription
        await asyncio.sleep(0.3)
        await at_b.publish({"class": "C", "n": 2})
        out, _ = await asyncio.to_thread(proc.communicate, timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0
    return out, rows


def test_the_rest_api_takes_a_scope_and_a_priority_and_refuses_bad_ones(pair: Pair) -> None:
    b, a = pair.http(pair.b), pair.http(pair.a)
    for base, client in ((a, "ra"), (b, "rb")):
        r = httpx.post(
            f"{base}/api/v1/advertisements", json={"filter": ADVERTISEMENT, "client": client}
        )
        assert r.status_code == 201, r.text
    everything = httpx.post(  # brings A's publications to B
        f"{b}/api/v1/subscriptions", json={"filter": "[class,eq,'T']", "name": "rest-all"}
    )
    assert everything.status_code == 201 and everything.json()["scope"] == "global"
    made = httpx.post(
        f"{b}/api/v1/subscriptions",
        json={"filter": "[class,eq,'T']", "scope": "local", "priority": 7, "name": "rest-local"},
    )
    assert made.status_code == 201, made.text
    assert made.json()["scope"] == "local" and made.json()["priority"] == 7
    lasting = httpx.post(
        f"{b}/api/v1/subscriptions",
        json={"filter": "[class,eq,'T']", "scope": "local", "durable": True, "name": "rest-d"},
    )
    assert lasting.status_code == 201, lasting.text
    listed = {s["id"]: s for s in httpx.get(f"{b}/api/v1/subscriptions").json()}
    assert listed["rest-d"]["scope"] == "local" and listed["rest-d"]["priority"] == 0
    with (
        httpx.Client(timeout=10) as http,
        http.stream("GET", f"{b}{made.json()['events']}") as response,
    ):
        lines = response.iter_lines()
        assert next(lines) == ": subscribed"
        for base, client, n in ((a, "ra", 1), (b, "rb", 2)):
            r = httpx.post(
                f"{base}/api/v1/publications?client={client}", json={"class": "T", "n": n}
            )
            assert r.status_code == 201, r.text
        data = next(line for line in lines if line.startswith("data: "))
    assert '"n":2' in data and '"n":1' not in data  # A's came first, and did not come
    for sid in ("rest-local", "rest-all"):
        assert httpx.delete(f"{b}/api/v1/subscriptions/{sid}").status_code == 204
    assert httpx.delete(f"{b}/api/v1/subscriptions/rest-d").status_code == 204

    def refused(body: dict[str, object], status: int, words: str) -> None:
        r = httpx.post(f"{b}/api/v1/subscriptions", json=body)
        assert r.status_code == status and words in r.json()["detail"], r.text

    refused({"filter": "[class,eq,'T']", "priority": "high"}, 422, "priority")
    refused({"filter": "[class,eq,'T']", "priority": 2**31}, 422, "priority")
    refused({"filter": "[class,eq,'T']", "priority": 1.5}, 422, "priority")
    refused({"filter": "[class,eq,'T']", "scope": "near"}, 422, "scope")
    refused({"expression": "{[class,eq,'T']} & {[class,eq,'U']}", "priority": 1}, 400, "atomic")
    refused(
        {"filter": "[class,eq,'T'],[time,>=,'2025-01-01T00:00']", "scope": "local"},
        409,
        "cannot have scope local",
    )
