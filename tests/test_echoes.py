"""Settled routing in the simulation: an acknowledgement means the routing is in place."""

from __future__ import annotations

import itertools

from padres.broker import Covering
from padres.language.parser import (
    parse_advertisement,
    parse_filter,
    parse_publication,
    parse_subscription,
)
from padres.matching.relations import covers
from padres.model.protocol import RouteAdvertise, RouteSubscribe
from padres.runtime.simulation import SimClient, Simulation


def _chain(*names: str, covering: Covering = Covering.LAZY, seed: int = 0) -> Simulation:
    sim = Simulation(seed, covering=covering)
    for name in names:
        sim.add_broker(name)
    for a, b in itertools.pairwise(names):
        sim.link(a, b)
    sim.run()
    return sim


def _step_until_acked(sim: Simulation, client: SimClient, ref: str) -> None:
    while ref not in client.acks:
        assert sim.step(1) == 1, f"{ref} was never acknowledged"


def test_an_advertisement_is_acknowledged_once_the_subscriptions_are_back() -> None:
    for seed in range(20):
        sim = _chain("A", "B", "C", "D", seed=seed)
        sub = sim.attach("sub", "D")
        sim.send(sub, parse_subscription("[class,eq,'T'],[v,>,1]", id="s"))
        sim.run()
        pub = sim.attach("pub", "A")
        sim.send(pub, parse_advertisement("[class,eq,'T'],[v,isPresent,0]", id="a"))
        _step_until_acked(sim, pub, "a")
        # the subscription from D is in A's table at the moment the publisher is told
        assert [r.sub.filter for r in sim.brokers["A"].routes] == [
            parse_filter("[class,eq,'T'],[v,>,1]")
        ], seed
        sim.send(pub, parse_publication("[class,'T'],[v,5]", id="p1"))
        sim.run()
        assert [n.publication.id for n in sub.notifications] == ["p1"], seed
        assert [b for b in "ABCD" if sim.brokers[b].echoes] == []


def test_a_subscription_is_acknowledged_once_it_reached_every_advertisement() -> None:
    for seed in range(20):
        sim = _chain("A", "B", "C", seed=seed)
        pubs = [sim.attach("left", "A"), sim.attach("right", "C")]
        for p in pubs:
            sim.send(p, parse_advertisement("[class,eq,'T'],[v,isPresent,0]", id="a"))
        sim.run()
        sub = sim.attach("sub", "B")
        sim.send(sub, parse_subscription("[class,eq,'T']", id="s"))
        _step_until_acked(sim, sub, "s")
        for broker in "AC":
            assert len(sim.brokers[broker].routes) == 1, (seed, broker)


def test_a_subscription_hidden_by_covering_waits_for_the_one_covering_it() -> None:
    for seed in range(20):
        sim = _chain("A", "B", "C", "D", seed=seed)
        pub = sim.attach("pub", "A")
        sim.send(pub, parse_advertisement("[class,eq,'T'],[v,isPresent,0]", id="a"))
        sim.run()
        wide, narrow = sim.attach("wide", "D"), sim.attach("narrow", "D")
        sim.send(wide, parse_subscription("[class,eq,'T']", id="w"))
        sim.step(2)  # the wide subscription is on its way, not yet at A
        sim.send(narrow, parse_subscription("[class,eq,'T'],[v,>,1]", id="n"))
        _step_until_acked(sim, narrow, "n")
        narrow_filter = parse_filter("[class,eq,'T'],[v,>,1]")
        at_a = [r.sub.filter for r in sim.brokers["A"].routes]
        assert any(covers(f, narrow_filter) for f in at_a), seed
        sim.send(pub, parse_publication("[class,'T'],[v,5]", id="p1"))
        sim.run()
        assert [n.publication.id for n in narrow.notifications] == ["p1"], seed


def test_cycles_do_not_make_echoes_wait_in_a_circle() -> None:
    for seed in range(20):
        sim = Simulation(seed, covering=Covering.OFF)
        for name in "ABCDE":
            sim.add_broker(name)
        for link in ["AB", "BC", "CD", "DE", "EA", "AC", "BD"]:
            sim.link(link[0], link[1])
        sim.run()
        clients = [sim.attach(f"c{b}", b) for b in "ABCDE"]
        for c in clients:
            sim.send(c, parse_advertisement("[class,eq,'T'],[v,isPresent,0]", id="a"))
            sim.send(c, parse_subscription("[class,eq,'T'],[v,>,1]", id="s"))
        sim.run()
        assert all(sorted(c.acks) == ["a", "s"] for c in clients), seed
        assert all(not b.echoes for b in sim.brokers.values()), seed


def test_a_link_lost_midway_ends_the_wait_saying_what_is_incomplete() -> None:
    sim = _chain("A", "B", "C")
    sub = sim.attach("sub", "C")
    sim.send(sub, parse_subscription("[class,eq,'T']", id="s"))
    sim.run()
    pub = sim.attach("pub", "A")
    sim.send(pub, parse_advertisement("[class,eq,'T'],[v,isPresent,0]", id="a"))
    while not any(isinstance(m, RouteAdvertise) for m in sim.queued("B", "C")):
        assert sim.step(1) == 1
    sim.unlink("B", "C")
    sim.run()
    assert pub.acks == ["a"]
    assert pub.incomplete == {"a": ("the link from B to C was lost",)}
    assert all(not b.echoes for b in sim.brokers.values())


def test_every_routing_message_between_brokers_carries_an_echo_token() -> None:
    sim = _chain("A", "B")
    pub, sub = sim.attach("pub", "A"), sim.attach("sub", "B")
    sim.send(pub, parse_advertisement("[class,eq,'T']", id="a"))
    sim.send(sub, parse_subscription("[class,eq,'T']", id="s"))
    routing = []
    while sim.step(1):
        for source, target in [("A", "B"), ("B", "A")]:
            routing += [
                m
                for m in sim.queued(source, target)
                if isinstance(m, RouteAdvertise | RouteSubscribe)
            ]
    assert routing and all(m.echo for m in routing)
