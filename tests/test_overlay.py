"""The broker core in simulated overlays: routing, covering, cycles, cleanup, link failures."""

from __future__ import annotations

import pytest

from padres.bench import overlay
from padres.bench.workloads import stock_publications
from padres.broker import Broker, Covering
from padres.broker import publishing as publishing_module
from padres.broker import routes as routes_module
from padres.broker import session as session_module
from padres.language.parser import (
    parse_advertisement,
    parse_composite,
    parse_publication,
    parse_subscription,
)
from padres.matching.matcher import Conformity, conforms_to
from padres.matching.relations import covers
from padres.model.messages import Publication, Unadvertise, Unsubscribe
from padres.model.protocol import Error, Hello, Notify, Ok, Query, QueryResult, Role, RouteSubscribe
from padres.runtime.simulation import SimClient, Simulation


def _star(covering: Covering = Covering.LAZY, *, extra: bool = True, seed: int = 1) -> Simulation:
    """PADRES' demo star: A, C, D, E each linked to B; with ``extra``, also A-C and D-E."""
    sim = Simulation(seed, covering=covering)
    for b in "ABCDE":
        sim.add_broker(b)
    for b in "ACDE":
        sim.link(b, "B")
    if extra:
        sim.link("A", "C")
        sim.link("D", "E")
    sim.run()
    return sim


def _received(client: SimClient) -> list[tuple[str, tuple[str, ...]]]:
    return [(n.publication.id, n.subscriptions) for n in client.notifications]


def _pub(text: str, ident: str) -> Publication:
    return parse_publication(text, id=ident)


def test_publications_follow_subscriptions_across_a_cyclic_overlay() -> None:
    sim = _star()
    pub, s1, s2 = sim.attach("pub", "A"), sim.attach("s1", "E"), sim.attach("s2", "D")
    sim.send(pub, parse_advertisement("[class,eq,'STOCK'],[price,>,0]", id="a1"))
    sim.run()
    sim.send(s1, parse_subscription("[class,eq,'STOCK'],[price,>,10]", id="x"))
    sim.send(s2, parse_subscription("[class,eq,'STOCK'],[price,>,5]", id="x"))
    sim.send(s2, parse_subscription("[class,eq,'OTHER']", id="y"))
    sim.run()
    for i, price in enumerate((3, 7, 20)):
        sim.send(pub, _pub(f"[class,'STOCK'],[price,{price}]", f"p{i}"))
    sim.run()
    assert _received(s1) == [("p2", ("x",))]
    assert _received(s2) == [("p1", ("x",)), ("p2", ("x",))]
    assert s1.notifications[0].publication.publisher == "pub@A"
    for seen in sim.seen.values():  # no broker saw a publication twice
        assert len({p.id for p in seen}) == len(seen)
    assert not any(p.id == "p0" for b in "BCDE" for p in sim.seen[b])  # p0 matches nobody
    assert s1.acks == ["x"] and sorted(s2.acks) == ["x", "y"]  # "y" overlaps nothing: acked first


def test_subscription_made_before_the_advertisement_is_routed_when_it_arrives() -> None:
    sim = _star()
    pub, sub = sim.attach("pub", "A"), sim.attach("sub", "E")
    sim.send(sub, parse_subscription("[class,eq,'T'],[v,>=,1]", id="s"))
    sim.run()
    sim.send(pub, parse_advertisement("[class,eq,'T'],[v,isPresent,0]", id="a"))
    sim.run()
    sim.send(pub, _pub("[class,'T'],[v,1]", "p1"))
    sim.run()
    assert _received(sub) == [("p1", ("s",))]


def test_composite_subscription_is_split_routed_and_joined_at_its_edge() -> None:
    sim = _star()
    shop, server, manager = sim.attach("shop", "A"), sim.attach("srv", "C"), sim.attach("m", "E")
    sim.send(shop, parse_advertisement("[class,eq,'Order'],[UserType,isPresent,'']", id="a"))
    sim.send(server, parse_advertisement("[class,eq,'SysInfo'],[UserType,isPresent,'']", id="a"))
    sim.run()
    cs = "{[class,eq,'Order'],[UserType,eq,$X]} & {[class,eq,'SysInfo'],[UserType,eq,$X]}"
    sim.send(manager, parse_composite(cs, id="c"))
    sim.run()
    sim.send(server, _pub("[class,'SysInfo'],[UserType,'gold']", "i1"))
    sim.send(shop, _pub("[class,'Order'],[UserType,'silver']", "o1"))
    sim.send(shop, _pub("[class,'Order'],[UserType,'gold']", "o2"))
    sim.run()
    got = [
        (n.subscription, sorted(p.id for p in n.publications), dict(n.bindings))
        for n in manager.composites
    ]
    assert got == [("c", ["i1", "o2"], {"X": "gold"})]
    assert manager.notifications == []  # the parts themselves are not delivered


