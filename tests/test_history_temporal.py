"""Sequences, windows and absences over the past (historic composites) and across the switch
to the live stream (hybrid ones), in simulated overlays: each equal to the reference
evaluation of the publications the databases stored (``over_range``)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from padres.broker.history import composite_watch
from padres.broker.publishing import GRACE
from padres.broker.replay import Feed
from padres.language.parser import parse_advertisement, parse_composite
from padres.matching.matcher import CompositeMatch
from padres.matching.reference_temporal import over_range
from padres.model.messages import CompositeSubscription, Publication, Unsubscribe
from padres.model.protocol import CompositeNotify, ReplayDone
from padres.runtime.simulation import SimClient, Simulation
from rete.operators import Value
from tests.sim_archive import SimArchive

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
PAST = NOW - timedelta(days=2)
STAR = [("A", "B"), ("C", "B"), ("D", "B"), ("E", "B"), ("A", "C"), ("D", "E")]
TREE = [("A", "B"), ("C", "B"), ("D", "B"), ("E", "B")]
"""One path from the shop at A to the subscriber at E: the live stream comes in order."""

PATTERNS = [
    "{[class,eq,'A'],[k,eq,$K]} ; {[class,eq,'B'],[k,eq,$K]} within 10s",
    "{[class,eq,'A']} ;; {[class,eq,'B']} within 8s",
    "{[class,eq,'A'],[k,eq,$K]} ; !{[class,eq,'B'],[k,eq,$K]} within 6s",
    "{[class,eq,'A']} ; !{[class,eq,'C']} ; {[class,eq,'B']} within 10s",
    "{[class,eq,'A']} & {[class,eq,'C']} within 4s late 2s",
    "{[class,eq,'A']} ; {[class,eq,'B']} within 3 events consume first",
    "{[class,eq,'A'],[k,eq,$K]} ; {[class,eq,'B'],[k,eq,$K]} ; {[class,eq,'C']} within 20s "
    "consume last",
    "{[class,eq,'A'],[k,eq,$K]} ; !{[class,eq,'B'],[k,eq,$K]} within 3 events",
]

Key = tuple[tuple[str, ...], tuple[tuple[str, Value], ...]]


def _sim(seed: int, links: list[tuple[str, str]] = STAR) -> Simulation:
    sim = Simulation(seed, clock=NOW.timestamp())
    for a, b in links:
        for x in (a, b):
            if x not in sim.brokers:
                sim.add_broker(x)
        sim.link(a, b)
    sim.run()
    return sim


def _databases(sim: Simulation) -> tuple[SimArchive, SimArchive]:
    """DB1 at C stores A and B, DB2 at D stores B and C: B twice."""
    db1 = SimArchive.attach(sim, "db1", "C")
    db1.store("[class,eq,'A']", "a")
    db1.store("[class,eq,'B']", "b")
    db2 = SimArchive.attach(sim, "db2", "D")
    db2.store("[class,eq,'B']", "b")
    db2.store("[class,eq,'C']", "c")
    db2.batch = 2
    return db1, db2


def _shop(sim: Simulation) -> SimClient:
    shop = sim.attach("shop", "A")
    for cls in "ABC":
        sim.send(shop, parse_advertisement(f"[class,eq,'{cls}']", id=f"a{cls}"))
    sim.run()
    return shop


def _stream(rng: random.Random, n: int, start: datetime, prefix: str) -> list[Publication]:
    """``n`` publications of classes A, B and C, each of key k1 or k2, from ``start`` on,
    0.5 to 3 s apart (no two at the same time)."""
    out = []
    at = start
    for i in range(n):
        at += timedelta(seconds=rng.choice([0.5, 1.0, 1.5, 2.0, 3.0]))
        attrs: dict[str, Value] = {"class": rng.choice("ABC"), "k": rng.choice(["k1", "k2"])}
        out.append(Publication(f"{prefix}{i}", attrs, at))
    return out


def _window(start: datetime, end: datetime | None = None) -> str:
    text = f"[time,>=,'{start.isoformat()}']"
    return text + (f",[time,<,'{end.isoformat()}']" if end else "")


def _ranged(pattern: str, window: str) -> str:
    """``pattern`` with the time predicates ``window`` in every part."""
    return pattern.replace("}", f",{window}}}")


def _key(pubs: tuple[Publication, ...], bindings: Mapping[str, Value]) -> Key:
    return tuple(p.id for p in pubs), tuple(sorted(bindings.items()))


def _got(client: SimClient, sid: str) -> list[Key]:
    got = (m for m in client.composites if m.subscription == sid)
    return sorted(_key(m.publications, m.bindings) for m in got)


def _ids(client: SimClient, sid: str) -> list[list[str]]:
    """The publications of ``sid``'s matches, in the order they came."""
    return [[p.id for p in m.publications] for m in client.composites if m.subscription == sid]


