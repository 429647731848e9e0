"""Guaranteed publications and durable subscriptions in the simulation, with broker crashes."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest

from padres.broker import Broker, BrokerConfig, durable
from padres.broker.journal import DurableRecord, Queued
from padres.broker.memory_journal import MemoryJournal
from padres.broker.paths import Switching
from padres.broker.quotas import Quotas
from padres.language.parser import parse_advertisement, parse_subscription
from padres.model.codec import encode
from padres.model.messages import Publication, Unsubscribe
from padres.model.protocol import (
    Ack,
    Durable,
    Guaranteed,
    Hello,
    Notify,
    Recover,
    Role,
    RoutePublish,
)
from padres.runtime.simulation import SimClient, Simulation

RING = ["AB", "BC", "CD", "DE", "EA", "AC"]
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class Publisher:
    """Publishes guaranteed publications, and sends again what was not acknowledged."""

    sim: Simulation
    client: SimClient
    unacked: dict[str, Publication] = field(default_factory=dict)
    count: int = 0
    read: int = 0

    def connect(self) -> None:
        self.sim.send(self.client, parse_advertisement("[class,eq,'T'],[n,isPresent,0]", id="a"))
        self.collect()
        for pub in self.unacked.values():
            self.sim.send(self.client, Guaranteed(pub))

    def publish(self) -> None:
        pub = Publication(f"p{self.count}", {"class": "T", "n": self.count}, T0)
        self.count += 1
        self.unacked[pub.id] = pub
        self.sim.send(self.client, Guaranteed(pub))

    def collect(self) -> None:
        for ref in self.client.acks[self.read :]:
            self.unacked.pop(ref, None)
        self.read = len(self.client.acks)


@dataclass
class Subscriber:
    """A durable subscription's client: takes each delivery once, acknowledges as it goes."""

    sim: Simulation
    client: SimClient
    filter: str = "[class,eq,'T']"
    gapless: bool = True
    """Deliveries are numbered without gaps (unless the broker discarded some)."""
    got: list[tuple[str, int]] = field(default_factory=list)
    last: int = 0
    read: int = 0

    def connect(self) -> None:
        sub = parse_subscription(self.filter, id="d")
        self.sim.send(self.client, Durable(sub, self.last))

    def collect(self) -> None:
        fresh = self.client.notifications[self.read :]
        self.read = len(self.client.notifications)
        for note in fresh:
            assert isinstance(note, Notify) and note.subscriptions == ("d",)
            if note.seq <= self.last:
                continue  # sent again after a reconnect
            assert note.seq == self.last + 1 or not self.gapless, "numbered without gaps"
            self.last = note.seq
            pub = note.publication
            self.got.append((pub.publisher, int(pub.attributes["n"])))
        if fresh and self.client.connected:
            self.sim.send(self.client, Ack("d", self.last))


def _overlay(seed: int) -> Simulation:
    sim = Simulation(seed)
    for name in "ABCDE":
        sim.add_broker(name)
    for link in RING:
        sim.link(link[0], link[1])
    sim.run()
    return sim


def _connected(seed: int, gapless: bool = True) -> tuple[Simulation, Publisher, Subscriber]:
    """The overlay with a publisher at A and a durable subscriber at C, both connected."""
    sim = _overlay(seed)
    pub = Publisher(sim, sim.attach("pa", "A"))
    sub = Subscriber(sim, sim.attach("sc", "C"), gapless=gapless)
    for c in (pub, sub):
        c.connect()
    sim.run()
    return sim, pub, sub


def _restart(sim: Simulation, name: str, clients: list[Publisher | Subscriber]) -> None:
    sim.add_broker(name)
    for link in RING:
        if name in link:
            other = link.replace(name, "")
            sim.link(name, other)
    for c in clients:
        if c.client.broker == name:
            c.collect()
            sim.reattach(c.client)
            c.connect()


def _run_and_collect(sim: Simulation, clients: list[Publisher | Subscriber]) -> None:
    for _ in range(5):
        sim.run()
        sim.tick(1.0)
        for c in clients:
            c.collect()
    sim.run()
    for c in clients:
        c.collect()