def test_conformity_check_refuses_unadvertised_publications_with_a_clear_error() -> None:
    sim = _star()
    pub = sim.attach("pub", "A")
    sim.send(pub, parse_advertisement("[class,eq,'T'],[v,<,10]", id="a"))
    sim.send(pub, _pub("[class,'T'],[v,50]", "p1"))
    sim.run()
    assert len(pub.errors) == 1
    assert pub.errors[0].ref == "p1"
    assert "matches none of the advertisements" in pub.errors[0].text

    lax = Simulation(1, conformity=False)
    lax.add_broker("A")
    p, s = lax.attach("p", "A"), lax.attach("s", "A")
    lax.send(s, parse_subscription("[class,eq,'T']", id="s"))
    lax.run()
    lax.send(p, _pub("[class,'T'],[v,50]", "p1"))
    lax.run()
    assert _received(s) == [("p1", ("s",))] and not p.errors


def test_a_publication_is_checked_against_its_publishers_advertisements_of_its_class_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A publisher with 5,000 advertisements of other classes: its publication of class T is
    checked against its one advertisement of T alone, whose tests were made when it came,
    and stays conforming after the others are withdrawn."""
    broker = Broker("A")
    broker.handle(Hello("pub", Role.CLIENT), "h")
    for n in range(5000):
        broker.handle(parse_advertisement(f"[class,eq,'C{n % 50}'],[v,>,{n}]", id=f"a{n}"), "h")
    broker.handle(parse_advertisement("[class,eq,'T'],[v,<,10]", id="t"), "h")
    checked: list[Conformity] = []

    def counted(checks: Conformity, pub: Publication) -> bool:
        checked.append(checks)
        return conforms_to(checks, pub)

    def made(advertisement: object) -> Conformity:
        raise AssertionError("an advertisement's tests are made once, when it comes")

    monkeypatch.setattr(publishing_module, "conforms_to", counted)
    monkeypatch.setattr(session_module, "conformity", made)
    assert not [
        m for _, m in broker.handle(_pub("[class,'T'],[v,5]", "p1"), "h") if isinstance(m, Error)
    ]
    refused = broker.handle(_pub("[class,'T'],[v,50]", "p2"), "h")
    assert [m.ref for _, m in refused if isinstance(m, Error)] == ["p2"]
    assert len(checked) == 2
    for n in range(5000):
        broker.handle(Unadvertise(f"a{n}"), "h")
    assert not [
        m for _, m in broker.handle(_pub("[class,'T'],[v,6]", "p3"), "h") if isinstance(m, Error)
    ]
    assert broker.sessions["h"].conforming.keys() == {"T"}


def test_bad_requests_get_errors_and_change_nothing() -> None:
    broker = Broker("B")
    out = broker.handle(parse_subscription("[class,eq,'T']", id="s"), "h1")
    assert isinstance(out[0][1], Error) and "hello" in out[0][1].text
    broker.handle(Hello("c"), "h1")
    assert broker.handle(Hello("c"), "h2")[0][1] == Error("a client named 'c' is already connected")
    assert broker.handle(parse_subscription("[class,eq,'T']", id="s"), "h1")[-1][1] == Ok("s")
    dup = broker.handle(parse_subscription("[class,eq,'U']", id="s"), "h1")
    assert dup == [("h1", Error("subscription 's' already exists", "s"))]
    assert broker.handle(Unsubscribe("nope"), "h1") == [
        ("h1", Error("no subscription 'nope'", "nope"))
    ]
    assert broker.handle(Unadvertise("nope"), "h1")[0][1].ref == "nope"  # type: ignore[union-attr]
    forged = broker.handle(
        RouteSubscribe(parse_subscription("[class,eq,'T']", id="z"), ("t",)), "h1"
    )
    assert "may not send RouteSubscribe" in forged[0][1].text  # type: ignore[union-attr]
    assert broker.handle(Hello("B", Role.BROKER), "h3")[0][1] == Error(
        "broker B cannot link to itself"
    )
    rows = broker.handle(Query("subscriptions"), "h1")[0][1]
    assert (
        isinstance(rows, QueryResult) and len(rows.rows) == 1 and "[class,eq,'T']" in rows.rows[0]
    )


def _phases(covering: Covering) -> tuple[list[list[tuple[str, tuple[str, ...]]]], int]:
    """A fixed scenario run step by step (quiet in between): deliveries and table size."""
    sim = _star(covering)
    pub = sim.attach("pub", "A")
    subs = [sim.attach(f"s{i}", b) for i, b in enumerate("BCDEE")]
    sim.send(pub, parse_advertisement("[class,eq,'T'],[v,isPresent,0]", id="a"))
    sim.run()
    filters = ["[v,>,0]", "[v,>,5]", "[v,>,5],[v,<,8]", "[v,=,6]", "[v,>,-1]"]
    for client, extra in zip(subs, filters, strict=True):
        sim.send(client, parse_subscription(f"[class,eq,'T'],{extra}", id="s"))
        sim.run()
    size = sum(b.routes.forwarded() for b in sim.brokers.values())
    for step, v in enumerate((6, 3, 9)):
        sim.send(pub, _pub(f"[class,'T'],[v,{v}]", f"p{step}"))
        sim.run()
        sim.send(subs[step], Unsubscribe("s"))  # covering subscriptions leave one by one
        sim.run()
    sim.send(pub, _pub("[class,'T'],[v,6]", "last"))
    sim.run()
    return [_received(c) for c in subs], size


def test_covering_never_changes_what_is_delivered_and_shrinks_tables() -> None:
    off, off_size = _phases(Covering.OFF)
    lazy, lazy_size = _phases(Covering.LAZY)
    active, active_size = _phases(Covering.ACTIVE)
    assert off == lazy == active
    assert off[3] == [("p0", ("s",)), ("last", ("s",))]
    assert lazy_size < off_size and active_size <= lazy_size


def test_unsubscribing_a_covering_subscription_sends_the_covered_one_first() -> None:
    sim = _star(Covering.LAZY)
    pub, sub = sim.attach("pub", "A"), sim.attach("sub", "E")
    sim.send(pub, parse_advertisement("[class,eq,'T'],[v,isPresent,0]", id="a"))
    sim.run()
    sim.send(sub, parse_subscription("[class,eq,'T'],[v,>,0]", id="wide"))
    sim.send(sub, parse_subscription("[class,eq,'T'],[v,>,5]", id="narrow"))
    sim.run()
    assert sim.brokers["E"].routes.forwarded() == 1  # narrow is hidden behind wide
    sim.send(sub, Unsubscribe("wide"))
    sim.send(pub, _pub("[class,'T'],[v,9]", "p1"))  # while the change is in flight
    sim.run()
    assert sim.brokers["E"].routes.forwarded() == 1
    assert _received(sub)[-1] == ("p1", ("narrow",))


def test_advertisement_covering_hides_then_reveals_without_a_gap() -> None:
    sim = _star(Covering.LAZY)
    p1, p2, sub = sim.attach("p1", "A"), sim.attach("p2", "A"), sim.attach("sub", "E")
    sim.send(p1, parse_advertisement("[class,eq,'T'],[v,>,0]", id="wide"))
    sim.run()
    sim.send(p2, parse_advertisement("[class,eq,'T'],[v,>,5]", id="narrow"))
    sim.send(sub, parse_subscription("[class,eq,'T'],[v,>,6]", id="s"))
    sim.run()
    assert len(sim.brokers["E"].trees) == 1  # the covered advertisement never left A
    sim.send(p1, Unadvertise("wide"))
    for i in range(5):
        sim.send(p2, _pub(f"[class,'T'],[v,{7 + i}]", f"n{i}"))
        sim.step(3)
    sim.run()
    assert [pid for pid, _ in _received(sub)] == [f"n{i}" for i in range(5)]
    assert len(sim.brokers["E"].trees) == 1 and not p2.errors


def test_link_failure_withdraws_routes_and_a_restored_link_heals_them() -> None:
    sim = _star(extra=False)
    pub, sub = sim.attach("pub", "A"), sim.attach("sub", "E")
    sim.send(pub, parse_advertisement("[class,eq,'T']", id="a"))
    sim.send(sub, parse_subscription("[class,eq,'T']", id="s"))
    sim.run()
    sim.unlink("A", "B")
    sim.run()
    assert len(sim.brokers["E"].trees) == 0 and len(sim.brokers["B"].routes) == 0
    sim.link("A", "B")
    sim.run()
    sim.send(pub, _pub("[class,'T']", "p1"))
    sim.run()
    assert _received(sub) == [("p1", ("s",))]


def test_a_cycle_routes_around_a_failed_link() -> None:
    sim = _star(extra=True)  # D-E is a second path
    pub, sub = sim.attach("pub", "D"), sim.attach("sub", "E")
    sim.send(pub, parse_advertisement("[class,eq,'T']", id="a"))
    sim.send(sub, parse_subscription("[class,eq,'T']", id="s"))
    sim.run()
    sim.unlink("D", "E")
    sim.run()
    sim.send(pub, _pub("[class,'T']", "p1"))
    sim.run()
    assert _received(sub) == [("p1", ("s",))]  # now through B


@pytest.mark.parametrize(
    ("covering", "seed", "brokers", "clients"),
    [
        (Covering.LAZY, 1, 100, 1000),
        (Covering.OFF, 2, 30, 200),
        (Covering.ACTIVE, 3, 30, 200),
        (Covering.ACTIVE, 4, 12, 60),
    ],
)
def test_random_cyclic_overlay_delivers_exactly_what_the_oracle_says(
    covering: Covering, seed: int, brokers: int, clients: int
) -> None:
    result = overlay.run(brokers, clients, rounds=5, operations=300, seed=seed, covering=covering)
    assert result["violations"] == []
    assert result["links"] > brokers - 1  # cyclic
    assert result["checked"] > 1000 and result["composite_matches"] > 0


def test_client_leaving_cleans_every_table() -> None:
    sim = _star()
    clients = [sim.attach(f"c{i}", b) for i, b in enumerate("ABCDE")]
    for i, c in enumerate(clients):
        sim.send(c, parse_advertisement(f"[class,eq,'T'],[k,=,{i}]", id="a"))
        sim.send(c, parse_subscription("[class,eq,'T'],[k,>,0]", id="s"))
        sim.send(
            c, parse_composite("{[class,eq,'T'],[k,=,$K]} & {[class,eq,'U'],[k,=,$K]}", id="c")
        )
    sim.run()
    assert not sim.tables_empty()
    for c in clients:
        sim.detach(c)
    sim.run()
    assert sim.tables_empty()


def test_notify_lists_every_matching_subscription_of_a_client_once() -> None:
    sim = _star()
    pub, sub = sim.attach("pub", "A"), sim.attach("sub", "C")
    sim.send(pub, parse_advertisement("[class,eq,'T']", id="a"))
    sim.send(sub, parse_subscription("[class,eq,'T']", id="one"))
    sim.send(sub, parse_subscription("[class,eq,'T'],[v,isPresent,0]", id="two"))
    sim.run()
    sim.send(pub, _pub("[class,'T'],[v,1]", "p"))
    sim.run()
    assert len(sub.notifications) == 1
    assert isinstance(sub.notifications[0], Notify)
    assert sorted(sub.notifications[0].subscriptions) == ["one", "two"]


def _counting_covers(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]

    def counted(a: object, b: object) -> bool:
        calls[0] += 1
        return covers(a, b)  # type: ignore[arg-type]

    monkeypatch.setattr(routes_module, "covers", counted)
    return calls


@pytest.mark.parametrize("widest_first", [True, False])
def test_a_client_with_nested_subscriptions_leaves_in_linear_work(
    monkeypatch: pytest.MonkeyPatch, widest_first: bool
) -> None:
    """Each subscription covers the next: a client leaving with them all withdraws them
    without placing each again behind the next (which was quadratic in their number)."""
    n = 400
    sim = _star(extra=False)
    pub, sub = sim.attach("pub", "A"), sim.attach("sub", "E")
    sim.send(pub, parse_advertisement("[class,eq,'T'],[v,isPresent,0]", id="a"))
    sim.run()
    order = range(n) if widest_first else reversed(range(n))
    for i in order:
        sim.send(sub, parse_subscription(f"[class,eq,'T'],[v,>,{i}]", id=f"s{i}"))
    sim.run()
    calls = _counting_covers(monkeypatch)
    sim.detach(sub)
    sim.run()
    assert calls[0] <= 2 * n
    assert all(len(b.routes) == 0 for b in sim.brokers.values())


def test_a_lost_neighbour_with_nested_subscriptions_is_forgotten_in_linear_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """E forwards every one of a client's nested subscriptions (no covering there); B hides
    them behind the widest toward A; the link to E is lost."""
    n = 400
    sim = Simulation(1, covering=Covering.LAZY)
    sim.add_broker("A")
    sim.add_broker("B")
    sim.covering = Covering.OFF
    sim.add_broker("E")
    sim.link("A", "B")
    sim.link("E", "B")
    sim.run()
    pub, sub = sim.attach("pub", "A"), sim.attach("sub", "E")
    sim.send(pub, parse_advertisement("[class,eq,'T'],[v,isPresent,0]", id="a"))
    sim.run()
    for i in range(n):
        sim.send(sub, parse_subscription(f"[class,eq,'T'],[v,>,{i}]", id=f"s{i}"))
    sim.run()
    assert sim.brokers["B"].routes.forwarded() == 1
    calls = _counting_covers(monkeypatch)
    sim.unlink("E", "B")
    sim.run()
    assert calls[0] <= 2 * n
    assert len(sim.brokers["B"].routes) == 0 and len(sim.brokers["A"].routes) == 0


def _chain(covering: Covering = Covering.LAZY) -> Simulation:
    sim = Simulation(1, covering=covering)
    for b in ("B1", "B2", "B3"):
        sim.add_broker(b)
    sim.link("B1", "B2")
    sim.link("B2", "B3")
    sim.run()
    return sim


@pytest.mark.parametrize("covering", [Covering.LAZY, Covering.ACTIVE])
def test_a_route_hidden_behind_a_neighbours_match_is_still_matched_where_it_is_hidden(
    covering: Covering,
) -> None:
    """B3's narrow subscription is hidden at B2 behind B2's wide one: B1 knows only the wide
    one, so B2, told what B1 matched, must try the narrow one itself (and tell B3)."""
    sim = _chain(covering)
    pub, wide, narrow = sim.attach("pub", "B1"), sim.attach("wide", "B2"), sim.attach("n", "B3")
    sim.send(pub, parse_advertisement("[class,eq,'T'],[v,isPresent,0]", id="a"))
    sim.run()
    sim.send(wide, parse_subscription("[class,eq,'T'],[v,>,0]", id="wide"))
    sim.run()
    sim.send(narrow, parse_subscription("[class,eq,'T'],[v,>,5]", id="narrow"))
    sim.run()
    b2 = sim.brokers["B2"].routes
    assert b2.forwarded() == 1  # only the wide one reaches B1
    for i, v in enumerate([9, 3, 7]):
        sim.send(pub, _pub(f"[class,'T'],[v,{v}]", f"p{i}"))
    sim.run()
    assert _received(wide) == [("p0", ("wide",)), ("p1", ("wide",)), ("p2", ("wide",))]
    assert _received(narrow) == [("p0", ("narrow",)), ("p2", ("narrow",))]
    assert b2.trusted == 3 and sim.brokers["B3"].routes.trusted == 2  # nobody matched again


def test_a_hidden_route_placed_again_is_matched_where_it_was_made_until_taken_in() -> None:
    """The wide subscription leaves B3 while a publication travels: B3 forwards the narrow
    one to B2 first, and until B2 has taken it in (its echo is back), B3 does not take B2's
    word for what the publication matches there: the narrow one still gets it."""
    sim = _chain()
    pub, sub = sim.attach("pub", "B1"), sim.attach("sub", "B3")
    sim.send(pub, parse_advertisement("[class,eq,'T'],[v,isPresent,0]", id="a"))
    sim.run()
    sim.send(sub, parse_subscription("[class,eq,'T'],[v,>,0]", id="wide"))
    sim.send(sub, parse_subscription("[class,eq,'T'],[v,>,5]", id="narrow"))
    sim.run()
    for i in range(3):
        sim.send(pub, _pub(f"[class,'T'],[v,{9 + i}]", f"before{i}"))
    sim.send(sub, Unsubscribe("wide"))
    for i in range(3):
        sim.send(pub, _pub(f"[class,'T'],[v,{9 + i}]", f"after{i}"))
    sim.run()
    got = {p for p, _ in _received(sub)}
    assert got == {f"before{i}" for i in range(3)} | {f"after{i}" for i in range(3)}


@pytest.mark.parametrize(
    ("covering", "seed", "brokers", "clients", "extra_links"),
    [
        (Covering.LAZY, 7, 12, 100, 0.0),
        (Covering.ACTIVE, 4, 12, 60, 0.5),
        (Covering.LAZY, 8, 20, 120, 0.5),
    ],
)
def test_brokers_that_route_by_their_neighbours_match_deliver_what_the_oracle_says(
    covering: Covering, seed: int, brokers: int, clients: int, extra_links: float
) -> None:
    """The stock workload (no composite subscriptions): most publications are routed below
    their first broker by what the broker above matched, and every delivery is as the oracle
    says (trees and cyclic overlays, subscriptions coming and going while publications
    travel)."""
    quotes = stock_publications(None)[:5000]
    result = overlay.run(
        brokers,
        clients,
        rounds=3,
        operations=300,
        seed=seed,
        covering=covering,
        extra_links=extra_links,
        quotes=quotes,
    )
    assert result["violations"] == []
    assert result["checked"] > 500
    assert result["trusted"] > result["publications_routed"] / 5
