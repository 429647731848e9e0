"""Deferred visibility and the dependencies of consumers on a producer's transaction, in the
simulation: a cyclic overlay A-B-C, the producer at A, consumers at B and C, interleavings
chosen by seed. A deferred subscription sees a transaction when its commit starts, then its
outcome; a commit waits for its vital consumers' ``ready`` and aborts when one fails, is gone or
is late; any consumer may mark a transaction rollback-only."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from padres.broker.routes import Out
from padres.broker.session import Session
from padres.broker.trees import Trees
from padres.broker.votes import MAX_REMEMBERED, Votes
from padres.errors import DecodeError
from padres.language.parser import parse_advertisement, parse_subscription
from padres.model.messages import Publication
from padres.model.protocol import (
    Error,
    Ok,
    Outcome,
    RouteTxVote,
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
    envelope_from_dict,
)
from padres.runtime.simulation import SimClient, Simulation

T0 = datetime(2026, 1, 1, tzinfo=UTC)
GID = "shop@A:t1"


def _overlay(seed: int) -> tuple[Simulation, SimClient, dict[str, SimClient]]:
    """The producer at A; at C a deferred consumer ``stock``, an on_commit ``billing`` and an
    on_abort ``refunds``; at B an immediate ``audit``."""
    sim = Simulation(seed)
    for name in "ABC":
        sim.add_broker(name)
    for a, b in ("AB", "BC", "CA"):
        sim.link(a, b)
    sim.run()
    shop = sim.attach("shop", "A")
    sim.send(shop, parse_advertisement("[class,eq,'Order'],[n,isPresent,0]", id="a1"))
    consumers = {}
    for name, broker, visibility in (
        ("stock", "C", Visibility.DEFERRED),
        ("billing", "C", Visibility.ON_COMMIT),
        ("refunds", "C", Visibility.ON_ABORT),
        ("audit", "B", Visibility.IMMEDIATE),
    ):
        client = sim.attach(name, broker)
        sim.send(client, Subscribe(parse_subscription("[class,eq,'Order']", id="s"), visibility))
        consumers[name] = client
    sim.run()
    return sim, shop, consumers


def _seen(client: SimClient) -> list[tuple[int, str]]:
    return [
        (int(n.publication.attributes["n"]), n.outcome.value)
        for n in client.notifications
        if isinstance(n, TxNotify)
    ]


def _begin(sim: Simulation, shop: SimClient, count: int, vital: tuple[str, ...] = ()) -> None:
    sim.send(shop, TxBegin("t1", vital, wait=5.0))
    for n in range(count):
        sim.send(shop, TxPublish("t1", Publication(f"p{n}", {"class": "Order", "n": n}, T0)))
    sim.run()


def _ended(shop: SimClient) -> list[TxEnded]:
    return [m for m in shop.other if isinstance(m, TxEnded)]


@pytest.mark.parametrize("seed", range(3))
def test_a_deferred_subscription_sees_the_commit_start_then_the_outcome(seed: int) -> None:
    sim, shop, consumers = _overlay(seed)
    _begin(sim, shop, 2)
    assert _seen(consumers["stock"]) == []  # nothing while it is open
    assert _seen(consumers["audit"]) == [(0, "pending"), (1, "pending")]
    sim.send(shop, TxCommit("t1", 2))
    sim.run()
    assert shop.acks.count("t1") == 2  # begun, committed
    committing, committed = (
        [(n, "committing") for n in range(2)],
        [(n, "committed") for n in (0, 1)],
    )
    assert _seen(consumers["stock"]) == committing + committed
    assert _seen(consumers["billing"]) == committed
    assert _seen(consumers["audit"])[2:] == committed  # immediate: no committing copy

    # aborted before its commit started: a deferred subscription learns of it as aborted
    sim.send(shop, TxBegin("t2"))
    sim.send(shop, TxPublish("t2", Publication("q", {"class": "Order", "n": 9}, T0)))
    sim.send(shop, TxAbort("t2"))
    sim.run()
    assert _seen(consumers["stock"])[4:] == [(9, "aborted")]


@pytest.mark.parametrize("seed", range(3))
def test_a_commit_waits_for_its_vital_consumers_ready(seed: int) -> None:
    sim, shop, consumers = _overlay(seed)
    _begin(sim, shop, 2, vital=("stock", "audit@B"))
    sim.send(consumers["audit"], TxVote(GID, Vote.READY))  # before the commit: it counts
    sim.send(shop, TxCommit("t1", 2))
    sim.run()
    assert shop.acks.count("t1") == 1  # begun; the commit waits: stock has not reacted yet
    assert sim.brokers["A"].transactions.statistics()["committing"] == 1
    assert sim.brokers["C"].votes.statistics() == {"transactions": 1, "owed": 1}
    assert _seen(consumers["stock"]) == [(0, "committing"), (1, "committing")]
    assert _seen(consumers["billing"]) == []
    sim.send(consumers["billing"], TxVote(GID, Vote.READY))  # not vital: counts for nothing
    sim.run()
    assert GID in consumers["billing"].acks and shop.acks.count("t1") == 1
    sim.send(consumers["stock"], TxVote(GID, Vote.READY, "reserved"))
    sim.run()
    assert GID in consumers["stock"].acks and shop.acks.count("t1") == 2 and not _ended(shop)
    assert _seen(consumers["billing"]) == [(0, "committed"), (1, "committed")]
    assert _seen(consumers["stock"])[2:] == [(0, "committed"), (1, "committed")]
    assert sim.brokers["A"].journal.committed(GID)
    assert sim.brokers["A"].transactions.statistics()["committing"] == 0
    assert sim.brokers["C"].votes.statistics() == {"transactions": 0, "owed": 0}


@pytest.mark.parametrize(
    ("what", "reason"),
    [
        ("failed", "its vital consumer stock@C failed (out of stock)"),
        ("gone", "its vital consumer stock@C is gone (stock@C disconnected)"),
        ("late", "its vital consumers stock did not report ready within 5 s"),
    ],
)
def test_a_vital_consumer_that_fails_is_gone_or_late_aborts_the_commit(
    what: str, reason: str
) -> None:
    sim, shop, consumers = _overlay(0)
    _begin(sim, shop, 2, vital=("stock",))
    sim.send(shop, TxCommit("t1", 2))
    sim.run()
    stock = consumers["stock"]
    assert len(stock.notifications) == 2
    if what == "failed":
        sim.send(stock, TxVote(GID, Vote.FAILED, "out of stock"))
    elif what == "gone":
        sim.detach(stock)
    else:
        sim.tick(4.0)
        sim.run()
        assert not _ended(shop)
        sim.tick(1.5)
    sim.run()
    assert _ended(shop) == [TxEnded("t1", Outcome.ABORTED, reason)]
    assert shop.acks.count("t1") == 1  # begun only
    assert _seen(consumers["billing"]) == []
    assert _seen(consumers["refunds"]) == [(0, "aborted"), (1, "aborted")]
    assert not sim.brokers["A"].journal.committed(GID)
    if what != "gone":
        assert _seen(stock)[2:] == [(0, "aborted"), (1, "aborted")]


@pytest.mark.parametrize("seed", range(3))
def test_a_consumer_may_mark_the_transaction_rollback_only(seed: int) -> None:
    sim, shop, consumers = _overlay(seed)
    _begin(sim, shop, 1)
    sim.send(consumers["audit"], TxVote(GID, Vote.ROLLBACK, "over the limit"))
    sim.run()
    assert GID in consumers["audit"].acks and not _ended(shop)  # it is open still
    sim.send(shop, TxCommit("t1", 1))
    sim.run()
    reason = "it was marked rollback-only by audit@B (over the limit)"
    assert _ended(shop) == [TxEnded("t1", Outcome.ABORTED, reason)]
    assert _seen(consumers["billing"]) == [] and _seen(consumers["refunds"]) == [(0, "aborted")]

    # while a commit waits for its vital consumers, a mark aborts it at once
    sim.send(shop, TxBegin("t2", ("stock",)))
    sim.send(shop, TxPublish("t2", Publication("q", {"class": "Order", "n": 5}, T0)))
    sim.send(shop, TxCommit("t2", 1))
    sim.run()
    assert _seen(consumers["stock"])[-1] == (5, "committing")
    sim.send(consumers["stock"], TxVote("shop@A:t2", Vote.ROLLBACK))
    sim.run()
    assert _ended(shop)[-1] == TxEnded(
        "t2", Outcome.ABORTED, "it was marked rollback-only by stock@C"
    )
    sim.send(consumers["stock"], TxVote("shop@A:t2", Vote.READY))  # over: nothing to vote on
    sim.run()
    assert consumers["stock"].errors[-1].ref == "shop@A:t2"


def test_a_client_votes_only_on_what_reached_it() -> None:
    sim, _, consumers = _overlay(0)
    sim.send(consumers["stock"], TxVote("shop@A:nothing", Vote.READY))
    sim.send(consumers["stock"], TxVote(GID, Vote.GONE))
    sim.run()
    texts = [e.text for e in consumers["stock"].errors]
    assert "no open transaction 'shop@A:nothing'" in texts[0]
    assert "votes ready, failed or rollback" in texts[1]


def test_a_broker_remembers_a_bounded_number_of_transactions_to_vote_on() -> None:
    counted: list[RouteTxVote] = []
    trees = Trees()
    trees.add(parse_advertisement("[class,eq,'Order']", id="a1"), "T", "producer", ("B",))

    def count(vote: RouteTxVote) -> list[Out]:
        counted.append(vote)
        return []

    votes = Votes(trees, {}, count)
    for n in range(MAX_REMEMBERED + 5):
        votes.delivered(f"shop@B:t{n}", "T", ["consumer"])
    assert votes.statistics() == {"transactions": MAX_REMEMBERED, "owed": MAX_REMEMBERED}
    session = Session("consumer", "consumer@B")
    assert isinstance(votes.vote(session, TxVote("shop@B:t0", Vote.READY))[0][1], Error)
    assert votes.vote(session, TxVote("shop@B:t5", Vote.READY)) == [("consumer", Ok("shop@B:t5"))]
    assert [v.tx for v in counted] == ["shop@B:t5"]  # counted here, the tree's root
    votes.gone(session)
    assert len(counted) == MAX_REMEMBERED and counted[-1].vote is Vote.GONE
    assert votes.statistics()["owed"] == 0


@pytest.mark.parametrize(
    ("message", "refusal"),
    [
        ({"type": "tx_begin", "tx": "t1", "vital": [f"c{i}" for i in range(101)]}, "length <= 100"),
        ({"type": "tx_begin", "tx": "t1", "wait": 601}, "<= 600.0"),
        ({"type": "tx_begin", "tx": "t1", "wait": 0}, "> 0"),
        ({"type": "tx_vote", "tx": GID, "vote": "ready", "reason": "r" * 1001}, "length <= 1000"),
        ({"type": "tx_vote", "tx": GID, "vote": "maybe"}, "unknown value 'maybe'"),
    ],
)
def test_votes_and_vital_groups_beyond_the_limits_are_refused_when_read(
    message: dict[str, object], refusal: str
) -> None:
    with pytest.raises(DecodeError, match=re.escape(refusal)):
        envelope_from_dict({"v": 1, **message})


def test_a_vital_consumer_at_the_producers_own_broker_votes_there() -> None:
    sim, shop, _ = _overlay(1)
    local = sim.attach("local", "A")
    sim.send(
        local, Subscribe(parse_subscription("[class,eq,'Order']", id="s"), Visibility.DEFERRED)
    )
    sim.run()
    _begin(sim, shop, 1, vital=("local@A",))
    sim.send(shop, TxCommit("t1", 1))
    sim.run()
    assert shop.acks.count("t1") == 1 and _seen(local) == [(0, "committing")]
    sim.send(local, TxVote(GID, Vote.READY))
    sim.run()
    assert shop.acks.count("t1") == 2 and _seen(local)[1:] == [(0, "committed")]