@pytest.mark.parametrize("seed", range(4))
def test_durable_subscribers_get_every_guaranteed_publication_once_through_crashes(
    seed: int,
) -> None:
    sim = _overlay(seed)
    publishers = [Publisher(sim, sim.attach("pa", "A")), Publisher(sim, sim.attach("pd", "D"))]
    subscribers = [Subscriber(sim, sim.attach(f"s{b}", b)) for b in "BCE"]
    everyone: list[Publisher | Subscriber] = [*publishers, *subscribers]
    for c in everyone:
        c.connect()
    sim.run()
    for s in subscribers:
        assert "d" in s.client.acks
    rng = sim.random
    for victim in "ABCDE":  # each broker in turn, publishers' and subscribers' too
        for _ in range(40):
            rng.choice(publishers).publish()
            sim.step(rng.randint(0, 20))
            for c in everyone:
                c.collect()
        sim.crash(victim)
        for _ in range(20):
            p = rng.choice(publishers)
            if p.client.connected:
                p.publish()
            sim.step(rng.randint(0, 20))
        _restart(sim, victim, everyone)
    _run_and_collect(sim, everyone)
    for p in publishers:
        assert p.unacked == {}, "every guaranteed publication is acknowledged in the end"
    for s in subscribers:
        for p in publishers:
            name = f"{p.client.name}@{p.client.broker}"
            got = [n for publisher, n in s.got if publisher == name]
            assert got == list(range(p.count)), (seed, s.client.name, name)
    _queues_agree(sim)


def _queues_agree(sim: Simulation) -> None:
    """What each durable subscription counts as queued, in deliveries and bytes, is what its
    broker's journal holds."""
    for broker in sim.brokers.values():
        counted = {(d["owner"], d["name"]): d for d in broker.durables.statistics()}
        for record in broker.durables.records():
            held = broker.journal.backlog(record)
            d = counted[record.owner, record.name]
            assert (d["queued"], d["queued_bytes"]) == held, (broker.id, record.name)


def test_a_durable_subscriber_away_gets_what_it_missed_and_nothing_twice() -> None:
    sim, pub, sub = _connected(1)
    for _ in range(10):
        pub.publish()
    sim.run()
    sub.collect()
    sim.detach(sub.client)
    for _ in range(10):
        pub.publish()
    sim.run()
    sim.reattach(sub.client)
    sub.connect()
    sim.run()
    sub.collect()
    sim.run()
    assert [n for _, n in sub.got] == list(range(20))
    assert sim.brokers["C"].durables.has("sc@C", "d")


def test_a_new_durable_subscription_does_not_take_the_past() -> None:
    sim = _overlay(2)
    pub = Publisher(sim, sim.attach("pa", "A"))
    pub.connect()
    sim.run()
    for _ in range(5):
        pub.publish()
    sim.run()
    sub = Subscriber(sim, sim.attach("sc", "C"))
    sub.connect()
    sim.run()
    pub.publish()
    sim.run()
    sub.collect()
    assert [n for _, n in sub.got] == [5]


def test_a_durable_subscription_on_the_publishers_broker_survives_its_crash() -> None:
    sim = _overlay(3)
    pub = Publisher(sim, sim.attach("pa", "A"))
    sub = Subscriber(sim, sim.attach("sa", "A"))
    everyone: list[Publisher | Subscriber] = [pub, sub]
    for c in everyone:
        c.connect()
    sim.run()
    for _ in range(30):
        pub.publish()
        sim.step(3)
    sim.crash("A")
    _restart(sim, "A", everyone)
    _run_and_collect(sim, everyone)
    assert [n for _, n in sub.got] == list(range(30))


def test_unsubscribing_a_durable_subscription_forgets_it() -> None:
    sim = _overlay(4)
    sub = Subscriber(sim, sim.attach("sc", "C"))
    sub.connect()
    sim.run()
    sim.detach(sub.client)
    sim.run()
    assert sim.brokers["C"].durables.has("sc@C", "d")
    sim.reattach(sub.client)
    sub.connect()
    sim.send(sub.client, Unsubscribe("d"))
    sim.run()
    sim.detach(sub.client)
    sim.run()
    assert sim.tables_empty()


