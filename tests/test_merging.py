"""Merging the subscriptions a broker forwards to a neighbour: smaller tables, the same
deliveries, and publications no subscriber misses while merged filters change."""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass, field

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from padres.broker import Covering, Merging
from padres.cli import main
from padres.client.connection import Client, ClientState
from padres.language.datasets import SAMPLE
from padres.language.parser import parse_advertisement, parse_publication, parse_subscription
from padres.matching.matcher import matches
from padres.model.messages import (
    Filter,
    Publication,
    Subscription,
    Unadvertise,
    Unsubscribe,
)
from padres.model.protocol import Notify, RouteSubscribe, RouteUnsubscribe
from padres.runtime.simulation import SimClient, Simulation
from padres.testing.processes import BrokerProcess
from tests.strategies import scaled
from tests.support import eventually, health

PERFECT = Merging(True)
BOUNDED = "[class,eq,'T'],[x,>=,0],[x,<=,100]"


def _chain(merging: Merging, names: str = "ABE", covering: Covering = Covering.LAZY) -> Simulation:
    """Brokers linked one after another: A - B - E."""
    sim = Simulation(1, covering=covering, merging=merging)
    for name in names:
        sim.add_broker(name)
    for a, b in itertools.pairwise(names):
        sim.link(a, b)
    sim.run()
    return sim


def _sub(text: str, ident: str) -> Subscription:
    return parse_subscription(f"[class,eq,'T'],{text}", id=ident)


def _pub(x: float, ident: str) -> Publication:
    return parse_publication(f"[class,'T'],[x,{x}]", id=ident)


def _got(client: SimClient) -> list[tuple[str, tuple[str, ...]]]:
    return [(n.publication.id, n.subscriptions) for n in client.notifications]


def _forwarded_filters(sim: Simulation, at: str, source: str) -> list[Filter]:
    """The filters broker ``at`` holds from neighbour ``source``."""
    return [r.sub.filter for r in sim.brokers[at].routes if source in r.arrivals]


def _touching(merging: Merging) -> tuple[Simulation, SimClient, SimClient]:
    sim = _chain(merging)
    pub, sub = sim.attach("pub", "A"), sim.attach("sub", "E")
    sim.send(pub, parse_advertisement(BOUNDED, id="a"))
    sim.run()
    sim.send(sub, _sub("[x,>=,0],[x,<,5]", "low"))
    sim.send(sub, _sub("[x,>=,5],[x,<=,9]", "high"))
    sim.run()
    return sim, pub, sub


def test_touching_ranges_go_to_the_neighbour_as_one_filter_and_deliveries_stay_exact() -> None:
    merged, pub, sub = _touching(PERFECT)
    assert sub.acks == ["low", "high"]
    assert merged.brokers["E"].routes.forwarded() == 1
    assert _forwarded_filters(merged, "B", "E") == [
        parse_subscription("[class,eq,'T'],[x,>=,0],[x,<=,9]", id="m").filter
    ]
    assert merged.brokers["B"].routes.forwarded() == 1  # and B sends A that one alone
    stats = merged.brokers["E"].routes.mergers.statistics()
    assert (stats.members, stats.outputs, stats.merged, stats.inexact) == (2, 1, 1, 0)
    unmerged, upub, usub = _touching(Merging())
    assert unmerged.brokers["E"].routes.forwarded() == 2
    for sim, p in ((merged, pub), (unmerged, upub)):
        for i, x in enumerate((-1, 0, 4.5, 5, 9, 9.5)):
            sim.send(p, _pub(x, f"p{i}"))
        sim.run()
    assert (
        _got(sub)
        == _got(usub)
        == [("p1", ("low",)), ("p2", ("low",)), ("p3", ("high",)), ("p4", ("high",))]
    )
    assert merged.brokers["E"].routes.unwanted == 0  # a perfect merge sends nothing extra


