"""``Client.subscribe_many``: many filters held as one subscription, through real brokers.

A publication matching any of the filters reaches the handler once, naming every matched
subscription of the client, exactly the publications the reference matcher selects; the group
ends with one unsubscribe, is withdrawn whole when the broker refuses a member, and goes on
after its broker is killed and started again.
"""

from __future__ import annotations

import asyncio
import collections
import random
from collections.abc import Iterator

import pytest
from msgspec.structs import replace

from padres.bench.workloads import STOCK_ADVERTISEMENT, stock_publications, stock_subscriptions
from padres.broker import Covering
from padres.broker.groups import Groups
from padres.client.connection import Client, Delivery
from padres.errors import RequestFailed
from padres.language.parser import parse_advertisement
from padres.matching.matcher import matches
from padres.model.messages import Filter, Publication, Subscription, Unsubscribe
from padres.model.protocol import Notify, Subscribe
from padres.runtime.simulation import Simulation
from padres.testing.processes import BrokerProcess
from tests.support import eventually

FILTERS = 150
QUOTES = 1_500


@pytest.fixture(scope="module")
def chain() -> Iterator[tuple[str, str]]:
    """Two brokers, B1 - B2: the publisher at B1, the subscriber at B2."""
    b1 = BrokerProcess("B1", quiet=True)
    url1 = b1.start()
    b2 = BrokerProcess("B2", neighbours=[url1], quiet=True)
    try:
        yield url1, b2.start()
    finally:
        b2.stop()
        b1.stop()


def _workload() -> tuple[list[Subscription], list[Publication]]:
    quotes = stock_publications(None)[:QUOTES]
    return list(stock_subscriptions(FILTERS, quotes, seed=7)), quotes


def _expected(subs: list[Subscription], quotes: list[Publication]) -> dict[str, set[str]]:
    """Per publication id, the subscriptions (by filter index) it matches: the reference."""
    out: dict[str, set[str]] = {}
    for quote in quotes:
        matched = {str(n) for n, sub in enumerate(subs) if matches(sub.filter, quote)}
        if matched:
            out[quote.id] = matched
    return out


def _id(delivery: Delivery) -> str:
    assert isinstance(delivery, Notify)
    return delivery.publication.id


async def _publish(url: str, name: str, quotes: list[Publication]) -> None:
    async with Client(url, name) as publisher:
        await publisher.advertise(STOCK_ADVERTISEMENT)
        await publisher.publish_many(quotes)
        await publisher.flush()


async def test_each_publication_reaches_the_group_once_as_the_reference_selects(
    chain: tuple[str, str],
) -> None:
    url1, url2 = chain
    subs, quotes = _workload()
    expected = _expected(subs, quotes)
    got: collections.Counter[str] = collections.Counter()
    plain: list[str] = []
    names: dict[str, tuple[str, ...]] = {}

    def on_group(delivery: Delivery) -> None:
        assert isinstance(delivery, Notify)
        # the group once, whichever of its filters matched, beside the client's plain one
        names[delivery.publication.id] = delivery.subscriptions
        got[delivery.publication.id] += 1

    async with Client(url2, "reader") as reader:
        group = await reader.subscribe_many([s.filter for s in subs], on_group, id="g")
        assert group.members == tuple(f"g.{n}" for n in range(FILTERS))
        # a plain subscription of the same client, overlapping the group, still gets its own
        await reader.subscribe(subs[0].filter, lambda d: plain.append(_id(d)), id="p")
        with pytest.raises(RequestFailed, match="already exists"):
            await reader.subscribe(subs[1].filter, id="g")
        await _publish(url1, "quotes", quotes)
        await eventually(lambda: len(got) >= len(expected))
        await asyncio.sleep(0.3)  # anything doubled would have come by now
        assert set(got) == set(expected)
        assert set(got.values()) == {1}
        assert sorted(plain) == sorted(p for p, m in expected.items() if "0" in m)
        assert {pid: sorted(n) for pid, n in names.items()} == {
            pid: ["g", "p"] if "0" in m else ["g"] for pid, m in expected.items()
        }

        await reader.unsubscribe("g")
        before = len(plain)
        again = [replace(q, id=f"again-{q.id}") for q in quotes[:200]]
        await _publish(url1, "quotes-2", again)
        await eventually(
            lambda: len(plain) >= before + sum("0" in expected.get(q.id, ()) for q in quotes[:200])
        )
        assert not any(pid.startswith("again-") for pid in got)


async def test_a_refused_member_withdraws_the_whole_group(chain: tuple[str, str]) -> None:
    url1, url2 = chain
    subs, quotes = _workload()
    got: list[str] = []
    async with Client(url2, "refused") as reader:
        await reader.subscribe("[class,eq,'NOTHING']", id="h.3")  # takes a member's id
        with pytest.raises(RequestFailed, match=r"h\.3"):
            await reader.subscribe_many(
                [s.filter for s in subs[:10]], lambda d: got.append("x"), id="h"
            )
        await _publish(url1, "quotes-3", [replace(q, id=f"r-{q.id}") for q in quotes])
        await asyncio.sleep(1.0)
        assert got == []  # the members made before the refusal were withdrawn
        # the id is free again once withdrawn
        group = await reader.subscribe_many([subs[0].filter], id="h")
        assert group.members == ("h.0",)