def test_a_durable_subscription_made_before_the_overlay_is_linked_misses_nothing() -> None:
    sim = Simulation(5)
    for name in "ABC":
        sim.add_broker(name)
    sim.link("A", "B")
    sim.run()
    pub = Publisher(sim, sim.attach("pa", "A"))
    sub = Subscriber(sim, sim.attach("sc", "C"))  # C is not linked yet
    sim.tick(1.0)
    for c in (pub, sub):
        c.connect()
    sim.run()
    assert "d" in sub.client.acks
    sim.tick(0.1)  # longer than the recovery below takes to reach A (see ``Recover.age``)
    for _ in range(10):
        pub.publish()  # nothing routes them to C yet: A's journal has them
    sim.run()
    sim.link("B", "C")  # the advertisement reaches C late
    sim.run()
    sub.collect()
    assert [n for _, n in sub.got] == list(range(10))


def _late_subscriber(sim: Simulation, before: int, after: int) -> Subscriber:
    """A chain A-B, C not yet linked: ``before`` guaranteed publications at A, a durable
    subscription made at C, ``after`` more; then C is linked and first meets the tree."""
    for name in "ABC":
        sim.add_broker(name)
    sim.link("A", "B")
    sim.run()
    pub = Publisher(sim, sim.attach("pa", "A"))
    pub.connect()
    sim.run()
    for _ in range(before):
        pub.publish()
        sim.run()
    sim.tick(1.0)
    sub = Subscriber(sim, sim.attach("sc", "C"))
    sub.connect()
    sim.run()
    sim.tick(1.0)
    for _ in range(after):
        pub.publish()
    sim.run()
    sim.link("B", "C")
    sim.run()
    sub.collect()
    return sub


def test_a_durable_subscription_first_meeting_a_long_tree_takes_none_of_its_past() -> None:
    """The first recovery spans several rounds (``Recover.limit`` each) of what was published
    before the subscription was made: every round keeps its starting point."""
    before = 2 * Recover("r", parse_subscription("[class,eq,'T']", id="s"), "t", 0).limit + 500
    sub = _late_subscriber(Simulation(11), before, 10)
    assert [n for _, n in sub.got] == list(range(before, before + 10))


@pytest.mark.parametrize("skew", [-30.0, -5.0, 5.0, 30.0])
def test_a_first_contact_compares_no_two_brokers_clocks(skew: float) -> None:
    """The subscriber's broker's clock is ``skew`` seconds off the publisher's: the first
    recovery still takes exactly what was published after the subscription was made."""
    sim = Simulation(12, clock=T0.timestamp())
    sim.skew["C"] = skew
    sub = _late_subscriber(sim, 20, 20)
    assert [n for _, n in sub.got] == list(range(20, 40))


def test_a_durable_queue_over_its_limit_discards_the_oldest_and_says_so() -> None:
    sim, pub, sub = _connected(6, gapless=False)
    sim.brokers["C"].durables.max_queued = 20  # Quotas.durable_queued
    sim.detach(sub.client)
    for _ in range(50):
        pub.publish()
    sim.run()
    (stats,) = sim.brokers["C"].durables.statistics()
    assert stats["queued"] <= 20 and stats["discarded"] == 50 - stats["queued"]
    sim.reattach(sub.client)
    sub.connect()
    sim.run()
    sub.collect()
    kept = [n for _, n in sub.got]
    assert kept == list(range(50 - len(kept), 50))  # the newest, in order
    (notice,) = sub.client.errors
    assert f"{50 - len(kept)} deliveries were discarded while you were away" in notice.text
    assert "d" in sub.client.acks  # the resumption itself succeeded


def _in_flight(sub: Subscriber) -> int:
    """Deliveries the subscriber has been sent and not acknowledged."""
    notes = [n for n in sub.client.notifications if isinstance(n, Notify)]
    return len(notes) - sub.read


def test_a_durable_subscription_sends_at_most_its_window_in_deliveries_and_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(durable, "DURABLE_WINDOW", 10)
    sim, pub, sub = _connected(7)
    for _ in range(50):
        pub.publish()
    sim.run()
    assert _in_flight(sub) == 10  # none acknowledged: the window is full
    sub.collect()  # acknowledges the 10
    sim.run()
    assert _in_flight(sub) == 10
    last = sub.client.notifications[-1]  # n = 19: as long as the next ones
    assert isinstance(last, Notify)
    size = len(encode(last.publication))
    monkeypatch.setattr(
        durable, "DURABLE_WINDOW_BYTES", 3 * size + 2
    )  # bytes bind before the count
    sub.collect()
    sim.run()
    assert _in_flight(sub) == 3
    for _ in range(20):  # three deliveries a round trip
        sub.collect()
        sim.run()
    assert [n for _, n in sub.got] == list(range(50))