def test_a_member_leaving_sends_what_stays_before_withdrawing_the_merged_filter() -> None:
    sim, pub, sub = _touching(PERFECT)
    [route] = [r for r in sim.brokers["B"].routes if "E" in r.arrivals]
    sim.send(sub, Unsubscribe("low"))
    while not sim.queued("E", "B"):  # E handles the unsubscribe, and nothing else moves
        sim.step(1)
    sent = sim.queued("E", "B")
    assert [type(m) for m in sent] == [RouteSubscribe, RouteUnsubscribe]
    assert isinstance(sent[0], RouteSubscribe) and isinstance(sent[1], RouteUnsubscribe)
    assert sent[0].subscription.filter == _sub("[x,>=,5],[x,<=,9]", "h").filter
    assert sent[1].subscription_id == route.id
    # Publications for what stays, sent while the change travels, all arrive.
    for i in range(8):
        sim.send(pub, _pub(7, f"q{i}"))
        sim.step(2)
    sim.run()
    assert [pid for pid, _ in _got(sub)] == [f"q{i}" for i in range(8)]
    assert _forwarded_filters(sim, "B", "E") == [_sub("[x,>=,5],[x,<=,9]", "h").filter]
    sim.send(sub, Unsubscribe("high"))
    sim.detach(pub)
    sim.run()
    assert sim.tables_empty()


def _gap(merging: Merging) -> tuple[Simulation, SimClient, SimClient]:
    sim = _chain(merging)
    pub, sub = sim.attach("pub", "A"), sim.attach("sub", "E")
    sim.send(pub, parse_advertisement(BOUNDED, id="a"))
    sim.run()
    sim.send(sub, _sub("[x,>=,0],[x,<=,10]", "low"))
    sim.send(sub, _sub("[x,>=,12],[x,<=,20]", "high"))
    sim.run()
    for i, x in enumerate((11, 15, 30)):
        sim.send(pub, _pub(x, f"p{i}"))
    sim.run()
    return sim, pub, sub


def test_an_imperfect_merge_within_its_bound_costs_traffic_never_a_wrong_delivery() -> None:
    """[0,10] and [12,20] of an advertised [0,100]: their hull [0,20] is an estimated 10%
    false positives, merged under a bound of 20%, not under 5%."""
    sim, _, sub = _gap(Merging(True, 0.2))
    assert _forwarded_filters(sim, "B", "E") == [_sub("[x,>=,0],[x,<=,20]", "m").filter]
    assert sim.brokers["E"].routes.mergers.statistics().inexact == 1
    assert _got(sub) == [("p1", ("high",))]  # 11 reached E, and went no further
    assert [p.id for p in sim.seen["E"]] == ["p0", "p1"]
    assert sim.brokers["E"].routes.unwanted == 1
    strict, _, strict_sub = _gap(Merging(True, 0.05))
    assert len(_forwarded_filters(strict, "B", "E")) == 2
    assert _got(strict_sub) == [("p1", ("high",))]
    assert [p.id for p in strict.seen["E"]] == ["p1"]


def test_only_subscriptions_forwarded_for_the_same_trees_merge() -> None:
    """Two publishers of T behind B: E's two subscriptions overlap only one advertisement
    each, so they go up different trees and merged they would bring each tree's
    publications to both."""
    sim = _chain(PERFECT, "ABE")
    sim.add_broker("C")
    sim.link("C", "B")
    sim.run()
    pa, pc, sub = sim.attach("pa", "A"), sim.attach("pc", "C"), sim.attach("sub", "E")
    sim.send(pa, parse_advertisement("[class,eq,'T'],[x,>=,0],[x,<=,10]", id="a"))
    sim.send(pc, parse_advertisement("[class,eq,'T'],[x,>,10],[x,<=,20]", id="a"))
    sim.send(sub, _sub("[x,>=,0],[x,<,8]", "left"))
    sim.send(sub, _sub("[x,>=,8],[x,<=,10]", "middle"))
    sim.send(sub, _sub("[x,>,10],[x,<=,20]", "right"))
    sim.run()
    held = _forwarded_filters(sim, "B", "E")
    assert sorted(map(str, held)) == sorted(
        map(str, [_sub("[x,>=,0],[x,<=,10]", "m").filter, _sub("[x,>,10],[x,<=,20]", "r").filter])
    )
    sim.send(pa, _pub(9, "p1"))
    sim.send(pc, _pub(15, "p2"))
    sim.run()
    assert sorted(_got(sub)) == [("p1", ("middle",)), ("p2", ("right",))]
    assert sim.brokers["E"].routes.unwanted == 0