def _want(matches: list[CompositeMatch]) -> list[Key]:
    return sorted(_key(m.publications, m.bindings) for m in matches)


def _stored(*dbs: SimArchive) -> list[Publication]:
    """What the databases stored, each publication once."""
    found: dict[tuple[str, str], Publication] = {}
    for db in dbs:
        found.update(db.stored)
    return list(found.values())


def _done(client: SimClient) -> dict[str, ReplayDone]:
    return {m.subscription: m for m in client.other if isinstance(m, ReplayDone)}


def test_historic_sequences_equal_the_reference_over_what_the_databases_stored() -> None:
    """Every pattern over a range of a stored stream, the parts answered by two databases
    (one of them storing a part twice) in different orders and batch sizes: the same matches
    as the reference evaluation of the stored publications, the windows still open at the
    range's end not reported."""
    for seed in range(4):
        rng = random.Random(seed)
        sim = _sim(seed)
        db1, db2 = _databases(sim)
        shop = _shop(sim)
        pubs = _stream(rng, 45, PAST, "p")
        for pub in pubs:
            sim.send(shop, pub)
        sim.run()
        assert len(_stored(db1, db2)) == len(pubs)
        manager = sim.attach("manager", "E")
        window = _window(pubs[4].timestamp, pubs[-6].timestamp)
        subs: dict[str, CompositeSubscription] = {}
        for i, pattern in enumerate(PATTERNS):
            subs[f"c{i}"] = parse_composite(_ranged(pattern, window), id=f"c{i}")
            sim.send(manager, subs[f"c{i}"])
        sim.run()
        assert manager.errors == [], seed
        first, second = (db1, db2) if seed % 2 else (db2, db1)
        first.answer()  # one database answers in full before the other starts
        sim.run()
        assert manager.composites == [], seed  # held: the other could still send earlier ones
        second.answer()
        sim.run()
        done = _done(manager)
        for sid, sub in subs.items():
            want = _want(over_range(sub, _stored(db1, db2)))
            assert _got(manager, sid) == want, (seed, sid)
            assert done[sid] == ReplayDone(sid, len(want), ("db1@C", "db2@D")), (seed, sid)
        assert sum(bool(_got(manager, sid)) for sid in subs) >= 6, seed  # not all empty
        assert sim.brokers["E"].history.is_empty(), seed  # over with their past


def test_an_absence_closing_within_the_range_fires_one_open_at_its_end_does_not() -> None:
    sim = _sim(1)
    db1, db2 = _databases(sim)
    shop = _shop(sim)
    at = [PAST + timedelta(seconds=s) for s in (1, 2, 4, 30, 36)]
    for i, (cls, key) in enumerate([("A", "k1"), ("A", "k2"), ("B", "k2"), ("A", "k1")]):
        sim.send(shop, Publication(f"p{i}", {"class": cls, "k": key}, at[i]))
    sim.run()
    manager = sim.attach("manager", "E")
    absence = "{[class,eq,'A'],[k,eq,$K]} ; !{[class,eq,'B'],[k,eq,$K]} within 5s"
    for sid, end in [("short", at[3] + timedelta(seconds=4)), ("long", at[4])]:
        text = _ranged(absence, _window(PAST, end))
        sim.send(manager, parse_composite(text, id=sid))
    sim.run()
    db1.answer()
    db2.answer()
    sim.run()
    # p0 (k1, 1 s) has no B within 5 s: its window closes at 6 s, within both ranges. p1
    # (k2) is followed by p2. p3 (30 s) closes at 35 s: after the short range, within the long.
    assert _ids(manager, "short") == [["p0"]]
    assert _ids(manager, "long") == [["p0"], ["p3"]]
    assert _done(manager)["short"].count == 1 and _done(manager)["long"].count == 2


def test_a_hybrid_range_ending_ahead_never_closes_a_window_open_at_its_end() -> None:
    """As for the past: the broker's clock passing the end of the range closes the windows
    that close within it, not those still open at its end."""
    sim = _sim(1, TREE)
    db1, db2 = _databases(sim)
    shop = _shop(sim)
    sim.send(shop, Publication("p0", {"class": "A", "k": "k1"}, NOW - timedelta(seconds=30)))
    sim.run()
    manager = sim.attach("manager", "E")
    absence = "{[class,eq,'A'],[k,eq,$K]} ; !{[class,eq,'B'],[k,eq,$K]} within 10s"
    sub = parse_composite(_ranged(absence, _window(PAST, NOW + timedelta(seconds=20))), id="h")
    sim.send(manager, sub)
    sim.run()
    db1.answer()
    db2.answer()
    sim.run()
    for i, second in enumerate([5, 15]):
        pub = Publication(f"a{i}", {"class": "A", "k": "k1"}, NOW + timedelta(seconds=second))
        sim.send(shop, pub)
    sim.run()
    _wait(sim, 60)
    got = [[p.id for p in m.publications] for m in manager.composites]
    assert got == [["p0"], ["a0"]]  # a1's window closes 5 s after the end
    assert got == [[p.id for p in m.publications] for m in over_range(sub, _stored(db1, db2))]