def test_the_window_in_bytes_is_shared_by_the_durable_subscriptions_of_a_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two durable subscriptions of one client send no more bytes ahead of its
    acknowledgements than one may (and one delivery of each always goes): so many of them
    cannot overflow the client's queue at its broker."""
    sim = _overlay(9)
    pub = Publisher(sim, sim.attach("pa", "A"))
    client = sim.attach("sc", "C")
    pub.connect()
    for name in ("d1", "d2"):
        sim.send(client, Durable(parse_subscription("[class,eq,'T']", id=name), 0))
    sim.run()
    pub.publish()
    sim.run()
    size = len(encode(client.notifications[-1].publication))
    monkeypatch.setattr(durable, "DURABLE_WINDOW_BYTES", 5 * size + 2)
    for name in ("d1", "d2"):
        sim.send(client, Ack(name, 1))
    for _ in range(40):
        pub.publish()
    sim.run()
    in_flight = client.notifications[2:]
    assert 5 <= len(in_flight) <= 6  # together, about five (at most one more: one of each goes)
    assert sum(len(encode(n.publication)) for n in in_flight) <= 5 * size + 2 + size
    acked = {"d1": 1, "d2": 1}
    for _ in range(60):
        for note in client.notifications:
            for name in note.subscriptions:
                acked[name] = max(acked[name], note.seq)
        for name, seq in acked.items():
            sim.send(client, Ack(name, seq))
        sim.run()
    for name in ("d1", "d2"):
        seqs = [n.seq for n in client.notifications if n.subscriptions == (name,)]
        assert seqs == list(range(1, 42)), name  # every one, once, in order


@pytest.mark.parametrize("away", [True, False])
def test_deliveries_kept_in_memory_and_read_back_from_the_journal_join_without_gap(
    monkeypatch: pytest.MonkeyPatch, away: bool
) -> None:
    """Far behind (away, or not acknowledging), a client is sent the oldest deliveries from
    the journal and the latest from memory, each once and in order."""
    monkeypatch.setattr(durable, "RECENT", 7)
    monkeypatch.setattr(durable, "DURABLE_WINDOW", 5)
    sim = _overlay(8)
    pub = Publisher(sim, sim.attach("pa", "A"))
    subs = [Subscriber(sim, sim.attach(name, "C")) for name in ("s1", "s2")]
    pub.connect()
    for sub in subs:
        sub.connect()
    sim.run()
    if away:
        for sub in subs:
            sim.detach(sub.client)
    for _ in range(40):
        pub.publish()
    sim.run()
    if away:
        for sub in subs:
            sim.reattach(sub.client)
            sub.connect()
    for _ in range(20):  # five deliveries a round trip
        _run_and_collect(sim, [pub, *subs])
    for sub in subs:
        assert [n for _, n in sub.got] == list(range(40))
    (stats, _) = sim.brokers["C"].durables.statistics()
    assert stats["queued"] == 0 and stats["acked"] == stats["next"] - 1


# -- faults one at a time: links back one by one, clients late, flaps, overlapping crashes ---


def _carry(sim: Simulation, source: str, target: str, count: int | None = None) -> None:
    """Deliver, in order, the messages waiting on the link from ``source`` to ``target`` (the
    first ``count`` of them, or all): a schedule chosen message by message."""
    queue = sim._queues.get((source, target))
    while queue and (count is None or count > 0):
        sim._deliver(source, target, [queue.popleft()])
        if count is not None:
            count -= 1


def _run_except(sim: Simulation, *held: str) -> None:
    """Deliver everything but what waits on the ``held`` links ("DC": from D to C)."""
    keep = {(link[0], link[1]) for link in held}
    while ready := sorted(k for k, q in sim._queues.items() if q and k not in keep):
        _carry(sim, *ready[0], count=1)