def test_advertisements_made_at_one_broker_flood_merged_and_unmerge_without_a_gap() -> None:
    sim = _chain(PERFECT)
    p1, p2, sub = sim.attach("p1", "A"), sim.attach("p2", "A"), sim.attach("sub", "E")
    sim.send(p1, parse_advertisement("[class,eq,'T'],[x,>=,0],[x,<,5]", id="a"))
    sim.run()
    sim.send(p2, parse_advertisement("[class,eq,'T'],[x,>=,5],[x,<=,9]", id="a"))
    sim.send(sub, _sub("[x,>,3]", "s"))
    sim.run()
    assert p2.acks == ["a"]
    [tree] = list(sim.brokers["E"].trees)
    assert [a.filter for a in tree.advertisements.values()] == [
        parse_advertisement("[class,eq,'T'],[x,>=,0],[x,<=,9]", id="m").filter
    ]
    sim.send(p1, _pub(4, "p1"))
    sim.send(p2, _pub(8, "p2"))
    sim.run()
    sim.send(p1, Unadvertise("a"))
    for i in range(6):  # while the merged advertisement is replaced
        sim.send(p2, _pub(6, f"q{i}"))
        sim.step(3)
    sim.run()
    assert sorted(pid for pid, _ in _got(sub)) == ["p1", "p2", *(f"q{i}" for i in range(6))]
    [tree] = list(sim.brokers["E"].trees)
    assert [a.filter for a in tree.advertisements.values()] == [
        parse_advertisement("[class,eq,'T'],[x,>=,5],[x,<=,9]", id="m").filter
    ]
    assert not p1.errors and not p2.errors
    for client in (p2, sub, p1):
        sim.detach(client)
    sim.run()
    assert sim.tables_empty()


@pytest.mark.parametrize("covering", list(Covering))
def test_a_broker_crash_and_a_lost_link_heal_with_merging_on(covering: Covering) -> None:
    """Fault: the middle broker of A - B - E dies and comes back (its routing state is lost,
    it holds no other); then the link A - B fails and returns. What E's client subscribed to
    reaches it again, exactly, and nothing is left behind once every client has left."""
    sim = _chain(PERFECT, covering=covering)
    pub, sub = sim.attach("pub", "A"), sim.attach("sub", "E")
    sim.send(pub, parse_advertisement(BOUNDED, id="a"))
    for i, (lo, hi) in enumerate(((0, 5), (5, 9), (9, 12), (2, 3))):
        sim.send(sub, _sub(f"[x,>=,{lo}],[x,<=,{hi}]", f"s{i}"))
    sim.run()
    assert len(_forwarded_filters(sim, "B", "E")) == 1
    sim.crash("B")
    sim.run()
    assert len(sim.brokers["A"].routes) == 0  # withdrawn with the link
    sim.add_broker("B")
    sim.link("A", "B")
    sim.link("B", "E")
    sim.run()
    assert len(_forwarded_filters(sim, "B", "E")) == 1
    sim.unlink("A", "B")
    sim.run()
    sim.link("A", "B")
    sim.run()
    for i, x in enumerate((1, 2.5, 7, 12, 13)):
        sim.send(pub, _pub(x, f"p{i}"))
    sim.run()
    want = {"p0": {"s0"}, "p1": {"s0", "s3"}, "p2": {"s1"}, "p3": {"s2"}}
    assert {pid: set(sids) for pid, sids in _got(sub)} == want
    sim.detach(sub)
    sim.detach(pub)
    sim.run()
    assert sim.tables_empty()


# -- random overlays with churn, against an oracle -------------------------------------------


@dataclass
class _Oracle:
    """What each subscriber must and may receive (see ``_check``)."""

    filters: dict[str, Filter] = field(default_factory=dict)
    """Subscription id -> its filter (every one ever made: ids are not used twice)."""
    owner: dict[str, str] = field(default_factory=dict)
    live: set[str] = field(default_factory=set)
    """Subscriptions made and not withdrawn."""
    gone: set[str] = field(default_factory=set)
    """Subscriptions whose withdrawal was acknowledged."""
    owed: dict[str, set[str]] = field(default_factory=dict)
    """Publication id -> the subscriptions acknowledged, and not withdrawn, when it was sent."""
    forbidden: dict[str, set[str]] = field(default_factory=dict)
    """Publication id -> the subscriptions whose withdrawal was acknowledged before."""
    advertised: dict[str, Filter] = field(default_factory=dict)
    """The churning publisher's advertisements not withdrawn."""
    carried: dict[str, set[str]] = field(default_factory=dict)
    """Publication id of the churning publisher -> its advertisements, acknowledged and not
    withdrawn, that it conforms to: when all are withdrawn, it is owed to nobody."""