def _publish(sim: Simulation, shop: SimClient, pubs: list[Publication], steps: int) -> None:
    """Publish ``pubs``, letting ``steps`` messages through after each."""
    for pub in pubs:
        sim.send(shop, pub)
        sim.step(steps)


def _wait(sim: Simulation, seconds: int) -> None:
    for _ in range(seconds):
        sim.tick(1)
        sim.run()


def test_hybrid_sequences_match_across_the_switch_once_each() -> None:
    """The past stored, the subscriptions made, live publications while the request is on its
    way, the databases answering in the middle of the live stream: every match once, those
    whose first publications are in the past and last live among them, equal to the
    reference over everything the databases stored. The live stream comes in timestamp order
    (one path), so that with no lateness nothing is late, at the switch either."""
    for seed in range(4):
        rng = random.Random(seed)
        sim = _sim(seed, TREE)
        db1, db2 = _databases(sim)
        shop = _shop(sim)
        past = _stream(rng, 25, NOW, "past")
        shift = past[-1].timestamp - NOW + timedelta(seconds=1)  # the last, a second before
        past = [Publication(p.id, p.attributes, p.timestamp - shift) for p in past]
        past.append(Publication("past-a", {"class": "A", "k": "k1"}, NOW - timedelta(seconds=0.5)))
        _publish(sim, shop, past, 0)
        sim.run()
        seam = datetime.fromtimestamp(sim.clock, UTC)
        manager = sim.attach("manager", "E")
        subs = {
            f"h{i}": parse_composite(_ranged(p, _window(NOW - timedelta(minutes=5))), id=f"h{i}")
            for i, p in enumerate(PATTERNS)
        }
        for sub in subs.values():
            sim.send(manager, sub)
        live = _stream(rng, 30, seam + timedelta(seconds=1), "live")
        live.insert(0, Publication("live-b", {"class": "B", "k": "k1"}, seam))
        _publish(sim, shop, live[:8], 3)  # while the subscriptions are on their way
        sim.run()
        _publish(sim, shop, live[8:14], 2)
        db1.answer()  # the past ends in the middle of the live stream
        _publish(sim, shop, live[14:20], 2)
        db2.answer()
        _publish(sim, shop, live[20:], 2)
        sim.run()
        _wait(sim, 100)  # every window closes by the broker's clock
        assert manager.errors == [], seed
        until = datetime.fromtimestamp(sim.clock - GRACE, UTC)
        stored = _stored(db1, db2)
        assert len(stored) == len(past) + len(live), seed
        straddling = 0
        for watch in sim.brokers["E"].history.watches.values():
            assert watch.network is not None and watch.network.late == 0, seed
        for sid, sub in subs.items():
            got = _got(manager, sid)
            assert got == _want(over_range(sub, stored, until)), (seed, sid)
            assert len(set(got)) == len(got), (seed, sid)
            straddling += sum(ids[0].startswith("past") and "live" in ids[-1] for ids, _ in got)
        assert straddling > 0, seed
        for sid in subs:
            sim.send(manager, Unsubscribe(sid))
        for client in list(sim.clients.values()):
            sim.detach(client)
        sim.run()
        assert sim.tables_empty(), seed


def _pub(pid: str, cls: str, at: datetime) -> Publication:
    return Publication(pid, {"class": cls}, at, "shop")


def test_at_the_switch_the_end_of_the_past_and_the_held_live_stream_go_in_time_order() -> None:
    """A database had B2 and A3 (stamped after the subscription was made) when it answered,
    but not A1, stamped before them and held from the live stream meanwhile: A1 is still taken
    before B2 (with no lateness), although A's past went beyond B2 before A1 came, and B2's
    live copy is not taken twice."""
    seam = NOW
    text = _ranged("{[class,eq,'A']} ; {[class,eq,'B']} within 10s", _window(NOW - timedelta(1)))
    sub = parse_composite(text, id="s")
    watch = composite_watch("client", sub, None, seam.timestamp())
    a_feed = watch.feeds["s:0"] = Feed(sub.filters[0].window, ["db"], live=True)
    b_feed = watch.feeds["s:1"] = Feed(sub.filters[1].window, ["db"], live=True)
    watch.indexes.update({"s:0": 0, "s:1": 1})
    a0 = _pub("a0", "A", seam - timedelta(seconds=5))
    a1 = _pub("a1", "A", seam + timedelta(seconds=0.1))
    b2 = _pub("b2", "B", seam + timedelta(seconds=0.3))
    a3 = _pub("a3", "A", seam + timedelta(seconds=0.5))
    assert watch.deliveries("s:0", a_feed.arrived(a1)) == []  # held: the past comes first
    assert watch.deliveries("s:0", a_feed.replayed("db", [a0, a3])) == []
    assert watch.deliveries("s:1", b_feed.replayed("db", [b2])) == []
    assert watch.deliveries("s:1", b_feed.finished("db")) == []  # a's past is not over
    out = watch.deliveries("s:0", a_feed.finished("db"))
    out += watch.deliveries("s:1", b_feed.arrived(b2))  # the live copy
    out += watch.advance(seam + timedelta(seconds=5))  # b2 leaves the reorder buffer
    matched = [[p.id for p in m.publications] for _, m in out if isinstance(m, CompositeNotify)]
    assert matched == [["a0", "b2"], ["a1", "b2"]]
    assert watch.network is not None and watch.network.late == 0
    want = over_range(sub, [a0, a1, b2, a3], NOW + timedelta(seconds=5))
    assert matched == [[p.id for p in m.publications] for m in want]