def _parent(sim: Simulation, broker: str) -> str | None:
    """Where the only tree ``broker`` knows comes from."""
    trees = list(sim.brokers[broker].trees)
    return trees[0].parent if trees else None


def _d_linked_to_c_late() -> tuple[Simulation, Publisher, Subscriber]:
    """A publisher at A (linked to B, C, E), a durable subscriber at D following A's tree
    through E; D's link to C comes last. Trees do not move to other ways on their own: a lost
    link withdraws them and a neighbour offers them back, whose races these tests play."""
    sim = Simulation(0, switching=Switching(adaptive=False))
    for name in "ABCDE":
        sim.add_broker(name)
    for link in ["AB", "BC", "AC", "EA", "DE"]:
        sim.link(*link)
    sim.run()
    pub = Publisher(sim, sim.attach("pa", "A"))
    sub = Subscriber(sim, sim.attach("sd", "D"))
    pub.connect()
    sub.connect()
    sim.run()
    sim.link("C", "D")
    sim.run()
    return sim, pub, sub


def _d_follows_a_through_e_with_a_stale_route_at_c() -> tuple[Simulation, Publisher, Subscriber]:
    """A publisher at A, a durable subscriber at D following A's tree through E (A-E-D), and,
    at C, D's subscription to that tree left over from when D followed it through C.

    D loses the tree with its link to E and takes it from C: its subscription and recovery
    request go to C, slowly. Meanwhile C loses the tree with its link to A and takes it back
    through B; D, told, takes it from E again. D's subscription then reaches C, which has the
    tree again and takes it: C sends the tree's publications to D, which now follows it
    through E. When this returns, D's recovery through E has been answered up to the root's
    head of that time and the answer is held on the link from E."""
    sim, pub, sub = _d_linked_to_c_late()
    assert _parent(sim, "D") == "E"
    for _ in range(3):
        pub.publish()
    sim.run()
    sub.collect()
    sim.unlink("D", "E")
    _carry(sim, "D", "C")  # the tree lost
    _carry(sim, "C", "D")  # C offers it: D follows it through C
    assert _parent(sim, "D") == "C"  # its subscription and request wait on the link to C
    sim.link("D", "E")
    _run_except(sim, "DC")
    sim.unlink("A", "C")
    _run_except(sim, "DC", "CD")  # C takes the tree back through B
    assert _parent(sim, "C") == "B"
    _carry(sim, "C", "D", 1)  # C lost the tree
    _carry(sim, "D", "E")
    _carry(sim, "E", "D")  # E offers it: D follows it through E, and asks E
    assert _parent(sim, "D") == "E"
    _run_except(sim, "DC", "ED")
    _carry(sim, "D", "C")  # C takes D's subscription: it has the tree again
    _run_except(sim, "ED")
    c = sim.brokers["C"]
    assert any("D" in route.arrivals for route in c.routes)
    return sim, pub, sub


def test_a_publication_of_a_tree_not_followed_does_not_move_the_cursor() -> None:
    sim, pub, sub = _d_follows_a_through_e_with_a_stale_route_at_c()
    for _ in range(3):
        pub.publish()  # through C they reach D during its recovery: left to the answer
    _run_except(sim, "ED")
    sim.unlink("D", "E")  # the answer is lost, and the tree with it
    pub.publish()
    _carry(sim, "pa", "A")
    for link in ["AB", "BC", "CD"]:
        _carry(sim, link[0], link[1])  # it reaches D, which follows no tree, through C
    sim.run()  # D takes the tree from C and asks again for what it missed
    sim.link("D", "E")
    _run_and_collect(sim, [pub, sub])
    assert [n for _, n in sub.got] == list(range(7))


def test_a_publication_along_a_stale_route_does_not_overtake_one_along_the_tree() -> None:
    sim, pub, sub = _d_follows_a_through_e_with_a_stale_route_at_c()
    pub.publish()  # through C it reaches D during its recovery: left to the answer
    _run_except(sim, "ED")
    while not isinstance(sim.queued("E", "D")[0], RoutePublish):
        _carry(sim, "E", "D", 1)  # the answer: up to the head before that publication
    pub.publish()  # through C it reaches D first
    _run_except(sim, "ED")
    _run_and_collect(sim, [pub, sub])
    assert [n for _, n in sub.got] == list(range(5))


