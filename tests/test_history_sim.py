"""Historic, hybrid and composite-historic subscriptions in simulated overlays."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from padres.broker.replay import Feed
from padres.language.parser import parse_advertisement, parse_composite, parse_subscription
from padres.model.messages import Publication, TimeWindow, Unsubscribe
from padres.model.protocol import ReplayBatch, ReplayDone, ReplayEnd
from padres.runtime.simulation import SimClient, Simulation
from rete.operators import Value
from tests.sim_archive import SimArchive

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
PAST = NOW - timedelta(days=20)


def _sim(links: list[tuple[str, str]], seed: int = 3) -> Simulation:
    sim = Simulation(seed, clock=NOW.timestamp())
    for a, b in links:
        for x in (a, b):
            if x not in sim.brokers:
                sim.add_broker(x)
        sim.link(a, b)
    sim.run()
    return sim


STAR = [("A", "B"), ("C", "B"), ("D", "B"), ("E", "B"), ("A", "C"), ("D", "E")]


def _order(i: int, item: str, at: datetime, user: str = "gold") -> Publication:
    attrs: dict[str, Value] = {"class": "Order", "item": item, "price": 10 + i, "userType": user}
    return Publication(f"o{i}", attrs, at)


def _shop(sim: Simulation, broker: str = "A") -> SimClient:
    shop = sim.attach("shop", broker)
    sim.send(shop, parse_advertisement("[class,eq,'Order']", id="a1"))
    sim.send(shop, parse_advertisement("[class,eq,'SysInfo']", id="a2"))
    sim.run()
    return shop


def _ids(client: SimClient) -> list[str]:
    return [n.publication.id for n in client.notifications]


def _done(client: SimClient) -> list[ReplayDone]:
    return [m for m in client.other if isinstance(m, ReplayDone)]


def _window(start: datetime, end: datetime | None = None) -> str:
    text = f"[time,>=,'{start.isoformat()}']"
    return text + (f",[time,<,'{end.isoformat()}']" if end else "")


def _stored(
    count: int, every: timedelta, item: str = "shoes", seed: int = 3
) -> tuple[Simulation, SimArchive]:
    """The star with a database at C storing orders, and ``count`` orders published at A,
    ``every`` apart from PAST (every third a hat, with ``item`` 'mixed')."""
    sim = _sim(STAR, seed)
    db = SimArchive.attach(sim, "db", "C")
    db.store("[class,eq,'Order']", "s")
    shop = _shop(sim)
    for i in range(count):
        kind = ("shoes" if i % 3 else "hat") if item == "mixed" else item
        sim.send(shop, _order(i, kind, PAST + every * i))
    sim.run()
    return sim, db


def test_a_historic_subscription_is_answered_to_the_requester_only() -> None:
    sim, db = _stored(12, timedelta(hours=1), "mixed")
    assert len(db.stored) == 12
    other = sim.attach("other", "D")
    sim.send(other, parse_subscription("[class,eq,'Order']", id="live"))
    manager = sim.attach("manager", "E")
    window = _window(PAST + timedelta(hours=2), PAST + timedelta(hours=9))
    sub = parse_subscription(f"[class,eq,'Order'],[item,eq,'shoes'],{window}", id="h")
    sim.send(manager, sub)
    sim.run()
    assert manager.notifications == [] and len(db.requests) == 1
    db.answer()
    sim.run()
    assert _ids(manager) == ["o2", "o4", "o5", "o7", "o8"]  # in time order, within the window
    assert all(n.subscriptions == ("h",) for n in manager.notifications)
    assert _done(manager) == [ReplayDone("h", 5, ("db@C",))]
    assert other.notifications == []  # an overlapping live subscriber sees no replay
    assert sim.brokers["E"].history.is_empty()  # a historic subscription ends with its past
    sim.send(manager, sub)
    sim.run()
    assert manager.acks == ["h", "h"]


def test_overlapping_databases_give_each_publication_once_in_time_order() -> None:
    sim = _sim(STAR)
    shoes = SimArchive.attach(sim, "shoes", "C")
    shoes.store("[class,eq,'Order'],[item,eq,'shoes']", "s")
    every = SimArchive.attach(sim, "every", "D")
    every.store("[class,eq,'Order']", "s")
    every.batch = 2
    shop = _shop(sim)
    for i in range(15):
        sim.send(shop, _order(i, "shoes" if i % 2 else "hat", PAST + timedelta(minutes=i)))
    sim.run()
    manager = sim.attach("manager", "E")
    sim.send(manager, parse_subscription(f"[class,eq,'Order'],{_window(PAST)}", id="h"))
    sim.run()
    every.answer()  # one database answers in full before the other starts
    sim.run()
    assert manager.notifications == []  # held: the other one could still send earlier ones
    shoes.answer()
    sim.run()
    assert _ids(manager) == [f"o{i}" for i in range(15)]
    (done,) = _done(manager)
    assert done.count == 15 and done.databases == ("every@D", "shoes@C")


def _publish_while_running(sim: Simulation, shop: SimClient, first: int, n: int, steps: int) -> int:
    """Publish orders ``first`` .. ``first + n - 1`` stamped with the simulation's clock, letting
    ``steps`` messages through after each; returns the next number."""
    for i in range(first, first + n):
        sim.send(shop, _order(i, "shoes", datetime.fromtimestamp(sim.clock, UTC)))
        sim.step(steps)
    return first + n


def test_a_hybrid_subscription_gets_the_past_then_the_live_stream_without_gap_or_duplicate() -> (
    None
):
    for seed in range(6):
        sim = _sim(STAR, seed)
        db = SimArchive.attach(sim, "db", "C")
        db.store("[class,eq,'Order']", "s")
        shop = _shop(sim)
        count = _publish_while_running(sim, shop, 0, 10, 0)
        sim.run()
        manager = sim.attach("manager", "E")
        sim.send(manager, parse_subscription(f"[class,eq,'Order'],{_window(PAST)}", id="h"))
        count = _publish_while_running(sim, shop, count, 10, 3)  # while it is on its way
        sim.run()
        count = _publish_while_running(sim, shop, count, 5, 2)
        db.answer()  # the past ends in the middle of the live stream
        count = _publish_while_running(sim, shop, count, 10, 2)
        sim.run()
        assert _ids(manager) == [f"o{i}" for i in range(count)], seed
        (done,) = _done(manager)
        # At least the orders stored before the subscription came from the past; later ones
        # count too when they arrived before the replay ended, which depends on the schedule.
        assert done.databases == ("db@C",) and done.count >= 10


def test_a_composite_subscription_over_the_past() -> None:
    sim = _sim(STAR)
    db = SimArchive.attach(sim, "db", "C")
    db.store("[class,eq,'Order']", "s1")
    db.store("[class,eq,'SysInfo']", "s2")
    shop = _shop(sim)
    info = {"class": "SysInfo", "status": "overloaded", "userType": "gold"}
    sim.send(shop, Publication("i1", info, PAST + timedelta(hours=1)))
    sim.send(shop, Publication("i2", {**info, "status": "healthy"}, PAST + timedelta(hours=1)))
    for i, user in enumerate(["gold", "silver", "gold", "VIP"]):
        sim.send(shop, _order(i, "shoes", PAST + timedelta(hours=2 + i), user))
    sim.run()
    manager = sim.attach("manager", "E")
    window = _window(PAST, NOW - timedelta(days=1))
    text = (
        f"{{[class,eq,'SysInfo'],[status,eq,'overloaded'],[userType,eq,$U],{window}}}"
        f" & {{[class,eq,'Order'],[userType,eq,$U],{window}}}"
    )
    sim.send(manager, parse_composite(text, id="c"))
    sim.run()
    db.answer()
    sim.run()
    matched = sorted(tuple(p.id for p in m.publications) for m in manager.composites)
    assert matched == [("i1", "o0"), ("i1", "o2")]
    assert all(m.bindings == {"U": "gold"} for m in manager.composites)
    assert _done(manager) == [ReplayDone("c", 2, ("db@C",))]


def _pairs_of_orders(windows: list[str]) -> tuple[list[tuple[str, ...]], list[ReplayDone]]:
    """A composite over the past whose parts all ask for two orders of the same user, each in
    its own window; gold orders o0, o1, o3, o4 and silver o2, two hours apart from PAST + 1 h."""
    sim = _sim(STAR)
    db = SimArchive.attach(sim, "db", "C")
    db.store("[class,eq,'Order']", "s")
    shop = _shop(sim)
    for i, user in enumerate(["gold", "gold", "silver", "gold", "gold"]):
        sim.send(shop, _order(i, "shoes", PAST + timedelta(hours=1 + 2 * i), user))
    sim.run()
    manager = sim.attach("manager", "E")
    text = " & ".join(f"{{[class,eq,'Order'],[userType,eq,$U],{w}}}" for w in windows)
    sim.send(manager, parse_composite(text, id="c"))
    sim.run()
    db.answer()
    sim.run()
    return [tuple(p.id for p in m.publications) for m in manager.composites], _done(manager)


def test_each_part_of_a_historic_composite_takes_only_its_own_feed() -> None:
    end = NOW - timedelta(days=1)
    split = PAST + timedelta(hours=4)
    pairs, done = _pairs_of_orders([_window(PAST, split), _window(split, end)])
    assert sorted(pairs) == [("o0", "o3"), ("o0", "o4"), ("o1", "o3"), ("o1", "o4")]
    assert done == [ReplayDone("c", 4, ("db@C",))]
    # The same window for both: each ordered pair of distinct orders, once.
    pairs, done = _pairs_of_orders([_window(PAST, end)] * 2)
    gold = ["o0", "o1", "o3", "o4"]
    assert sorted(pairs) == sorted((a, b) for a in gold for b in gold if a != b)
    assert done == [ReplayDone("c", 12, ("db@C",))]


def test_without_a_database_the_replay_ends_at_once() -> None:
    sim = _sim(STAR)
    manager = sim.attach("manager", "E")
    sim.send(manager, parse_subscription(f"[class,eq,'Order'],{_window(PAST)}", id="h"))
    sim.run()
    assert manager.acks == ["h"] and _done(manager) == [ReplayDone("h", 0, (), live=True)]


def test_a_database_that_disappears_mid_replay_is_named() -> None:
    sim, db = _stored(10, timedelta(minutes=1))
    manager = sim.attach("manager", "E")
    sim.send(manager, parse_subscription(f"[class,eq,'Order'],{_window(PAST)}", id="h"))
    sim.run()
    db.answer(fail_after=2)
    sim.run()
    sim.detach(db)
    sim.run()
    assert _ids(manager) == [f"o{i}" for i in range(6)]  # what arrived is kept
    assert _done(manager) == [ReplayDone("h", 6, (), ("db@C: db@C disconnected",), live=True)]


def test_a_link_lost_mid_replay_ends_it_with_an_error() -> None:
    sim = _sim([("A", "B"), ("B", "C")])
    db = SimArchive.attach(sim, "db", "C")
    db.store("[class,eq,'Order']", "s")
    shop = _shop(sim, "C")
    for i in range(4):
        sim.send(shop, _order(i, "shoes", PAST + timedelta(minutes=i)))
    sim.run()
    manager = sim.attach("manager", "A")
    sim.send(manager, parse_subscription(f"[class,eq,'Order'],{_window(PAST)}", id="h"))
    sim.run()
    sim.unlink("B", "C")
    sim.run()
    (done,) = _done(manager)
    assert done.failed == ("db@C: the link from B to C was lost",)


def test_watched_subscriptions_leave_nothing_behind() -> None:
    sim, db = _stored(3, timedelta(minutes=1))
    manager = sim.attach("manager", "E")
    sim.send(manager, parse_subscription(f"[class,eq,'Order'],{_window(PAST)}", id="h"))
    sim.run()
    sim.send(manager, Unsubscribe("h"))
    sim.run()
    db.answer()  # answers to a subscription that is gone are dropped on the way
    sim.run()
    assert manager.notifications == [] and _done(manager) == []
    for client in list(sim.clients.values()):
        sim.detach(client)
    sim.run()
    assert sim.tables_empty()


def test_a_feed_drops_a_live_copy_of_a_replayed_publication_after_the_switch() -> None:
    feed = Feed(TimeWindow(PAST), ["d1", "d2"], live=True)
    p = [
        Publication(f"p{i}", {"class": "Order"}, NOW + timedelta(seconds=i), "x") for i in range(4)
    ]
    assert feed.arrived(p[2]) == []  # held until the past is complete
    assert feed.replayed("d1", p[:2]) == []  # d2 could still send something earlier
    assert feed.replayed("d2", [p[0]]) == [p[0]]
    assert feed.finished("d2") == [p[1]]
    assert feed.replayed("d1", [p[3]]) == [p[3]]
    assert feed.finished("d1", "broken") == [p[2]]
    assert feed.done and feed.answered == ["d2"] and feed.failed == {"d1": "broken"}
    assert feed.arrived(p[3]) == []  # the database had it before the live stream did
    late = Publication("old", {"class": "Order"}, PAST - timedelta(seconds=1), "x")
    assert feed.arrived(late) == []  # outside the window
    new = Publication("p9", {"class": "Order"}, NOW + timedelta(seconds=9), "x")
    assert feed.arrived(new) == [new]


@given(
    st.lists(st.lists(st.tuples(st.integers(0, 5), st.integers(-2, 12)), max_size=6), max_size=5)
)
def test_a_feed_of_one_database_passes_on_what_the_general_merge_would(
    batches: list[list[tuple[int, int]]],
) -> None:
    """One database's answer, passed on as it comes, against the merge of several databases
    (a second one that sends nothing): the same publications, copies dropped, in the same
    order, the window applied, the live ones released after it."""
    window = TimeWindow(NOW, NOW + timedelta(seconds=10))
    one = Feed(window, ["d1"], live=True)
    two = Feed(window, ["d1", "d2"], live=True)
    assert two.finished("d2") == []
    live = Publication("p3", {"class": "Order"}, NOW + timedelta(seconds=9), "x")
    assert one.arrived(live) == two.arrived(live) == []
    for batch in batches:
        pubs = [
            Publication(f"p{i}", {"class": "Order"}, NOW + timedelta(seconds=s), "x")
            for i, s in sorted(batch, key=lambda b: b[1])
        ]
        assert one.replayed("d1", pubs) == two.replayed("d1", pubs)
        assert one.reached == two.reached
    assert one.finished("d1") == two.finished("d1")


# -- databases that do not answer --------------------------------------------------------------

SILENT = "no answer within 30 s"


def _wait(sim: Simulation, seconds: int) -> None:
    """Let ``seconds`` pass, the brokers ticking every second as the runtime makes them."""
    for _ in range(seconds):
        sim.tick(1)
        sim.run()


def _requested(sim: Simulation) -> bool:
    """Whether any broker still remembers a replay request."""
    return not all(b.history.is_empty() for b in sim.brokers.values())


def test_a_historic_request_to_a_silent_database_fails_after_the_timeout() -> None:
    for seed in range(4):
        sim, mute = _stored(6, timedelta(minutes=1), seed=seed)
        manager = sim.attach("manager", "E")
        window = _window(PAST, NOW - timedelta(days=1))
        sub = parse_subscription(f"[class,eq,'Order'],{window}", id="h")
        sim.send(manager, sub)
        sim.run()
        assert len(mute.requests) == 1, seed
        _wait(sim, 29)  # its past ended a day ago: the time counts from the request
        assert _done(manager) == [] and _requested(sim), seed
        _wait(sim, 2)
        assert _done(manager) == [ReplayDone("h", 0, (), (f"db@C: {SILENT}",))], seed
        assert not _requested(sim), seed  # every broker on the way forgot it too
        mute.answer()  # too late: dropped on the way
        sim.run()
        assert manager.notifications == [] and len(_done(manager)) == 1, seed
        sim.send(manager, sub)  # the id is free again
        sim.run()
        assert manager.acks == ["h", "h"] and manager.errors == [], seed
        assert len(mute.requests) == 1, seed
        mute.answer()
        sim.run()
        assert _ids(manager) == [f"o{i}" for i in range(6)], seed
        assert _done(manager)[-1] == ReplayDone("h", 6, ("db@C",)), seed
        for client in list(sim.clients.values()):
            sim.detach(client)
        sim.run()
        assert sim.tables_empty(), seed


def test_a_hybrid_subscription_goes_on_live_when_a_silent_database_times_out() -> None:
    for seed in range(6):
        sim = _sim(STAR, seed)
        mute = SimArchive.attach(sim, "mute", "D")
        mute.store("[class,eq,'Order']", "s")
        db = SimArchive.attach(sim, "db", "C")
        db.store("[class,eq,'Order']", "s")
        shop = _shop(sim)
        for i in range(8):
            sim.send(shop, _order(i, "shoes", PAST + timedelta(minutes=i)))
        sim.run()
        manager = sim.attach("manager", "E")
        sim.send(manager, parse_subscription(f"[class,eq,'Order'],{_window(PAST)}", id="h"))
        count = _publish_while_running(sim, shop, 8, 4, 3)  # while it is on its way
        sim.run()
        db.answer()
        sim.run()
        count = _publish_while_running(sim, shop, count, 4, 2)  # held
        sim.run()
        assert manager.notifications == [] and _done(manager) == [], seed
        _wait(sim, 31)
        assert _ids(manager) == [f"o{i}" for i in range(count)], seed  # the past, then held
        (done,) = _done(manager)
        assert done == ReplayDone("h", 16, ("db@C",), (f"mute@D: {SILENT}",), live=True), seed
        mute.answer()  # the past, after the switch: ignored
        sim.run()
        count = _publish_while_running(sim, shop, count, 4, 2)
        sim.run()
        assert _ids(manager) == [f"o{i}" for i in range(count)], seed
        sim.send(manager, Unsubscribe("h"))
        for client in list(sim.clients.values()):
            sim.detach(client)
        sim.run()
        assert sim.tables_empty(), seed


def test_a_database_answering_slowly_but_steadily_is_not_cut_off() -> None:
    sim, db = _stored(12, timedelta(minutes=1))
    manager = sim.attach("manager", "E")
    sim.send(manager, parse_subscription(f"[class,eq,'Order'],{_window(PAST)}", id="h"))
    sim.run()
    (request,) = db.requests
    rid = request.subscription.id
    found = sorted(db.stored.values(), key=lambda p: p.timestamp)
    for i in range(0, 12, 3):
        _wait(sim, 25)  # under the timeout between answers, far over it in all
        sim.send(db, ReplayBatch(rid, request.database, tuple(found[i : i + 3])))
        sim.run()
    _wait(sim, 25)
    sim.send(db, ReplayEnd(rid, request.database, 12))
    sim.run()
    assert _ids(manager) == [f"o{i}" for i in range(12)]
    assert _done(manager) == [ReplayDone("h", 12, ("db@C",), live=True)]


def test_a_database_that_stops_answering_fails_with_what_it_sent_kept() -> None:
    sim, db = _stored(12, timedelta(minutes=1))
    manager = sim.attach("manager", "E")
    sim.send(manager, parse_subscription(f"[class,eq,'Order'],{_window(PAST)}", id="h"))
    sim.run()
    _wait(sim, 20)
    db.answer(fail_after=2)
    sim.run()
    _wait(sim, 29)  # past ready_at plus the timeout, under the timeout since the last answer
    assert _ids(manager) == [f"o{i}" for i in range(6)] and _done(manager) == []
    _wait(sim, 2)
    assert _done(manager) == [ReplayDone("h", 6, (), (f"db@C: {SILENT}",), live=True)]
    sim.send(manager, Unsubscribe("h"))
    sim.run()
    assert not _requested(sim)  # the brokers on the way gave up at the same time


def test_the_timeout_is_the_brokers_own() -> None:
    sim, _ = _stored(3, timedelta(minutes=1))
    for broker in sim.brokers.values():
        broker.history.timeout = 2.5
    manager = sim.attach("manager", "E")
    sim.send(manager, parse_subscription(f"[class,eq,'Order'],{_window(PAST)}", id="h"))
    sim.run()
    _wait(sim, 2)
    assert _done(manager) == []
    _wait(sim, 2)
    assert _done(manager) == [ReplayDone("h", 0, (), ("db@C: no answer within 2.5 s",), live=True)]


def test_brokers_on_the_way_forget_a_request_whose_requester_is_gone() -> None:
    sim, _ = _stored(3, timedelta(minutes=1))
    manager = sim.attach("manager", "E")
    sim.send(manager, parse_subscription(f"[class,eq,'Order'],{_window(PAST)}", id="h"))
    sim.run()
    sim.detach(manager)
    sim.run()
    assert sim.brokers["E"].history.is_empty() and _requested(sim)
    _wait(sim, 31)
    assert not _requested(sim)


# -- a hybrid subscription across a failed link --------------------------------------------


def test_a_hybrid_subscription_gets_what_a_failed_link_kept_from_it_once_the_link_is_back() -> None:
    """A chain A-B-C, the shop and the database at A, a hybrid subscriber at C. The link B-C
    fails while orders are published: the database stores them, the subscriber misses them.
    Once the link is back, C asks the database again for the past since the loss and merges
    it in: every order once, in order, the live ones published meanwhile after the repair."""
    for seed in range(4):
        sim = _sim([("A", "B"), ("B", "C")], seed)
        db = SimArchive.attach(sim, "db", "A")
        db.store("[class,eq,'Order']", "s")
        shop = _shop(sim)
        count = _publish_while_running(sim, shop, 0, 5, 0)
        sim.run()
        manager = sim.attach("manager", "C")
        sim.send(manager, parse_subscription(f"[class,eq,'Order'],{_window(PAST)}", id="h"))
        sim.run()
        db.answer()
        sim.tick(1)
        count = _publish_while_running(sim, shop, count, 5, 1)
        sim.run()
        sim.unlink("B", "C")
        sim.tick(1)
        count = _publish_while_running(sim, shop, count, 10, 1)  # kept from C
        sim.run()
        assert _ids(manager) == [f"o{i}" for i in range(10)], seed
        sim.link("B", "C")
        sim.run()
        sim.tick(1)
        count = _publish_while_running(sim, shop, count, 5, 2)  # held during the repair
        sim.run()
        (request,) = db.requests  # the repair: the past since the loss, less the margin
        window = request.subscription.filter.window
        assert window is not None and window.start is not None
        lost_at = NOW.timestamp() + 1  # a tick in, and a few milliseconds of messages
        assert 0 <= window.start.timestamp() - (lost_at - 10) < 0.5
        db.answer()
        count = _publish_while_running(sim, shop, count, 3, 2)
        sim.run()
        assert _ids(manager) == [f"o{i}" for i in range(count)], seed
        assert len(_done(manager)) == 1  # the past ended once, for the client


def test_a_repair_with_no_database_to_ask_lets_the_held_live_stream_go() -> None:
    sim = _sim([("A", "B"), ("B", "C")])
    shop = _shop(sim)
    manager = sim.attach("manager", "C")
    sim.send(manager, parse_subscription(f"[class,eq,'Order'],{_window(PAST)}", id="h"))
    sim.run()
    count = _publish_while_running(sim, shop, 0, 3, 1)
    sim.run()
    sim.unlink("B", "C")
    sim.link("B", "C")
    sim.run()
    count = _publish_while_running(sim, shop, count, 3, 1)  # held: a repair is due
    sim.run()
    assert _ids(manager) == ["o0", "o1", "o2"]
    sim.tick(1)
    sim.run()
    assert _ids(manager) == [f"o{i}" for i in range(count)]
