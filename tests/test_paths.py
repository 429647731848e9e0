"""Adaptive paths in the simulation: a tree moves away from a parent that stopped answering or
is clearly slower, and back, without a loop at any moment, without losing or doubling plain
publications, and with guaranteed ones exactly once and in order; and the runtime's probe of
a link."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime

import pytest

from padres.bench.overlay import topology
from padres.broker.paths import CEILING, LinkState, Switching
from padres.broker.trees import Tree
from padres.language.parser import parse_advertisement, parse_publication, parse_subscription
from padres.model.messages import Publication
from padres.model.protocol import (
    Ack,
    Durable,
    Guaranteed,
    Notify,
    RouteDrain,
    RouteUnadvertise,
    RouteUnsubscribe,
)
from padres.runtime.probe import SMOOTHING, SUSPECT, Probe
from padres.runtime.simulation import SimClient, Simulation

T0 = datetime(2026, 1, 1, tzinfo=UTC)
FAST = LinkState(0.001)
FROZEN = LinkState(suspect=True)


def _ring(
    names: str = "ABCD", late: tuple[str, ...] = ("CD", "DA")
) -> tuple[Simulation, SimClient, SimClient]:
    """Brokers in a ring (A-B-C-D-A for four), a publisher at A and a subscriber at C; the
    ``late`` links are made once the tree is routed, so that it reaches C along A-B-C: the
    other way comes later, as an offer."""
    sim = Simulation(1)
    for name in names:
        sim.add_broker(name)
    ring = [(names[i], names[(i + 1) % len(names)]) for i in range(len(names))]
    for a, b in ring:
        if a + b not in late:
            sim.link(a, b)
    sim.run()
    pub, sub = sim.attach("pub", "A"), sim.attach("sub", "C")
    sim.send(pub, parse_advertisement("[class,eq,'T'],[n,isPresent,0]", id="a"))
    sim.send(sub, parse_subscription("[class,eq,'T']", id="s"))
    sim.run()
    for link in late:
        sim.link(link[0], link[1])
    sim.run()
    return sim, pub, sub


def _tree(sim: Simulation, broker: str, cls: str = "T") -> Tree:
    """The tree of class ``cls`` at ``broker``."""
    (tree,) = [
        t
        for t in sim.brokers[broker].trees
        if any(a.filter.class_name == cls for a in t.advertisements.values())
    ]
    return tree


def _let_go(sim: Simulation) -> None:
    """Time for former parents to be let go of: the subscriptions settle along the new way,
    then a hold passes."""
    for _ in range(2):
        sim.tick(Switching().hold)
        sim.run()


def _ids(client: SimClient) -> list[str]:
    return [n.publication.id for n in client.notifications]


class Feed:
    """Numbered plain publications from one client."""

    def __init__(self, sim: Simulation, client: SimClient) -> None:
        self.sim, self.client, self.count = sim, client, 0

    def publish(self, count: int = 1) -> list[str]:
        ids = []
        for _ in range(count):
            self.count += 1
            ident = f"{self.client.name}-{self.count}"
            text = f"[class,'T'],[n,{self.count}]"
            self.sim.send(self.client, parse_publication(text, id=ident))
            ids.append(ident)
        return ids


def test_a_tree_leaves_a_frozen_parent_and_takes_back_what_it_held() -> None:
    sim, pub, sub = _ring()
    feed = Feed(sim, pub)
    assert _tree(sim, "C").parent == "B" and _tree(sim, "C").offers["D"].path == ("A", "D")
    before = feed.publish(3)
    sim.run()
    sim.freeze("B")
    held = feed.publish(3)  # on their way to B, which holds them
    sim.run()
    sim.measure("C", {"B": FROZEN, "D": FAST})  # B's answer is overdue: C leaves it at once
    sim.run()
    assert _tree(sim, "C").parent == "D" and _tree(sim, "C").path == ("A", "D", "C")
    assert _tree(sim, "C").held == {"B"}  # C's subscription stays at B: B may hold some
    after = feed.publish(3)
    sim.run()
    assert _ids(sub) == before + after  # by the other way, while B is frozen
    sim.thaw("B")
    sim.run()
    assert _ids(sub) == before + after + held  # what B held comes once, late; not the rest
    sim.tick(1.0)
    sim.measure("C", {"B": FAST, "D": FAST})  # B answers again
    _let_go(sim)
    tree = _tree(sim, "C")
    assert not tree.held and not tree.draining and len(sim.brokers["B"].routes) == 0
    assert _tree(sim, "B").parent == "A"  # B still has the tree; it carries nothing to C
    sim.tick(10.0)
    assert sim.clock >= tree.until  # its publications are no longer told apart
    last = feed.publish(3)
    sim.run()
    assert _ids(sub) == before + after + held + last


def test_a_clearly_cheaper_way_is_taken_after_the_hold_and_a_slightly_cheaper_one_is_not() -> None:
    sim, pub, sub = _ring()
    feed = Feed(sim, pub)
    sim.measure("C", {"B": LinkState(0.03), "D": LinkState(0.01)})  # 3x, but 20 ms: no
    sim.run()
    assert _tree(sim, "C").parent == "B"
    sim.measure("C", {"B": LinkState(0.2), "D": LinkState(0.01)})  # 20x and 190 ms: yes
    sim.run()
    assert _tree(sim, "C").parent == "D" and sim.brokers["C"].paths.moves == 1
    sim.tick(1.0)
    sim.measure("C", {"B": LinkState(0.001), "D": LinkState(0.2)})  # within the hold
    sim.run()
    assert _tree(sim, "C").parent == "D"
    sim.tick(Switching().hold)
    sim.measure("C", {"B": LinkState(0.0011), "D": LinkState(0.2)})
    sim.run()
    assert _tree(sim, "C").parent == "B" and sim.brokers["C"].paths.moves == 2
    ids = feed.publish(5)
    sim.run()
    _let_go(sim)
    assert _ids(sub) == ids and not _tree(sim, "C").held
    assert {len(sim.brokers[b].routes) for b in "BD"} == {0, 1}  # one way carries it


def test_a_cheaper_way_is_used_only_once_the_subscriptions_have_settled_along_it() -> None:
    """Make before break: C's subscription stays at B until D's echo says it has reached A;
    a publication sent meanwhile still comes, along the old way."""
    sim, pub, sub = _ring()
    feed = Feed(sim, pub)
    sim.measure("C", {"B": LinkState(0.3), "D": FAST})
    assert _tree(sim, "C").parent == "D"
    sim.tick(Switching().hold)  # held: D has not echoed yet
    assert not any(isinstance(m, RouteUnsubscribe) for m in sim.queued("C", "B"))
    ids = feed.publish(2)
    sim.run()
    assert _ids(sub) == ids
    sim.tick(0.5)  # settled now: what A sent before may still be on its way through B
    assert not any(isinstance(m, RouteUnsubscribe) for m in sim.queued("C", "B"))
    sim.tick(Switching().hold)
    queued = sim.queued("C", "B")
    assert any(isinstance(m, RouteUnsubscribe) for m in queued)
    assert isinstance(queued[-1], RouteDrain)
    sim.run()
    assert not _tree(sim, "C").draining


def test_a_broker_left_without_a_feasible_way_gets_a_newer_version_from_the_root() -> None:
    """A ring of five: C follows A's tree through B, and its other neighbour D is as far from
    A as C (A-E-D): not a feasible parent at the tree's version. B freezes: C asks A, through
    D and E, for a newer version, under which D is feasible, and moves there."""
    sim, pub, sub = _ring("ABCDE", late=("CD",))
    feed = Feed(sim, pub)
    c = _tree(sim, "C")
    assert c.parent == "B" and c.offers["D"].path == ("A", "E", "D") and c.version == 0
    sim.freeze("B")
    sim.measure("C", {"B": FROZEN, "D": FAST})
    sim.run()
    assert c.parent == "D" and c.version == 1 and c.path == ("A", "E", "D", "C")
    assert sim.brokers["A"].paths.bumps == 1
    ids = feed.publish(3)
    sim.run()
    assert _ids(sub) == ids
    sim.thaw("B")
    sim.run()
    assert _tree(sim, "B").version == 1 and c.offers["B"].version == 1


def test_a_lost_link_moves_the_tree_and_the_brokers_below_keep_it() -> None:
    """E hangs below C. C's link to its parent B fails: C takes D, which is closer to A, and
    E is told only the new path: no withdrawal of the tree reaches it."""
    sim, pub, sub = _ring()
    sim.add_broker("E")
    sim.link("E", "C")
    below = sim.attach("below", "E")
    sim.send(below, parse_subscription("[class,eq,'T']", id="s"))
    sim.run()
    feed = Feed(sim, pub)
    sim.brokers["B"].close("C")  # B notices later
    sim._queues.pop(("B", "C"), None)
    sim._emit("C", sim.brokers["C"].close("B"))
    assert _tree(sim, "C").parent == "D"
    assert not any(isinstance(m, RouteUnadvertise) for m in sim.queued("C", "E"))
    sim.run()
    ids = feed.publish(3)
    sim.run()
    assert _ids(sub) == ids and _ids(below) == ids


# -- guaranteed publications ---------------------------------------------------------------


class Durables:
    """A guaranteed publisher at A and a durable subscriber at C, acknowledging as it goes."""

    def __init__(self, sim: Simulation, pub: SimClient, sub: SimClient) -> None:
        self.sim, self.pub, self.sub = sim, pub, sub
        self.count = 0
        self.last = 0
        self.read = 0
        self.got: list[int] = []
        sim.send(pub, parse_advertisement("[class,eq,'G'],[n,isPresent,0]", id="g"))
        sim.send(sub, Durable(parse_subscription("[class,eq,'G']", id="d"), 0))
        sim.run()

    def publish(self, count: int = 1) -> None:
        for _ in range(count):
            self.count += 1
            pub = Publication(f"g{self.count}", {"class": "G", "n": self.count}, T0)
            self.sim.send(self.pub, Guaranteed(pub))

    def collect(self) -> None:
        fresh = [n for n in self.sub.notifications[self.read :] if n.subscriptions == ("d",)]
        self.read = len(self.sub.notifications)
        for note in fresh:
            assert isinstance(note, Notify)
            if note.seq <= self.last:
                continue
            assert note.seq == self.last + 1
            self.last = note.seq
            self.got.append(int(note.publication.attributes["n"]))
        if fresh:
            self.sim.send(self.sub, Ack("d", self.last))


@pytest.mark.parametrize("seed", range(6))
def test_guaranteed_publications_come_once_and_in_order_while_the_tree_moves(seed: int) -> None:
    """B, on the way, freezes with guaranteed publications on their way through it; C
    leaves it, they go on through D, B thaws and hands over what it held, C moves back: the
    durable subscription at C takes every one once, in order (at random interleavings)."""
    sim, pub, sub = _ring()
    sim.random.seed(seed)
    g = Durables(sim, pub, sub)
    rng = random.Random(seed)
    g.publish(5)
    sim.step(rng.randint(0, 40))
    sim.freeze("B")
    g.publish(5)
    sim.step(rng.randint(0, 40))
    sim.measure("C", {"B": FROZEN, "D": FAST})
    for _ in range(3):
        g.publish(3)
        sim.step(rng.randint(0, 30))
        g.collect()
    sim.thaw("B")
    g.publish(3)
    sim.step(rng.randint(0, 60))
    sim.tick(1.0)
    sim.measure("C", {"B": FAST, "D": LinkState(0.3)})
    sim.tick(Switching().hold)
    sim.measure("C", {"B": FAST, "D": LinkState(0.3)})  # back to B
    g.publish(4)
    for _ in range(4):
        sim.step(rng.randint(0, 50))
        sim.tick(1.0)
        g.collect()
    sim.run()
    sim.tick(11.0)  # a round of refresh asks the roots again, too
    sim.run()
    g.collect()
    assert g.got == list(range(1, g.count + 1))
    assert _tree(sim, "C", "G").parent == "B"


# -- random moves -------------------------------------------------------------------------


def _cycles(sim: Simulation) -> list[list[str]]:
    """Chains of parents that close on themselves, in any tree."""
    parents: dict[str, dict[str, str]] = {}
    for name, broker in sim.brokers.items():
        for tree in broker.trees:
            parents.setdefault(tree.id, {})[name] = tree.parent
    found = []
    for by_broker in parents.values():
        for start in by_broker:
            chain, at = [start], by_broker[start]
            while at in by_broker and at not in chain:
                chain.append(at)
                at = by_broker[at]
            if at in chain:
                found.append(chain)
    return found


@pytest.mark.parametrize("seed", range(4))
def test_random_moves_never_close_a_loop_and_lose_or_double_nothing(seed: int) -> None:
    """A random cyclic overlay of ten brokers, three publishers, a subscriber at every
    broker; links measured at random (costs, suspects: dozens of moves, and newer versions
    asked for), the overlay's messages interleaved at random, time passing a little at a time
    (as in a real overlay, messages take much less than a hold). After every frame no chain
    of parents closes on itself in any tree; at the end every subscriber has every
    publication exactly once."""
    rng = random.Random(seed)
    sim = Simulation(seed)
    edges = topology(10, 0.8, rng)
    for name in sorted({b for edge in edges for b in edge}):
        sim.add_broker(name)
    for a, b in edges:
        sim.link(a, b)
    sim.run()
    names = sorted(sim.brokers)
    subs = [sim.attach(f"s{name}", name) for name in names]
    for s in subs:
        sim.send(s, parse_subscription("[class,eq,'T']", id="s"))
    feeds = []
    for i, name in enumerate(rng.sample(names, 3)):
        client = sim.attach(f"p{i}", name)
        sim.send(client, parse_advertisement("[class,eq,'T'],[n,isPresent,0]", id="a"))
        feeds.append(Feed(sim, client))
    sim.run()
    published: list[str] = []
    for _ in range(300):
        action = rng.random()
        if action < 0.3:
            name = rng.choice(names)
            links = {
                hop: LinkState(suspect=True)
                if rng.random() < 0.15
                else LinkState(rng.choice((0.001, 0.01, 0.1, 0.4)))
                for hop in sim.brokers[name].peers
            }
            sim.measure(name, links)
        elif action < 0.45:
            published += rng.choice(feeds).publish(rng.randint(1, 3))
        elif action < 0.5:
            sim.tick(rng.choice((0.1, 0.25, 0.5)))
        for _ in range(rng.randint(1, 30)):
            if not sim.step(1):
                break
            assert _cycles(sim) == []
    calm = {name: dict.fromkeys(sim.brokers[name].peers, FAST) for name in names}
    for _ in range(3):
        for name in names:
            sim.measure(name, calm[name])
        sim.run()
        sim.tick(Switching().hold + 0.5)
        sim.run()
        assert _cycles(sim) == []
    published += [i for feed in feeds for i in feed.publish(2)]
    sim.run()
    assert sum(b.paths.moves for b in sim.brokers.values()) > 20
    assert sum(b.paths.bumps for b in sim.brokers.values()) > 5
    for s in subs:
        counts = Counter(_ids(s))
        assert set(counts) == set(published) and set(counts.values()) == {1}, s.name
    for broker in sim.brokers.values():
        for tree in broker.trees:
            assert not tree.held and tree.cost < CEILING


@pytest.mark.parametrize("seed", range(4))
def test_durable_subscribers_take_everything_once_in_order_through_random_moves(seed: int) -> None:
    """The same kind of overlay, with two guaranteed publishers and a durable subscriber at
    every broker; besides the random measures, brokers freeze and thaw and links fail and
    come back. Each durable subscriber takes every guaranteed publication once, in each
    publisher's order."""
    rng = random.Random(seed)
    sim = Simulation(seed)
    edges = topology(8, 0.8, rng)
    for name in sorted({b for edge in edges for b in edge}):
        sim.add_broker(name)
    for a, b in edges:
        sim.link(a, b)
    sim.run()
    names = sorted(sim.brokers)
    subs = {name: sim.attach(f"s{name}", name) for name in names}
    for client in subs.values():
        sim.send(client, Durable(parse_subscription("[class,eq,'G']", id="d"), 0))
    pubs = [sim.attach(f"p{i}", name) for i, name in enumerate(rng.sample(names, 2))]
    for client in pubs:
        sim.send(client, parse_advertisement("[class,eq,'G'],[n,isPresent,0]", id="g"))
    sim.run()
    counts = dict.fromkeys(range(len(pubs)), 0)
    taken: dict[str, dict[int, list[int]]] = {name: {} for name in names}
    last: dict[str, int] = dict.fromkeys(names, 0)
    read: dict[str, int] = dict.fromkeys(names, 0)

    def collect() -> None:
        for name, client in subs.items():
            fresh = client.notifications[read[name] :]
            read[name] = len(client.notifications)
            for note in fresh:
                if note.seq <= last[name]:
                    continue
                last[name] = note.seq
                who = int(note.publication.publisher.split("@")[0][1:])
                taken[name].setdefault(who, []).append(int(note.publication.attributes["n"]))
            if fresh:
                sim.send(client, Ack("d", last[name]))

    down: list[tuple[str, str]] = []
    for _ in range(250):
        action = rng.random()
        if action < 0.25:
            name = rng.choice(names)
            links = {
                hop: LinkState(suspect=True)
                if rng.random() < 0.15 or hop in sim.frozen
                else LinkState(rng.choice((0.001, 0.01, 0.1, 0.4)))
                for hop in sim.brokers[name].peers
            }
            if name not in sim.frozen:
                sim.measure(name, links)
        elif action < 0.45:
            i = rng.randrange(len(pubs))
            counts[i] += 1
            pub = Publication(f"g{counts[i]}", {"class": "G", "n": counts[i]}, T0)
            sim.send(pubs[i], Guaranteed(pub))
        elif action < 0.5:
            sim.tick(rng.choice((0.1, 0.25, 0.5)))
            collect()
        elif action < 0.54 and not sim.frozen:
            sim.freeze(rng.choice(names))
        elif action < 0.58 and sim.frozen:
            sim.thaw(sorted(sim.frozen)[0])
        elif action < 0.61 and len(down) < 2:
            a, b = rng.choice(edges)
            if (a, b) not in down:
                sim.unlink(a, b)
                down.append((a, b))
        elif action < 0.64 and down:
            sim.link(*down.pop(0))
        sim.step(rng.randint(1, 30))
    for name in sorted(sim.frozen):
        sim.thaw(name)
    for a, b in down:
        sim.link(a, b)
    for _ in range(4):
        for name in names:
            sim.measure(name, dict.fromkeys(sim.brokers[name].peers, FAST))
        sim.run()
        sim.tick(11.0)  # a round of refresh: every root asked again
        sim.run()
        collect()
    for name in names:
        for i, count in counts.items():
            assert taken[name].get(i, []) == list(range(1, count + 1)), (name, i)
    assert sum(b.paths.moves for b in sim.brokers.values()) > 10


def test_a_probe_smooths_round_trips_and_suspects_an_answer_a_second_overdue() -> None:
    probe = Probe()
    ping = probe.ping(10.0)
    assert ping is not None and probe.ping(10.1) is None  # one out at a time
    probe.pong(ping.sent, 10.004)
    state = probe.state(10.1)
    assert state.cost == pytest.approx(0.002) and not state.suspect
    assert probe.ping(10.2) is None  # not yet due
    ping = probe.ping(10.3)
    assert ping is not None
    probe.pong(99.0, 10.5)  # not the one out: ignored
    probe.pong(ping.sent, 10.704)  # 404 ms: smoothed
    assert probe.rtt == pytest.approx(0.004 + SMOOTHING * 0.4)
    ping = probe.ping(11.0)
    assert ping is not None
    assert not probe.state(11.0 + SUSPECT).suspect
    assert probe.state(11.0 + SUSPECT + 0.01).suspect
    probe.pong(ping.sent, 12.5)  # it answers again
    assert not probe.state(12.5).suspect