def test_a_durable_subscription_resumed_during_a_recovery_that_is_replaced_is_acknowledged() -> (
    None
):
    sim, pub, sub = _d_linked_to_c_late()
    for _ in range(3):
        pub.publish()
    sim.run()
    sub.collect()
    sim.detach(sub.client)
    sim.unlink("D", "E")
    _carry(sim, "D", "C")
    _carry(sim, "C", "D")  # D follows the tree through C: its request waits on the link
    sim.link("D", "E")
    _run_except(sim, "DC")
    sim.reattach(sub.client)
    sub.connect()
    _carry(sim, "sd", "D")  # the client's ok waits for that recovery
    sim.unlink("A", "C")
    _run_except(sim, "DC", "CD")
    _carry(sim, "C", "D", 1)  # C lost the tree
    _carry(sim, "D", "E")
    _carry(sim, "E", "D")  # D follows it through E: a new recovery replaces the first
    assert _parent(sim, "D") == "E"
    sim.link("A", "C")
    _run_and_collect(sim, [pub, sub])
    assert sub.client.acks.count("d") == 2
    assert all(len(b.echoes) == 0 for b in sim.brokers.values())


def test_a_publisher_back_after_leaving_during_a_recovery_of_its_tree_loses_nothing() -> None:
    sim, pub, sub = _d_linked_to_c_late()
    for _ in range(3):
        pub.publish()
    sim.run()
    sub.collect()
    sim.unlink("D", "E")
    _carry(sim, "D", "C")
    _carry(sim, "C", "D")  # D follows the tree through C: its request waits on the link
    for _ in range(2):
        pub.publish()  # C has no route to D yet: these are left to the recovery
    _run_except(sim, "DC")
    sim.detach(pub.client)  # the tree is withdrawn before the request reaches A
    _run_except(sim, "DC")
    sim.run()
    assert not list(sim.brokers["D"].trees)
    sim.reattach(pub.client)
    pub.connect()  # the same advertisement again: the same tree, asked again from D's cursor
    pub.publish()
    _run_and_collect(sim, [pub, sub])
    assert [n for _, n in sub.got] == list(range(6))


def test_a_recovery_whose_request_vanished_is_asked_again() -> None:
    sim, pub, sub = _d_linked_to_c_late()
    sim.unlink("D", "E")
    _carry(sim, "D", "C")
    _carry(sim, "C", "D")  # D follows the tree through C: its request waits on the link
    queue = sim._queues[("D", "C")]
    (request,) = [m for m in queue if isinstance(m, Recover)]
    queue.remove(request)  # lost without the link failing
    for _ in range(3):
        pub.publish()
    sim.run()
    assert sub.got == []  # left to the recovery that never ends
    for _ in range(durable.STALLED + 1):
        sim.tick(durable.REFRESH)
        sim.run()
    sub.collect()
    assert [n for _, n in sub.got] == list(range(3))
    assert all(d["recovering"] == 0 for d in sim.brokers["D"].durables.statistics())


def test_an_advertisement_flood_crossing_itself_as_its_root_fails_settles_later() -> None:
    sim = Simulation(0)
    for name in "ABC":
        sim.add_broker(name)
    for link in ["AB", "AC", "BC"]:
        sim.link(*link)
    sim.run()
    pub = Publisher(sim, sim.attach("pa", "A"))
    sim.run()
    pub.connect()
    _carry(sim, "pa", "A")
    _carry(sim, "A", "B")
    _carry(sim, "A", "C")  # B and C flood the tree to each other
    sim.crash("A")  # each takes the other's copy once its own is lost
    sim.run()
    sim.add_broker("A")
    sim.link("A", "B")  # A's link to C comes back later: C follows the tree through B
    sim.reattach(pub.client)
    pub.connect()
    sim.run()
    sim.link("A", "C")
    sim.run()
    assert pub.client.acks == ["a"]  # the advertisement made again has settled
    assert all(len(b.echoes) == 0 for b in sim.brokers.values())


