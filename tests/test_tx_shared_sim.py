"""Shared context in the simulation: a consumer's transaction joins the producer's as a part,
and its publications are the producer's transaction's. A cyclic overlay A-B-C, interleavings
chosen by seed: the producer ``shop`` at A publishes orders; the consumer ``stock`` at C sees
them at once and publishes shipments in its part; at B, subscribers of each visibility watch
both classes. Then crashes of either broker at each step of the commit: every publication of
the transaction ends one way, committed or aborted, for every subscriber."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from padres.language.parser import parse_advertisement, parse_subscription
from padres.model.messages import Publication, Unadvertise
from padres.model.protocol import (
    Ack,
    Durable,
    Error,
    Outcome,
    RouteTxOutcome,
    Subscribe,
    TxAbort,
    TxBegin,
    TxCommit,
    TxEnded,
    TxNotify,
    TxPublish,
    TxVote,
    Visibility,
    Vote,
)
from padres.runtime.simulation import SimClient, Simulation

T0 = datetime(2026, 1, 1, tzinfo=UTC)
GID = "shop@A:t1"
PART = "stock@C:j1"

Seen = list[tuple[str, int, str]]
"""Deliveries: (class, n, outcome)."""


def _overlay(seed: int) -> tuple[Simulation, SimClient, SimClient, dict[str, SimClient]]:
    """The producer at A, the consumer at C (``immediate`` on orders), and at B a durable
    ``on_commit`` subscriber ``billing`` and plain ones of the other visibilities, all on
    orders and shipments."""
    sim = Simulation(seed)
    for name in "ABC":
        sim.add_broker(name)
    for a, b in ("AB", "BC", "CA"):
        sim.link(a, b)
    sim.run()
    shop = sim.attach("shop", "A")
    sim.send(shop, parse_advertisement("[class,eq,'Order'],[n,isPresent,0]", id="a"))
    stock = sim.attach("stock", "C")
    sim.send(stock, parse_advertisement("[class,eq,'Shipment'],[n,isPresent,0]", id="a"))
    sub = parse_subscription("[class,eq,'Order']", id="o")
    sim.send(stock, Subscribe(sub, Visibility.IMMEDIATE))
    watchers = {"billing": sim.attach("billing", "B")}
    for kind in ("Order", "Shipment"):
        sim.send(watchers["billing"], Durable(parse_subscription(f"[class,eq,'{kind}']", id=kind)))
    for visibility in (Visibility.IMMEDIATE, Visibility.DEFERRED, Visibility.ON_ABORT):
        client = watchers[visibility.value] = sim.attach(visibility.value, "B")
        for kind in ("Order", "Shipment"):
            sub = parse_subscription(f"[class,eq,'{kind}']", id=kind)
            sim.send(client, Subscribe(sub, visibility))
    sim.run()
    return sim, shop, stock, watchers


def _seen(client: SimClient) -> Seen:
    return [
        (str(n.publication.attributes["class"]), int(n.publication.attributes["n"]), n.outcome)
        for n in client.notifications
        if isinstance(n, TxNotify)
    ]


def _ended(client: SimClient) -> list[TxEnded]:
    return [m for m in client.other if isinstance(m, TxEnded)]


def _order(
    sim: Simulation, shop: SimClient, vital: tuple[str, ...] = (), wait: float = 5.0
) -> None:
    sim.send(shop, TxBegin("t1", vital, wait))
    sim.send(shop, TxPublish("t1", Publication("o0", {"class": "Order", "n": 0}, T0)))
    sim.run()


def _join(sim: Simulation, stock: SimClient, count: int, done: bool = True) -> None:
    """``stock`` joins the order's transaction, ships ``count`` items, and is done with it if
    ``done``."""
    sim.send(stock, TxBegin("j1", join=GID))
    sim.run()
    assert stock.acks.count("j1") == 1  # taken
    for n in range(count):
        sim.send(stock, TxPublish("j1", Publication(f"s{n}", {"class": "Shipment", "n": n}, T0)))
    if done:
        sim.send(stock, TxCommit("j1", count))
    sim.run()


COMMITTED: Seen = [("Order", 0, "committed"), ("Shipment", 0, "committed")]
COMMITTED += [("Shipment", 1, "committed")]
ABORTED: Seen = [("Order", 0, "aborted"), ("Shipment", 0, "aborted"), ("Shipment", 1, "aborted")]


@pytest.mark.parametrize("seed", range(3))
def test_a_part_is_seen_as_its_transaction_and_committed_with_it(seed: int) -> None:
    sim, shop, stock, watchers = _overlay(seed)
    _order(sim, shop)
    _join(sim, stock, 2)
    assert stock.acks.count("j1") == 2  # taken, then done
    assert {n.tx for n in stock.notifications if isinstance(n, TxNotify)} == {GID}
    assert _seen(watchers["billing"]) == [] and _seen(watchers["deferred"]) == []
    assert sorted(_seen(watchers["immediate"])) == sorted(
        [("Order", 0, "pending"), ("Shipment", 0, "pending"), ("Shipment", 1, "pending")]
    )
    assert all(n.tx == GID for n in watchers["immediate"].notifications if isinstance(n, TxNotify))
    assert sim.brokers["C"].transactions.statistics()["prepared"] == 1
    sim.send(shop, TxCommit("t1", 1))
    sim.run()
    assert shop.acks.count("t1") == 2 and not _ended(shop)
    assert sorted(_seen(watchers["billing"])) == COMMITTED  # each once
    got = [n for n in watchers["billing"].notifications if isinstance(n, TxNotify)]
    assert {n.tx for n in got} == {GID}
    assert sorted(_seen(watchers["deferred"])) == sorted(
        [(c, n, "committing") for c, n, _ in COMMITTED] + COMMITTED
    )
    assert _seen(watchers["on_abort"]) == []
    assert _ended(stock) == [TxEnded("j1", Outcome.COMMITTED)]
    a, c = sim.brokers["A"], sim.brokers["C"]
    assert a.journal.committed(GID) and c.journal.committed(GID)
    assert c.journal.recorded("stock@C", "s1") and list(c.journal.prepared()) == []
    assert c.transactions.statistics()["parts"] == 0 and len(c.transactions) == 0
    assert a.transactions.statistics()["open"] == 0


@pytest.mark.parametrize("seed", range(3))
def test_a_part_is_discarded_when_its_transaction_aborts(seed: int) -> None:
    sim, shop, stock, watchers = _overlay(seed)
    _order(sim, shop)
    _join(sim, stock, 2)
    sim.send(shop, TxAbort("t1"))
    sim.run()
    assert _seen(watchers["billing"]) == []
    assert sorted(_seen(watchers["on_abort"])) == ABORTED
    why = f"the transaction it joined, {GID}, was aborted: aborted by its client"
    assert _ended(stock) == [TxEnded("j1", Outcome.ABORTED, why)]
    c = sim.brokers["C"]
    assert not c.journal.recorded("stock@C", "s0") and not c.journal.committed(GID)
    assert list(c.journal.prepared()) == [] and len(c.transactions) == 0


@pytest.mark.parametrize(
    ("what", "vital", "reason"),
    [
        ("done", (), ""),
        ("aborted", (), f"its part {PART} was aborted (aborted by its client)"),
        ("late", (), f"its parts {PART} were not done within 12 s"),
        (
            "away",
            (),
            f"its part {PART} was aborted (its client was disconnected for more than 10 s)",
        ),
        ("gone", ("stock",), "its vital consumer stock@C is gone (stock@C disconnected)"),
    ],
)
def test_a_commit_waits_for_its_parts_and_aborts_when_one_is_not_done(
    what: str, vital: tuple[str, ...], reason: str
) -> None:
    sim, shop, stock, watchers = _overlay(1)
    _order(sim, shop, vital, wait=12.0)
    _join(sim, stock, 1, done=False)
    sim.send(shop, TxCommit("t1", 1))
    sim.run()
    assert shop.acks.count("t1") == 1  # it waits for the part
    assert sorted(_seen(watchers["deferred"])) == [
        ("Order", 0, "committing"),
        ("Shipment", 0, "committing"),  # the part learned that the commit started
    ]
    if what == "done":
        sim.send(stock, TxCommit("j1", 1))
    elif what == "aborted":
        sim.send(stock, TxAbort("j1"))
    elif what == "late":
        sim.tick(11.0)
        sim.run()
        assert not _ended(shop)
        sim.tick(1.5)
    else:
        sim.detach(stock)
        sim.run()
        sim.tick(10.5)
    sim.run()
    if what == "done":
        assert shop.acks.count("t1") == 2
        assert sorted(_seen(watchers["billing"])) == COMMITTED[:2]
        return
    assert _ended(shop) == [TxEnded("t1", Outcome.ABORTED, reason)]
    assert _seen(watchers["billing"]) == []
    assert sorted(_seen(watchers["on_abort"])) == ABORTED[:2]
    assert len(sim.brokers["A"].transactions) == 0 and len(sim.brokers["C"].transactions) == 0


def test_a_join_after_the_commit_started_is_refused_unless_the_commit_waits_for_it() -> None:
    sim, shop, stock, watchers = _overlay(2)
    late = watchers["deferred"]  # sees orders when their commit starts
    sim.send(late, parse_advertisement("[class,eq,'Shipment'],[n,isPresent,0]", id="a"))
    _order(sim, shop, vital=("deferred",))
    sim.send(shop, TxCommit("t1", 1))
    sim.run()
    sim.send(stock, TxBegin("j1", join=GID))  # it saw the order, but is not vital
    sim.run()
    why = (
        f"cannot join transaction {GID}: its commit has started: only a vital consumer it "
        "waits for may join it now"
    )
    assert _ended(stock) == [TxEnded("j1", Outcome.ABORTED, why)]
    assert sim.brokers["C"].transactions.statistics()["parts"] == 0
    sim.send(late, TxBegin("j2", join=GID))  # the vital one
    sim.send(late, TxPublish("j2", Publication("s9", {"class": "Shipment", "n": 9}, T0)))
    sim.run()
    assert late.acks.count("j2") == 1 and shop.acks.count("t1") == 1
    assert ("Shipment", 9, "committing") in _seen(late)  # made while the commit waits
    sim.send(late, TxCommit("j2", 1))  # done: its "ready"
    sim.run()
    assert shop.acks.count("t1") == 2
    assert sorted(_seen(watchers["billing"])) == [
        ("Order", 0, "committed"),
        ("Shipment", 9, "committed"),
    ]
    sim.send(stock, TxBegin("j3", join=GID))  # over: its publications reached C as committed
    sim.send(stock, TxBegin("j4", join="shop@A:nothing"))
    sim.run()
    assert [e.text for e in stock.errors] == [
        f"no open transaction {GID!r} whose publications reached this broker",
        "no open transaction 'shop@A:nothing' whose publications reached this broker",
    ]


@pytest.mark.parametrize("seed", range(3))
def test_a_part_of_a_part_joins_the_same_transaction(seed: int) -> None:
    """A consumer at B sees the shipments (made in stock's part at C) at once, and joins: its
    join goes up the shipments' tree to C, which passes it on to A."""
    sim, shop, stock, watchers = _overlay(seed)
    clerk = sim.attach("clerk", "B")
    sim.send(clerk, parse_advertisement("[class,eq,'Invoice'],[n,isPresent,0]", id="a"))
    sim.send(
        clerk, Subscribe(parse_subscription("[class,eq,'Shipment']", id="s"), Visibility.IMMEDIATE)
    )
    for kind in ("Invoice",):
        sim.send(watchers["billing"], Durable(parse_subscription(f"[class,eq,'{kind}']", id=kind)))
    sim.run()
    _order(sim, shop)
    _join(sim, stock, 1)
    sim.send(clerk, TxBegin("k1", join=GID))
    sim.run()  # taken: a client publishes in a part once it is
    sim.send(clerk, TxPublish("k1", Publication("i0", {"class": "Invoice", "n": 0}, T0)))
    sim.send(clerk, TxCommit("k1", 1))
    sim.send(shop, TxCommit("t1", 1))
    sim.run()
    assert clerk.acks.count("k1") == 2 and shop.acks.count("t1") == 2
    assert sorted(_seen(watchers["billing"])) == sorted(
        [*COMMITTED[:2], ("Invoice", 0, "committed")]
    )
    assert _ended(clerk) == [TxEnded("k1", Outcome.COMMITTED)]
    assert sim.brokers["B"].journal.committed(GID)


def test_a_vote_on_a_parts_publications_goes_to_its_transaction() -> None:
    """A consumer at D, linked to C alone, sees only the shipments, and marks the transaction
    rollback-only: the vote goes up the shipments' tree to C, then on up the orders' to A."""
    sim, shop, stock, watchers = _overlay(0)
    sim.add_broker("D")
    sim.link("D", "C")
    auditor = sim.attach("auditor", "D")
    sub = parse_subscription("[class,eq,'Shipment']", id="s")
    sim.send(auditor, Subscribe(sub, Visibility.IMMEDIATE))
    sim.run()
    _order(sim, shop)
    _join(sim, stock, 1)
    assert _seen(auditor) == [("Shipment", 0, "pending")]
    sim.send(auditor, TxVote(GID, Vote.ROLLBACK, "too many"))
    sim.run()
    assert GID in auditor.acks
    sim.send(shop, TxCommit("t1", 1))
    sim.run()
    reason = "it was marked rollback-only by auditor@D (too many)"
    assert _ended(shop) == [TxEnded("t1", Outcome.ABORTED, reason)]
    assert _ended(stock)[0].outcome is Outcome.ABORTED
    assert _seen(watchers["billing"]) == []
    assert _seen(auditor) == [("Shipment", 0, "pending"), ("Shipment", 0, "aborted")]


def test_a_done_part_holds_its_advertisement_and_cannot_be_aborted() -> None:
    sim, shop, stock, _ = _overlay(0)
    _order(sim, shop)
    _join(sim, stock, 1)
    sim.send(stock, Unadvertise("a"))
    sim.send(stock, TxAbort("j1"))
    sim.send(stock, TxPublish("j1", Publication("s5", {"class": "Shipment", "n": 5}, T0)))
    sim.run()
    texts = [e.text for e in stock.errors]
    assert texts == [
        f"advertisement 'a' cannot be withdrawn now: part 'j1' of transaction {GID} is done "
        "and needs it until that transaction ends",
        f"it is done, and ends as transaction {GID} does: it cannot be aborted",
        f"it is done, and ends as transaction {GID} does: publication 's5' refused",
    ]
    sim.send(shop, TxCommit("t1", 1))
    sim.send(stock, Unadvertise("a"))  # over: it can go
    sim.run()
    assert _ended(stock) == [TxEnded("j1", Outcome.COMMITTED)] and "a" in stock.acks


def test_a_part_at_the_producers_own_broker_commits_there_at_the_brokers_time() -> None:
    """Producer and consumer at A: the join, the part's end and the outcome never leave it."""
    sim = Simulation(3, clock=1_000_000.0)
    for name in "AB":
        sim.add_broker(name)
    sim.link("A", "B")
    shop, stock = sim.attach("shop", "A"), sim.attach("stock", "A")
    sim.send(shop, parse_advertisement("[class,eq,'Order'],[n,isPresent,0]", id="a"))
    sim.send(stock, parse_advertisement("[class,eq,'Shipment'],[n,isPresent,0]", id="a"))
    sim.send(
        stock, Subscribe(parse_subscription("[class,eq,'Order']", id="o"), Visibility.IMMEDIATE)
    )
    billing = sim.attach("billing", "B")
    sim.send(billing, Durable(parse_subscription("[class,eq,'Shipment']", id="d")))
    sim.run()
    _order(sim, shop)
    _join(sim, stock, 2)
    assert sim.brokers["A"].transactions.statistics()["joined"] == 1
    sim.send(shop, TxCommit("t1", 1))
    sim.run()
    assert shop.acks.count("t1") == 2 and _ended(stock) == [TxEnded("j1", Outcome.COMMITTED)]
    assert sorted(_seen(billing)) == COMMITTED[1:]
    a = sim.brokers["A"]
    tree = a.trees.tree_of(a.sessions["stock"].advertisements["a"])
    assert tree is not None
    logged, _ = a.journal.since(tree.id, 0, 10, at=999_999.0)  # accepted at the broker's time
    assert [(pub.id, tx) for _, pub, tx in logged] == [("s0", GID), ("s1", GID)]


CRASHES = [
    ("C", "before it is done"),
    ("C", "once it is done"),
    ("A", "before the commit"),
    ("A", "once committed"),
]


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize(("broker", "when"), CRASHES)
def test_a_crash_of_either_broker_ends_every_publication_one_way(
    broker: str, when: str, seed: int
) -> None:
    """The part's broker (C) or the transaction's (A) is killed at a step of the commit and
    restarted on its journal: the transaction commits, the part's publications with it,
    exactly once, or none of them is ever seen committed."""
    sim, shop, stock, watchers = _overlay(seed)
    billing = watchers["billing"]
    _order(sim, shop, wait=12.0)
    _join(sim, stock, 2, done=when != "before it is done")
    if when == "once committed":  # A's disk has the commit; the decision has not left it
        sim.send(shop, TxCommit("t1", 1))
        while not sim.brokers["A"].journal.committed(GID):
            sim.step(1)
        assert any(
            isinstance(m, RouteTxOutcome) for m in sim.queued("A", "C") + sim.queued("A", "B")
        )
    sim.crash(broker)
    if broker == "C" or when == "before the commit":
        sim.send(shop, TxCommit("t1", 1))  # to A, restarted or not
    if broker == "A":
        sim.run()
        sim.add_broker("A")
        sim.link("A", "B")
        sim.link("C", "A")
        sim.reattach(shop)
        sim.send(shop, parse_advertisement("[class,eq,'Order'],[n,isPresent,0]", id="a"))
    sim.run()
    if broker == "C":
        sim.tick(12.5)  # the commit waits for the part that was lost, if it was not done
        sim.run()
        sim.add_broker("C")
        sim.link("C", "A")
        sim.link("B", "C")
        sim.reattach(stock)
        sim.send(stock, parse_advertisement("[class,eq,'Shipment'],[n,isPresent,0]", id="a"))
    for _ in range(4):  # the part's broker asks, durable subscriptions recover
        sim.run()
        sim.tick(3.0)
    sim.run()
    committed = sim.brokers["A"].journal.committed(GID)
    assert committed == (when in ("once it is done", "once committed"))
    got = sorted(_seen(billing))
    if committed:
        assert got == COMMITTED  # each exactly once
        assert sim.brokers["C"].journal.recorded("stock@C", "s1")
        sim.send(billing, Ack("Order", 1))
    else:
        assert got == []
        assert not sim.brokers["C"].journal.recorded("stock@C", "s0")
        assert not [s for s in _seen(watchers["immediate"]) if s[2] == "committed"]
    assert list(sim.brokers["C"].journal.prepared()) == []
    assert len(sim.brokers["C"].transactions) == 0
    assert not [e for e in billing.errors if isinstance(e, Error)]