@dataclass(frozen=True)
class _Plan:
    brokers: int
    edges: list[tuple[int, int]]
    publishers: list[int]
    subscribers: list[int]
    ops: list[tuple[object, ...]]
    covering: Covering
    imperfect: float
    seed: int


@st.composite
def _plans(draw: st.DrawFn) -> _Plan:
    brokers = draw(st.integers(2, 7))
    edges = {(draw(st.integers(0, i - 1)), i) for i in range(1, brokers)}
    for _ in range(draw(st.integers(0, brokers))):
        a, b = draw(st.integers(0, brokers - 1)), draw(st.integers(0, brokers - 1))
        if a < b:
            edges.add((a, b))
    bounds = st.sampled_from([0, 2, 2.5, 5, 7, 10, 12, 15, 20])
    values = st.sampled_from([0, 1, 2.5, 5, 6, 10, 11, 12, 15, 19.5, 20])
    sub = st.tuples(st.just("sub"), st.integers(0, 3), bounds, bounds, st.booleans(), st.booleans())
    unsub = st.tuples(st.just("unsub"), st.integers(0, 1000))
    pub = st.tuples(st.just("pub"), st.integers(0, 2), values)
    adv = st.tuples(st.just("adv"), bounds, bounds)
    unadv = st.tuples(st.just("unadv"), st.integers(0, 1000))
    step = st.tuples(st.just("step"), st.integers(0, 40))
    op = st.one_of(sub, sub, sub, unsub, pub, pub, adv, unadv, step)
    return _Plan(
        brokers,
        sorted(edges),
        [draw(st.integers(0, brokers - 1)) for _ in range(3)],
        [draw(st.integers(0, brokers - 1)) for _ in range(4)],
        draw(st.lists(op, min_size=30, max_size=80)),
        draw(st.sampled_from(list(Covering))),
        draw(st.sampled_from([0.0, 0.0, 0.3, 0.9])),
        draw(st.integers(0, 1000)),
    )