def test_a_publication_stamped_far_ahead_in_a_database_makes_nothing_late() -> None:
    """A stored publication stamped a year ahead (a publisher's clock gone wrong) is ignored
    by a hybrid sequence, as a live one would be: the live stream is not late after it."""
    sim = _sim(2)
    db1, db2 = _databases(sim)
    shop = _shop(sim)
    ahead = Publication("ahead", {"class": "A", "k": "k1"}, NOW + timedelta(days=365))
    sim.send(shop, ahead)
    sim.send(shop, Publication("a0", {"class": "A", "k": "k1"}, NOW - timedelta(seconds=3)))
    sim.run()
    manager = sim.attach("manager", "E")
    pattern = "{[class,eq,'A'],[k,eq,$K]} ; {[class,eq,'B'],[k,eq,$K]} within 10s"
    sim.send(manager, parse_composite(_ranged(pattern, _window(PAST)), id="h"))
    sim.run()
    db1.answer()
    db2.answer()
    sim.run()
    at = datetime.fromtimestamp(sim.clock, UTC)
    sim.send(shop, Publication("b1", {"class": "B", "k": "k1"}, at))
    sim.run()
    _wait(sim, 3)
    assert [[p.id for p in m.publications] for m in manager.composites] == [["a0", "b1"]]
    watch = next(iter(sim.brokers["E"].history.watches.values()))
    assert watch.timeline is not None and watch.timeline.early == 1


def test_a_database_lost_halfway_leaves_what_it_sent_matched_and_the_live_stream_going() -> None:
    sim = _sim(0)
    db1 = SimArchive.attach(sim, "db1", "C")
    db1.store("[class,eq,'A']", "a")
    db2 = SimArchive.attach(sim, "db2", "D")
    db2.store("[class,eq,'B']", "b")
    shop = _shop(sim)
    pubs = [
        Publication(f"p{i}", {"class": c, "k": "k1"}, NOW - timedelta(seconds=60 - 2 * i))
        for i, c in enumerate("ABABABAB")
    ]
    _publish(sim, shop, pubs, 0)
    sim.run()
    manager = sim.attach("manager", "E")
    pattern = "{[class,eq,'A'],[k,eq,$K]} ;; {[class,eq,'B'],[k,eq,$K]} within 10s"
    sim.send(manager, parse_composite(_ranged(pattern, _window(PAST)), id="h"))
    sim.run()
    db2.answer()
    db1.batch = 2
    db1.answer(fail_after=1)  # p0 and p2, then it is gone
    sim.run()
    sim.detach(db1)
    sim.run()
    done = _done(manager)["h"]
    assert done.failed == ("db1@C: db1@C disconnected",) and done.databases == ("db2@D",)
    at = datetime.fromtimestamp(sim.clock, UTC)
    b9 = Publication("b9", {"class": "B", "k": "k1"}, at + timedelta(milliseconds=1))
    _publish(sim, shop, [Publication("a9", {"class": "A", "k": "k1"}, at), b9], 0)
    sim.run()
    _wait(sim, 2)
    got = [[p.id for p in m.publications] for m in manager.composites]
    # db2 sent every B, db1 only p0 and p2 of the A's before it was gone.
    assert got == [["p0", "p1"], ["p2", "p3"], ["a9", "b9"]]


def test_the_parts_of_a_sequence_must_share_their_time_range() -> None:
    sim = _sim(0)
    manager = sim.attach("manager", "E")
    text = f"{{[class,eq,'A'],{_window(PAST)}}} ; {{[class,eq,'B']}} within 10s"
    sim.send(manager, parse_composite(text, id="h"))
    sim.run()
    (error,) = manager.errors
    assert "reads one time range: give every part the same time predicates" in error.text