@dataclass
class _Faults:
    """Faults as a real overlay has them: a restarted broker gets its links back one at a
    time, in any order, before or after its clients; links fail and come back without a
    crash; a broker can fail while another is still down; clients go away and come back."""

    sim: Simulation
    clients: list[Publisher | Subscriber]
    links: set[str] = field(default_factory=set)
    down: set[str] = field(default_factory=set)

    def link(self, link: str) -> None:
        """``link[0]`` dials ``link[1]``: both have greeted each other when this returns (what
        was still queued from the link's last life, sent as it failed, goes first)."""
        a, b = link[0], link[1]
        self.sim.link(a, b)
        for source, target in ((a, b), (b, a)):
            while source not in self.sim.brokers[target].peers.values():
                _carry(self.sim, source, target, 1)
        self.links.add(link if link in RING else link[::-1])

    def unlink(self, link: str) -> None:
        self.sim.unlink(link[0], link[1])
        self.links.discard(link)

    def crash(self, name: str) -> None:
        self.sim.crash(name)
        self.links = {link for link in self.links if name not in link}
        self.down.add(name)

    def restart(self, name: str) -> None:
        self.sim.add_broker(name)
        self.down.discard(name)

    def reattach(self, c: Publisher | Subscriber) -> None:
        c.collect()
        self.sim.reattach(c.client)
        c.connect()

    def missing(self) -> list[str]:
        return [lk for lk in RING if lk not in self.links and not set(lk) & self.down]

    def away(self) -> list[Publisher | Subscriber]:
        return [
            c for c in self.clients if not c.client.connected and c.client.broker not in self.down
        ]


@pytest.mark.parametrize("seed", range(20))
def test_every_durable_subscriber_gets_everything_once_under_random_faults(seed: int) -> None:
    sim = _overlay(seed)
    rng = random.Random(seed)  # the faults; sim.random orders the deliveries
    publishers = [Publisher(sim, sim.attach(f"p{b}", b)) for b in "AC"]
    subscribers = [Subscriber(sim, sim.attach(f"s{b}", b)) for b in "BDE"]
    everyone: list[Publisher | Subscriber] = [*publishers, *subscribers]
    faults = _Faults(sim, everyone, set(RING))
    for c in everyone:
        c.connect()
    sim.run()
    for _ in range(160):
        r = rng.random()
        if r < 0.35:
            p = rng.choice(publishers)
            if p.client.connected:
                p.publish()
        elif r < 0.6:
            sim.step(rng.randint(0, 30))
            for c in everyone:
                c.collect()
        elif r < 0.65:
            sim.tick(1.0)
        elif r < 0.7 and len(faults.down) < 2:
            faults.crash(rng.choice(sorted(set("ABCDE") - faults.down)))
        elif r < 0.76 and faults.down:
            faults.restart(rng.choice(sorted(faults.down)))
        elif r < 0.86 and faults.missing():
            link = rng.choice(faults.missing())
            faults.link(link if rng.random() < 0.5 else link[::-1])  # either side dials
        elif r < 0.93 and faults.away():
            faults.reattach(rng.choice(faults.away()))
        elif r < 0.97 and faults.links:
            faults.unlink(rng.choice(sorted(faults.links)))
        elif r >= 0.97:
            here = [c for c in everyone if c.client.connected]
            if here:
                c = rng.choice(here)
                c.collect()
                sim.detach(c.client)
    for name in sorted(faults.down):
        faults.restart(name)
    for link in faults.missing():
        faults.link(link)
        sim.step(rng.randint(0, 20))
    for c in faults.away():
        faults.reattach(c)
    _run_and_collect(sim, everyone)
    for p in publishers:
        for _ in range(3):
            p.publish()  # the routes work again without any recovery
    _run_and_collect(sim, everyone)
    for p in publishers:
        assert p.unacked == {}
    for s in subscribers:
        for p in publishers:
            name = f"{p.client.name}@{p.client.broker}"
            got = [n for publisher, n in s.got if publisher == name]
            assert got == list(range(p.count)), (s.client.name, name)
    for broker in sim.brokers.values():
        assert all(d["recovering"] == 0 for d in broker.durables.statistics())
        assert len(broker.echoes) == 0, broker.id
    _queues_agree(sim)