@settings(
    max_examples=scaled(60),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(_plans())
def test_random_overlays_with_churn_deliver_exactly_what_the_oracle_says(plan: _Plan) -> None:
    """Random cyclic overlays; three publishers of ranges of x, one advertising bounds, one
    not, one making and withdrawing advertisements of ranges (merged at its broker);
    subscribers making and withdrawing ranges that touch, overlap or leave gaps, while
    publications travel. No publication reaches a client twice or for a subscription it
    does not match; every one reaches the subscriptions acknowledged before it was sent and
    not withdrawn since (sent under an advertisement acknowledged and not withdrawn since);
    none reaches a subscription whose withdrawal was acknowledged before it was sent; with
    perfect merging alone, no publication sent once the overlay is quiet crosses a link for
    nothing; and every table is empty once the clients have left."""
    merging = Merging(True, plan.imperfect)
    sim = Simulation(plan.seed, covering=plan.covering, merging=merging)
    names = [f"B{i}" for i in range(plan.brokers)]
    for name in names:
        sim.add_broker(name)
    for a, b in plan.edges:
        sim.link(names[a], names[b])
    sim.run()
    publishers = [sim.attach(f"p{i}", names[b]) for i, b in enumerate(plan.publishers)]
    subscribers = [sim.attach(f"c{i}", names[b]) for i, b in enumerate(plan.subscribers)]
    churning = publishers[2]
    sim.send(publishers[0], parse_advertisement(BOUNDED, id="a"))
    sim.send(publishers[1], parse_advertisement("[class,eq,'T'],[x,isPresent,0]", id="a"))
    sim.run()
    oracle = _Oracle()
    count = 0

    def publish(publisher: SimClient, x: float) -> None:
        nonlocal count
        pub = _pub(x, f"q{count + 1}")
        if publisher is churning:
            carried = {
                aid
                for aid, flt in oracle.advertised.items()
                if aid in churning.acks and matches(flt, pub)
            }
            if not any(matches(flt, pub) for flt in oracle.advertised.values()):
                return  # it would be refused: it conforms to no advertisement
            oracle.carried[pub.id] = carried
        count += 1
        oracle.owed[pub.id] = {
            sid
            for sid in oracle.live
            if sid in sim.clients[oracle.owner[sid]].acks and matches(oracle.filters[sid], pub)
        }
        oracle.forbidden[pub.id] = set(oracle.gone)
        sim.send(publisher, pub)

    withdrawing: dict[str, SimClient] = {}
    for op in plan.ops:
        for sid, client in list(withdrawing.items()):
            if client.acks.count(sid) == 2:  # the subscription's ok, then the withdrawal's
                oracle.gone.add(sid)
                del withdrawing[sid]
        match op:
            case ("sub", int(who), lo, hi, bool(lo_open), bool(hi_open)):
                lo, hi = min(lo, hi), max(lo, hi)  # type: ignore[call-overload]
                if lo == hi and (lo_open or hi_open):
                    continue
                count += 1
                sid = f"s{count}"
                text = f"[x,{'>' if lo_open else '>='},{lo}],[x,{'<' if hi_open else '<='},{hi}]"
                sub = _sub(text, sid)
                oracle.filters[sid], oracle.owner[sid] = sub.filter, subscribers[who].name
                oracle.live.add(sid)
                sim.send(subscribers[who], sub)
            case ("unsub", int(index)) if oracle.live:
                sid = sorted(oracle.live)[index % len(oracle.live)]
                oracle.live.discard(sid)
                for owed in oracle.owed.values():
                    owed.discard(sid)  # in flight when withdrawn: it may come or not
                withdrawing[sid] = client = sim.clients[oracle.owner[sid]]
                sim.send(client, Unsubscribe(sid))
            case ("adv", lo, hi):
                count += 1
                lo, hi = min(lo, hi), max(lo, hi)  # type: ignore[call-overload]
                adv = parse_advertisement(f"[class,eq,'T'],[x,>=,{lo}],[x,<=,{hi}]", id=f"a{count}")
                oracle.advertised[adv.id] = adv.filter
                sim.send(churning, adv)
            case ("unadv", int(index)) if oracle.advertised:
                aid = sorted(oracle.advertised)[index % len(oracle.advertised)]
                del oracle.advertised[aid]
                for carried in oracle.carried.values():
                    carried.discard(aid)
                sim.send(churning, Unadvertise(aid))
            case ("pub", int(which), x):
                publish(publishers[which], x)  # type: ignore[arg-type]
            case ("step", int(n)):
                sim.step(n)
    sim.run()
    quiet = sum(b.routes.unwanted for b in sim.brokers.values())
    for x in (0, 2.5, 5, 7.5, 10, 12, 15, 20):
        for publisher in publishers:
            publish(publisher, x)
    sim.run()
    if merging.imperfect == 0.0:
        assert sum(b.routes.unwanted for b in sim.brokers.values()) == quiet
    for pid, carried in oracle.carried.items():
        if not carried:
            oracle.owed[pid] = set()  # its advertisements were withdrawn: it may come or not
    assert not churning.errors
    _check(oracle, subscribers)
    for client in [*subscribers, *publishers]:
        sim.detach(client)
    sim.run()
    assert sim.tables_empty()


def _check(oracle: _Oracle, subscribers: list[SimClient]) -> None:
    got: dict[tuple[str, str], set[str]] = {}
    for client in subscribers:
        seen: set[str] = set()
        for note in client.notifications:
            assert isinstance(note, Notify)
            pid = note.publication.id
            assert pid not in seen, f"{client.name} received {pid} twice"
            seen.add(pid)
            for sid in note.subscriptions:
                assert oracle.owner[sid] == client.name
                assert matches(oracle.filters[sid], note.publication), (pid, sid)
                assert sid not in oracle.forbidden[pid], f"{pid} for {sid}, withdrawn before"
                got.setdefault((client.name, pid), set()).add(sid)
    for pid, owed in oracle.owed.items():
        for sid in owed:
            assert sid in got.get((oracle.owner[sid], pid), set()), f"{sid} missed {pid}"


# -- settings ----------------------------------------------------------------------------------


def test_merging_is_a_broker_setting_of_the_command_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert (
        main(["broker", "--id", "x", "--merging", "--merge-imperfect", "0.05", "--print-config"])
        == 0
    )
    shown = capsys.readouterr().out
    assert "merging = true" in shown and "merge-imperfect = 0.05" in shown
    assert main(["broker", "--id", "x", "--merge-imperfect", "0.05"]) == 1
    assert "imperfect merging needs merging on" in capsys.readouterr().err
    assert main(["broker", "--id", "x", "--merging", "--merge-imperfect", "1.5"]) == 1
    assert "rate from 0" in capsys.readouterr().err


# -- real processes ----------------------------------------------------------------------------


async def test_merged_routes_come_back_after_the_upstream_broker_is_killed(
    brokers: dict[str, BrokerProcess],
) -> None:
    """Fault, with real processes started with ``--merging``: A (the publisher's broker) is
    killed and started again on its port; E dials it again and sends its merged filter
    anew. Lost: the publications not made while A was down (the publisher could not send
    them); nothing else."""
    options = ["--merging"]
    a = BrokerProcess("A", options=options)
    brokers["A"] = a
    url_a = a.start()
    e = BrokerProcess("E", neighbours=[url_a], options=options)
    brokers["E"] = e
    url_e = e.start()
    got: list[tuple[str, tuple[str, ...]]] = []

    def inbox(delivery: object) -> None:
        if isinstance(delivery, Notify):
            got.append((delivery.publication.id, delivery.subscriptions))

    async with contextlib.AsyncExitStack() as stack:
        pub = await stack.enter_async_context(Client(url_a, "pub", reconnect=True))
        sub = await stack.enter_async_context(Client(url_e, "sub"))
        await pub.advertise(BOUNDED)
        await sub.subscribe("[class,eq,'T'],[x,>=,0],[x,<,5]", inbox, id="low")
        await sub.subscribe("[class,eq,'T'],[x,>=,5],[x,<=,9]", inbox, id="high")
        rows = await pub.query("subscriptions")
        assert len(rows) == 1 and "[x,>=,0],[x,<=,9]" in rows[0]
        assert health(url_e)["merged"]["merged"] == 1
        await pub.publish_many([_pub(3, "b1"), _pub(7, "b2"), _pub(11, "b3")])
        await eventually(lambda: len(got) == 2)
        a.kill()
        a.start()  # same port: E and the publisher dial it again
        await eventually(lambda: pub.state is ClientState.OPEN, timeout=15)
        # E's merged filter is back once the advertisement made again has reached E
        await eventually(lambda: health(url_a)["subscriptions"] == 1, timeout=20)
        await pub.publish_many([_pub(4, "a1"), _pub(9, "a2"), _pub(9.5, "a3")])
        await eventually(lambda: len(got) == 4)
        await sub.unsubscribe("low")
        await eventually(lambda: health(url_a)["subscriptions"] == 1)
        await pub.publish_many([_pub(1, "c1"), _pub(6, "c2")])
        await eventually(lambda: len(got) == 5)
    assert got == [
        ("b1", ("low",)),
        ("b2", ("high",)),
        ("a1", ("low",)),
        ("a2", ("high",)),
        ("c2", ("high",)),
    ]


def test_the_overlay_benchmark_runs_both_ways_side_by_side(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["bench", "overlay", "--brokers", "8", "--clients", "40", "--rounds", "2"]
    argv += ["--operations", "80", "--merging", "both", "--workload", "stock", "--json"]
    assert main([*argv, "--data", str(SAMPLE), "--merge-imperfect", "0.05"]) == 0
    result = orjson.loads(capsys.readouterr().out)
    off, on = result["unmerged"], result["merged"]
    assert off["merging"] == "off" and on["merging"] == "on" and on["merge_imperfect"] == 0.05
    assert off["violations"] == on["violations"] == []
    assert off["published"] == on["published"] > 0  # the same operations
    assert off["merged_at_end_of_rounds"] == 0
    assert on["forwarded_at_end_of_rounds"] <= on["forwarded_before_merging"]
    assert main(["bench", "overlay", "--brokers", "4", "--merge-imperfect", "0.1"]) == 1
    assert "imperfect merging needs merging on" in capsys.readouterr().err