async def test_the_group_goes_on_after_its_broker_is_killed_and_started_again() -> None:
    b1 = BrokerProcess("K1", quiet=True)
    url = b1.start()
    subs, quotes = _workload()
    expected = _expected(subs, quotes)
    got: collections.Counter[str] = collections.Counter()
    try:
        async with Client(url, "survivor", reconnect=True) as reader:
            await reader.subscribe_many(
                [s.filter for s in subs], lambda d: got.update([_id(d)]), id="g"
            )
            b1.kill()
            await asyncio.to_thread(b1.start)
            await eventually(lambda: reader.state.value == "open", timeout=20)
            await _publish(b1.url, "after", quotes)
            await eventually(lambda: len(got) >= len(expected), timeout=20)
            await asyncio.sleep(0.3)
            assert set(got) == set(expected) and set(got.values()) == {1}
    finally:
        b1.stop()


# -- the broker core, simulated ---------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_group_is_named_once_as_long_as_one_member_matches_across_a_cycle(seed: int) -> None:
    """Random members and plain subscriptions of one client at D of the star with cycles;
    members withdrawn one by one: every notification names the group once exactly when a
    member still made matches, and the plain subscriptions as the reference says."""
    rng = random.Random(seed)
    sim = Simulation(seed, covering=Covering.LAZY)
    for b in "ABCDE":
        sim.add_broker(b)
    for b in "ACDE":
        sim.link(b, "B")
    sim.link("A", "C")
    sim.link("D", "E")
    sim.run()
    subs, quotes = _workload()
    publisher, reader = sim.attach("pub", "A"), sim.attach("reader", "D")
    sim.send(publisher, parse_advertisement(STOCK_ADVERTISEMENT, id="a1"))
    sim.run()
    members = {f"g.{n}": sub.filter for n, sub in enumerate(rng.sample(subs, 40))}
    plain = {f"p{n}": sub.filter for n, sub in enumerate(rng.sample(subs, 10))}
    for sid, flt in members.items():
        sim.send(reader, Subscribe(Subscription(sid, flt), group="g"))
    for sid, flt in plain.items():
        sim.send(reader, Subscription(sid, flt))
    sim.run()
    assert not reader.errors
    batch = 0
    while True:
        reader.notifications.clear()
        pubs = [replace(q, id=f"{batch}-{q.id}") for q in rng.sample(quotes, 60)]
        for pub in pubs:
            sim.send(publisher, pub)
        sim.run()
        got = {n.publication.id: sorted(n.subscriptions) for n in reader.notifications}
        assert len(got) == len(reader.notifications)  # one notification a publication
        wanted = {}
        for pub in pubs:
            names = sorted(s for s, f in plain.items() if matches(f, pub))
            if any(matches(f, pub) for f in members.values()):
                names = sorted([*names, "g"])
            if names:
                wanted[pub.id] = names
        assert got == wanted
        if not members:
            break
        for sid in rng.sample(sorted(members), min(len(members), rng.randint(5, 15))):
            del members[sid]
            sim.send(reader, Unsubscribe(sid))
        sim.run()
        batch += 1
    sim.detach(reader)  # what is left of the client goes with it
    sim.run()
    assert sim.tables_empty() or all(not b.routes._members.group_of for b in sim.brokers.values())


@pytest.mark.parametrize("seed", [1, 2])
def test_the_matched_members_of_a_group_match_what_all_its_members_match(seed: int) -> None:
    """Members added and removed at random: a publication matches a matched member exactly
    when it matches any member; the members hidden are a good part of them."""
    rng = random.Random(seed)
    quotes = stock_publications(None)[:QUOTES]
    groups = Groups(scan=64)
    members: dict[str, Filter] = {}
    matched: set[str] = set()
    hidden_seen = 0
    pool = list(stock_subscriptions(600, quotes, seed=seed))
    for step in range(600):
        if members and rng.random() < 0.35:
            member = rng.choice(sorted(members))
            del members[member]
            matched.discard(member)
            matched |= {m for m, _ in groups.remove(member)}
        else:
            member, flt = f"m{step}", rng.choice(pool).filter
            members[member] = flt
            if groups.add("g", member, flt):
                matched.add(member)
            else:
                hidden_seen += 1
        if step % 100 == 99:
            assert matched <= members.keys()
            for quote in rng.sample(quotes, 25):
                assert any(matches(members[m], quote) for m in matched) == any(
                    matches(f, quote) for f in members.values()
                )
    assert len(groups) == len(members)
    assert hidden_seen > 30