def test_a_clients_durable_queues_together_are_bounded_its_largest_giving_way() -> None:
    """One client's durable subscriptions queue at most ``Quotas.durable_bytes`` together:
    past that, the oldest deliveries of its largest queue are discarded and counted; its
    other queue and another client's are untouched."""
    limit = 20_000
    broker = Broker("B", config=BrokerConfig(quotas=Quotas(durable_bytes=limit)))
    for hop, name in (("p", "pub"), ("h", "hoarder"), ("o", "other")):
        broker.handle(Hello(name, Role.CLIENT), hop)
    broker.handle(parse_advertisement("[class,eq,'T'],[n,isPresent,0]", id="a"), "p")
    for hop, sub in (
        ("h", "[class,eq,'T']"),
        ("h", "[class,eq,'T'],[n,<,10]"),
        ("o", "[class,eq,'T'],[n,<,20]"),
    ):
        name = f"d{len(broker.durables)}"
        broker.handle(Durable(parse_subscription(sub, id=name)), hop)
    for hop in ("h", "o"):
        broker.close(hop)
    for n in range(400):
        broker.handle(Publication(f"p{n}", {"class": "T", "n": n, "pad": "x" * 100}, T0), "p")
    stats = {(s["owner"], s["name"]): s for s in broker.durables.statistics()}
    hoarder = [stats["hoarder@B", "d0"], stats["hoarder@B", "d1"]]
    assert sum(s["queued_bytes"] for s in hoarder) <= limit
    assert hoarder[0]["discarded"] > 0 and hoarder[1]["discarded"] == 0  # the largest gave way
    assert hoarder[1]["queued"] == 10
    other = stats["other@B", "d2"]
    assert other["queued"] == 20 and other["discarded"] == 0


def test_a_durable_subscription_whose_client_stays_away_expires() -> None:
    """With ``durable_expiry``, a subscription whose client has been away longer is dropped
    with its queue; one whose client is connected stays, however long."""
    broker = Broker("B", config=BrokerConfig(durable_expiry=30.0))
    t0 = 1_000_000.0
    for hop, name in (("p", "pub"), ("a", "away"), ("s", "stays")):
        broker.handle(Hello(name, Role.CLIENT), hop, t0)
    broker.handle(parse_advertisement("[class,eq,'T'],[n,isPresent,0]", id="a"), "p", t0)
    for hop in ("a", "s"):
        broker.handle(Durable(parse_subscription("[class,eq,'T']", id="d")), hop, t0)
    broker.close("a")
    broker.handle(Publication("p1", {"class": "T", "n": 1}, T0), "p", t0 + 1)
    broker.tick(t0 + 20)
    assert {s["owner"] for s in broker.durables.statistics()} == {"away@B", "stays@B"}
    broker.tick(t0 + 40)
    (left,) = broker.durables.statistics()
    assert left["owner"] == "stays@B" and left["next"] == 2
    assert not broker.durables.has("away@B", "d")


def test_a_subscription_whose_window_is_full_in_bytes_reads_nothing_back_until_it_has_room() -> (
    None
):
    """Large deliveries fill the client's window in bytes; more keep coming, past what is
    kept in memory: they are not read back from the journal one frame after another (each
    read would find no room to send), but once the client acknowledges."""
    reads: list[int] = []

    class Counting(MemoryJournal):
        def queued(self, record: DurableRecord, after: int, limit: int) -> list[Queued]:
            reads.append(after)
            return super().queued(record, after, limit)

    broker = Broker("B", journal=Counting())
    broker.handle(Hello("shop", Role.CLIENT), "shop")
    broker.handle(Hello("sub", Role.CLIENT), "sub")
    broker.handle(parse_advertisement("[class,eq,'T'],[n,isPresent,0]", id="a"), "shop")
    broker.handle(Durable(parse_subscription("[class,eq,'T']", id="d")), "sub")
    pad = "x" * (200 << 10)
    sent = 0
    for n in range(200):  # 40 MB: ten times the window, and the memory kept
        pub = Publication(f"p{n}", {"class": "T", "n": n, "pad": pad}, T0)
        sent += sum(isinstance(m, Notify) for _, m in broker.handle(pub, "shop"))
    assert sent < 25 and len(reads) <= 2
    out = broker.handle(Ack("d", sent), "sub")
    assert sum(isinstance(m, Notify) for _, m in out) > 0
