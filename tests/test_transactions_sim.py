"""Transactions in the simulation: what each visibility sees of a commit, an abort and a lost
publisher, across a cyclic overlay, through interleavings chosen by seed."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path

import pytest
from argon2 import PasswordHasher
from msgspec.structs import replace

from padres.broker import Broker, Covering
from padres.broker.sqlite_journal import SqliteJournal
from padres.broker.transactions import TxLimits
from padres.language.parser import parse_advertisement, parse_composite, parse_subscription
from padres.model.classes import parse_attributes
from padres.model.codec import encode
from padres.model.messages import Publication, Unadvertise, Unsubscribe
from padres.model.protocol import (
    Ack,
    DeclareSchema,
    Durable,
    Error,
    Guaranteed,
    Notify,
    Outcome,
    Subscribe,
    TxAbort,
    TxBegin,
    TxCommit,
    TxEnded,
    TxNotify,
    TxPublish,
    Visibility,
)
from padres.runtime.simulation import SimClient, Simulation
from padres.security.accounts import Accounts, Credentials

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TRIANGLE = ["AB", "BC", "CA"]
VISIBILITIES = list(Visibility)


def _overlay(
    seed: int, covering: Covering = Covering.LAZY
) -> tuple[Simulation, SimClient, dict[Visibility, SimClient]]:
    """Brokers A, B, C in a cycle; a publisher at A; at B and C one subscriber per
    visibility."""
    sim = Simulation(seed, covering=covering)
    for name in "ABC":
        sim.add_broker(name)
    for link in TRIANGLE:
        sim.link(link[0], link[1])
    sim.run()
    shop = sim.attach("shop", "A")
    sim.send(shop, parse_advertisement("[class,eq,'Order'],[n,isPresent,0]", id="a1"))
    subscribers = {}
    for i, visibility in enumerate(VISIBILITIES):
        client = sim.attach(f"sub{i}", "BC"[i % 2])
        sub = parse_subscription("[class,eq,'Order']", id="s")
        sim.send(client, Subscribe(sub, visibility))
        subscribers[visibility] = client
    sim.run()
    return sim, shop, subscribers


def _order(n: int) -> Publication:
    return Publication(f"p{n}", {"class": "Order", "n": n}, T0)


def _seen(client: SimClient) -> list[tuple[int, str]]:
    """What a subscriber got: (n, outcome), "" for a publication outside any transaction."""
    return [
        (
            int(note.publication.attributes["n"]),
            note.outcome.value if isinstance(note, TxNotify) else "",
        )
        for note in client.notifications
    ]


def _transaction(sim: Simulation, shop: SimClient, tx: str, numbers: range) -> None:
    sim.send(shop, TxBegin(tx))
    for n in numbers:
        sim.send(shop, TxPublish(tx, _order(n)))


@pytest.mark.parametrize("seed", range(3))
def test_each_visibility_sees_a_commit_as_it_chose(seed: int) -> None:
    sim, shop, subs = _overlay(seed)
    _transaction(sim, shop, "t1", range(3))
    sim.run()
    assert _seen(subs[Visibility.IMMEDIATE]) == [(n, "pending") for n in range(3)]
    assert _seen(subs[Visibility.ON_COMMIT]) == []
    sim.send(shop, TxCommit("t1", 3))
    sim.run()
    assert "t1" in shop.acks
    committed = [(n, "committed") for n in range(3)]
    assert _seen(subs[Visibility.ON_COMMIT]) == committed
    assert _seen(subs[Visibility.IMMEDIATE]) == [(n, "pending") for n in range(3)] + committed
    assert _seen(subs[Visibility.ON_ABORT]) == []
    txs = {note.tx for c in subs.values() for note in c.notifications if isinstance(note, TxNotify)}
    assert txs == {"shop@A:t1"}


@pytest.mark.parametrize("seed", range(3))
def test_each_visibility_sees_an_abort_as_it_chose(seed: int) -> None:
    sim, shop, subs = _overlay(seed)
    _transaction(sim, shop, "t1", range(3))
    sim.send(shop, TxAbort("t1"))
    sim.run()
    assert "t1" in shop.acks
    aborted = [(n, "aborted") for n in range(3)]
    assert _seen(subs[Visibility.ON_COMMIT]) == []
    assert _seen(subs[Visibility.IMMEDIATE]) == [(n, "pending") for n in range(3)] + aborted
    assert _seen(subs[Visibility.ON_ABORT]) == aborted
    sim.send(shop, TxCommit("t1", 3))
    sim.run()
    ended = [m for m in shop.other if isinstance(m, TxEnded)]
    assert ended == [TxEnded("t1", Outcome.ABORTED, "aborted by its client")]


@pytest.mark.parametrize("seed", range(3))
def test_a_publisher_lost_mid_transaction_is_aborted_for_it(seed: int) -> None:
    sim, shop, subs = _overlay(seed)
    _transaction(sim, shop, "t1", range(2))
    sim.run()
    sim.detach(shop)
    sim.run()
    sim.tick(5.0)  # within the linger: the transaction, and the trees, wait for it
    sim.run()
    assert _seen(subs[Visibility.ON_ABORT]) == []
    assert len(sim.brokers["B"].trees) == 1
    sim.tick(6.0)
    sim.run()
    assert _seen(subs[Visibility.ON_COMMIT]) == []
    assert _seen(subs[Visibility.IMMEDIATE])[-2:] == [(0, "aborted"), (1, "aborted")]
    assert _seen(subs[Visibility.ON_ABORT]) == [(0, "aborted"), (1, "aborted")]
    assert all(len(b.transactions) == 0 for b in sim.brokers.values())
    assert all(len(b.trees) == 0 for b in sim.brokers.values())  # the advertisement is gone


@pytest.mark.parametrize(("seed", "covering"), [(0, Covering.LAZY), (1, Covering.OFF)])
def test_a_publisher_back_in_time_commits(seed: int, covering: Covering) -> None:
    sim, shop, subs = _overlay(seed, covering)
    _transaction(sim, shop, "t1", range(2))
    sim.run()
    sim.detach(shop)
    sim.run()
    sim.tick(5.0)
    sim.reattach(shop)
    sim.send(shop, parse_advertisement("[class,eq,'Order'],[n,isPresent,0]", id="a1"))
    sim.send(shop, TxPublish("t1", _order(2)))
    sim.send(shop, TxCommit("t1", 3))
    sim.run()
    sim.tick(6.0)
    sim.run()
    assert shop.acks.count("t1") == 2  # begin, commit
    committed = [(n, "committed") for n in range(3)]
    assert _seen(subs[Visibility.ON_COMMIT]) == committed
    assert _seen(subs[Visibility.IMMEDIATE])[-3:] == committed
    assert _seen(subs[Visibility.ON_ABORT]) == []
    sim.send(shop, _order(9))  # the new advertisement routes, the held one is gone
    sim.run()
    assert _seen(subs[Visibility.ON_COMMIT])[-1] == (9, "")
    assert all(len(b.trees) == 1 for b in sim.brokers.values())


def test_a_commit_missing_what_a_lost_connection_took_aborts() -> None:
    sim, shop, subs = _overlay(0)
    _transaction(sim, shop, "t1", range(1))
    sim.run()
    sim.send(shop, TxPublish("t1", _order(1)))
    sim.detach(shop)  # before the broker read it
    sim.reattach(shop)
    sim.send(shop, parse_advertisement("[class,eq,'Order'],[n,isPresent,0]", id="a1"))
    sim.send(shop, TxCommit("t1", 2))
    sim.run()
    ended = [m for m in shop.other if isinstance(m, TxEnded)]
    assert ended and "1 of its 2 publications were lost on the way" in ended[0].reason
    assert _seen(subs[Visibility.ON_ABORT]) == [(0, "aborted")]


def test_plain_publications_reach_every_visibility() -> None:
    sim, shop, subs = _overlay(0)
    sim.send(shop, _order(7))
    sim.run()
    for client in subs.values():
        assert _seen(client) == [(7, "")]
        assert type(client.notifications[0]) is Notify


def test_composite_subscriptions_see_committed_publications_only() -> None:
    sim, shop, _ = _overlay(1)
    watcher = sim.attach("watcher", "C")
    both = "{[class,eq,'Order'],[n,=,0]} & {[class,eq,'Order'],[n,=,1]}"
    sim.send(watcher, parse_composite(both, id="c"))
    sim.run()
    _transaction(sim, shop, "t1", range(2))
    sim.send(shop, TxAbort("t1"))
    sim.run()
    assert watcher.composites == []
    _transaction(sim, shop, "t2", range(2))
    sim.run()
    assert watcher.composites == []
    sim.send(shop, TxCommit("t2", 2))
    sim.run()
    assert len(watcher.composites) == 1


def test_an_idle_transaction_is_aborted_and_its_client_told() -> None:
    sim, shop, subs = _overlay(2)
    sim.brokers["A"].transactions.limits = TxLimits(timeout=30.0)
    _transaction(sim, shop, "t1", range(1))
    sim.run()
    sim.tick(31.0)
    sim.run()
    ended = [m for m in shop.other if isinstance(m, TxEnded)]
    assert ended == [TxEnded("t1", Outcome.ABORTED, "it was idle for more than 30 s")]
    assert _seen(subs[Visibility.ON_ABORT]) == [(0, "aborted")]


def test_limits_refuse_with_a_clear_answer() -> None:
    sim, shop, subs = _overlay(0)
    sim.brokers["A"].transactions.limits = TxLimits(max_open=1, max_publications=2)
    _transaction(sim, shop, "t1", range(3))
    sim.send(shop, TxBegin("t2"))
    sim.run()
    ended = {m.tx: m for m in shop.other if isinstance(m, TxEnded)}
    assert ended["t1"].limit and "more than 2 publications" in ended["t1"].reason
    assert _seen(subs[Visibility.ON_ABORT]) == [(0, "aborted"), (1, "aborted")]
    assert "t2" in shop.acks  # t1 was over by then
    sim.send(shop, TxBegin("t3"))
    sim.run()
    assert ended.keys() == {"t1"}
    refused = [m for m in shop.other if isinstance(m, TxEnded) and m.tx == "t3"]
    assert refused[0].limit and "too many open transactions" in refused[0].reason


def test_one_client_cannot_take_the_whole_budget_of_the_broker() -> None:
    sim, shop, _ = _overlay(1)

    def size(n: int) -> int:
        return len(encode(replace(_order(n), publisher="shop@A")))

    limits = TxLimits(max_client_bytes=3 * size(0), max_total_bytes=100 * size(0))
    sim.brokers["A"].transactions.limits = limits
    _transaction(sim, shop, "t1", range(2))
    _transaction(sim, shop, "t2", range(10, 12))  # the client's fourth publication held
    sim.run()
    ended = [m for m in shop.other if isinstance(m, TxEnded)]
    assert [m.tx for m in ended] == ["t2"] and ended[0].limit
    assert "(the broker's limit per client)" in ended[0].reason
    assert sim.brokers["A"].transactions.statistics()["bytes"] == size(0) + size(1)


def test_the_bytes_of_all_open_transactions_are_bounded() -> None:
    sim, shop, _ = _overlay(1)

    def size(n: int) -> int:
        return len(encode(replace(_order(n), publisher="shop@A")))

    limits = TxLimits(max_total_bytes=3 * size(0))
    sim.brokers["A"].transactions.limits = limits
    _transaction(sim, shop, "t1", range(2))
    _transaction(sim, shop, "t2", range(10, 12))  # its second publication is one too many
    sim.send(shop, TxCommit("t1", 2))
    _transaction(sim, shop, "t3", range(20, 22))  # t1 is over: room again
    sim.run()
    ended = [m for m in shop.other if isinstance(m, TxEnded)]
    assert [m.tx for m in ended] == ["t2"] and ended[0].limit
    assert f"the broker holds {3 * size(0)} bytes of open transactions" in ended[0].reason
    assert shop.acks.count("t1") == 2 and shop.acks.count("t3") == 1
    assert sim.brokers["A"].transactions.statistics()["bytes"] == size(20) + size(21)


def test_unknown_and_finished_transactions_are_refused() -> None:
    sim, shop, _ = _overlay(0)
    sim.send(shop, TxCommit("nope", 0))
    _transaction(sim, shop, "t1", range(1))
    sim.send(shop, TxCommit("t1", 1))
    sim.send(shop, TxPublish("t1", _order(5)))
    sim.send(shop, TxCommit("t1", 1))  # again: an acknowledgement lost, say
    sim.send(shop, TxAbort("t1"))
    sim.run()
    texts = [(e.ref, e.text) for e in shop.errors]
    assert ("nope", "no transaction 'nope' (a restart of the broker ends them)") in texts
    assert ("p5", "transaction 't1' is committed: publication 'p5' refused") in texts
    assert ("t1", "transaction 't1' is committed") in texts
    assert shop.acks.count("t1") == 3  # begin, commit, commit again


def test_a_commit_missing_publications_aborts() -> None:
    sim, shop, subs = _overlay(0)
    _transaction(sim, shop, "t1", range(2))
    sim.send(shop, TxCommit("t1", 3))
    sim.run()
    ended = [m for m in shop.other if isinstance(m, TxEnded)]
    assert ended and "1 of its 3 publications were lost on the way" in ended[0].reason
    assert _seen(subs[Visibility.ON_COMMIT]) == []


@pytest.mark.parametrize("seed", range(3))
def test_a_durable_subscriber_gets_a_commit_once_through_a_crash_of_its_broker(seed: int) -> None:
    sim, shop, _ = _overlay(seed)
    keeper = sim.attach("keeper", "C")
    sim.send(keeper, Durable(parse_subscription("[class,eq,'Order']", id="d")))
    aborter = sim.attach("aborter", "B")
    sub = parse_subscription("[class,eq,'Order']", id="d")
    sim.send(aborter, Durable(sub, visibility=Visibility.ON_ABORT))
    watcher = sim.attach("watcher", "B")
    sim.send(watcher, Durable(sub, visibility=Visibility.IMMEDIATE))
    sim.run()
    _transaction(sim, shop, "t1", range(2))
    sim.send(shop, TxAbort("t1"))
    _transaction(sim, shop, "t2", range(10, 13))
    sim.run()
    sim.crash("C")  # the commit reaches C only through recovery
    sim.send(shop, TxCommit("t2", 3))
    sim.run()
    sim.add_broker("C")
    sim.link("C", "A")
    sim.link("C", "B")
    sim.reattach(keeper)
    sim.send(keeper, Durable(parse_subscription("[class,eq,'Order']", id="d")))
    for _ in range(3):
        sim.run()
        sim.tick(11.0)
    sim.run()
    got = [
        (int(n.publication.attributes["n"]), n.outcome.value if isinstance(n, TxNotify) else "")
        for n in keeper.notifications
    ]
    assert got == [(10, "committed"), (11, "committed"), (12, "committed")]
    assert [n.seq for n in keeper.notifications] == [1, 2, 3]
    sim.send(keeper, Ack("d", 3))
    assert _seen(aborter) == [(0, "aborted"), (1, "aborted")]
    assert _seen(watcher) == [
        *[(n, "pending") for n in range(2)],
        *[(n, "aborted") for n in range(2)],
        *[(n, "pending") for n in range(10, 13)],
        *[(n, "committed") for n in range(10, 13)],
    ]
    assert [n.seq for n in watcher.notifications] == list(range(1, 11))
    assert not [e for e in keeper.errors if isinstance(e, Error)]


def test_a_journal_written_before_transactions_opens_and_takes_them(tmp_path: Path) -> None:
    path = str(tmp_path / "journal.sqlite")
    old = SqliteJournal(path)
    old.close()
    with closing(sqlite3.connect(path)) as db, db:  # the tables as before transactions
        for table in ("log", "runs", "durables"):
            db.execute(f"DROP TABLE {table}")
        db.executescript(
            "CREATE TABLE log (pos INTEGER PRIMARY KEY, tree TEXT NOT NULL, "
            "publisher TEXT NOT NULL, id TEXT NOT NULL, at REAL NOT NULL, body BLOB NOT NULL);"
            "CREATE TABLE durables (owner TEXT NOT NULL, name TEXT NOT NULL, "
            "subscription BLOB NOT NULL, cursors BLOB NOT NULL, next INTEGER NOT NULL, "
            "acked INTEGER NOT NULL, discarded INTEGER NOT NULL, created REAL NOT NULL, "
            "PRIMARY KEY (owner, name));"
            "CREATE TABLE queue (owner TEXT NOT NULL, name TEXT NOT NULL, seq INTEGER NOT NULL, "
            "size INTEGER NOT NULL, body BLOB NOT NULL, PRIMARY KEY (owner, name, seq));"
        )
        db.execute(
            "INSERT INTO durables VALUES ('m@B', 'd', ?, '{}', 1, 0, 0, 0.0)",
            (b'{"type":"subscription","id":"d","filter":[["class","eq","Order"]]}',),
        )
    journal = SqliteJournal(path)
    (record,) = journal.durables()
    assert record.visibility is Visibility.ON_COMMIT
    journal.append("t", _order(1), 0.0)
    journal.append("t", _order(2), 0.0, tx="m@B:t1")
    journal.enqueue(record, 1, _order(2), ("m@B:t1", Outcome.COMMITTED))
    journal.commit()
    rows, _ = journal.since("t", 0, 10)
    assert [(pos, tx) for pos, _, tx in rows] == [(1, ""), (2, "m@B:t1")]
    assert journal.committed("m@B:t1") and not journal.committed("m@B:t2")
    tags = [tag for _, _, tag, _ in journal.queued(record, 0, 10)]
    assert tags == [("m@B:t1", Outcome.COMMITTED)]
    journal.close()


def test_a_commit_the_journal_fails_on_writes_none_of_it(monkeypatch: pytest.MonkeyPatch) -> None:
    sim, shop, subs = _overlay(2)
    _transaction(sim, shop, "t1", range(3))
    sim.run()
    journal = sim.brokers["A"].journal
    append = journal.append
    calls = 0

    def failing(tree: str, pub: Publication, at: float, tx: str = "") -> tuple[int, bool]:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise sqlite3.OperationalError("disk I/O error")
        return append(tree, pub, at, tx)

    monkeypatch.setattr(journal, "append", failing)
    broker = sim.brokers["A"]
    broker.handle(Guaranteed(_order(99)), "shop", sim.clock)  # earlier in the same frame
    with pytest.raises(sqlite3.OperationalError):
        broker.handle(TxCommit("t1", 3), "shop", sim.clock)
    journal.commit()  # as the runtime does once the frame is handled
    assert not journal.committed("shop@A:t1")
    assert [pub.id for _, pub, _ in journal.since(_tree(broker), 0, 10)[0]] == ["p99"]
    monkeypatch.setattr(journal, "append", append)
    sim.send(shop, TxCommit("t1", 3))  # asked again, once the disk is back
    sim.run()
    assert journal.committed("shop@A:t1") and journal.head == 4
    assert _seen(subs[Visibility.ON_COMMIT]) == [(n, "committed") for n in range(3)]


def _tree(broker: Broker) -> str:
    (tree,) = broker.trees
    return tree.id


def test_a_restarted_broker_knows_committed_transactions_and_forgets_open_ones() -> None:
    sim, shop, _ = _overlay(4)
    _transaction(sim, shop, "t1", range(2))
    sim.send(shop, TxCommit("t1", 2))
    _transaction(sim, shop, "t2", range(5, 7))
    sim.run()
    sim.crash("A")
    sim.add_broker("A")
    sim.link("A", "B")
    sim.link("C", "A")
    sim.reattach(shop)
    sim.send(shop, TxCommit("t1", 2))  # its acknowledgement was lost with the broker, say
    sim.send(shop, TxCommit("t2", 2))
    sim.run()
    assert shop.acks.count("t1") == 3  # begin, commit, and the commit asked again
    assert [(e.ref, e.text) for e in shop.errors] == [
        ("t2", "no transaction 't2' (a restart of the broker ends them)")
    ]


def test_a_transaction_spans_the_trees_of_several_advertisements() -> None:
    sim, shop, subs = _overlay(5)
    sim.send(shop, parse_advertisement("[class,eq,'Payment'],[n,isPresent,0]", id="a2"))
    billing = sim.attach("billing", "C")
    sim.send(billing, parse_subscription("[class,eq,'Payment']", id="s"))
    sim.run()
    sim.send(shop, TxBegin("t1"))
    sim.send(shop, TxPublish("t1", _order(1)))
    sim.send(shop, TxPublish("t1", Publication("p2", {"class": "Payment", "n": 2}, T0)))
    sim.run()
    assert billing.notifications == [] and _seen(subs[Visibility.ON_COMMIT]) == []
    sim.send(shop, TxCommit("t1", 2))
    sim.run()
    assert _seen(billing) == [(2, "committed")]
    assert _seen(subs[Visibility.ON_COMMIT]) == [(1, "committed")]


def _refusal(client: SimClient) -> str:
    """Why the broker aborted the client's transaction (the first it told of)."""
    ended = [m for m in client.other if isinstance(m, TxEnded)]
    assert ended and ended[0].outcome is Outcome.ABORTED
    return ended[0].reason


def test_a_publisher_back_in_time_but_idle_keeps_its_transaction() -> None:
    sim, shop, subs = _overlay(0)
    _transaction(sim, shop, "t1", range(1))
    sim.run()
    sim.detach(shop)
    sim.run()
    sim.tick(2.0)
    sim.reattach(shop)  # back 2 s into a 10 s linger, and publishing nothing more
    sim.send(shop, parse_advertisement("[class,eq,'Order'],[n,isPresent,0]", id="a1"))
    sim.run()
    sim.tick(9.0)  # 11 s after the loss
    sim.run()
    sim.send(shop, TxCommit("t1", 1))
    sim.run()
    assert not [m for m in shop.other if isinstance(m, TxEnded)]
    assert _seen(subs[Visibility.ON_COMMIT]) == [(0, "committed")]


def test_a_subscription_with_a_time_window_sees_committed_publications_only() -> None:
    sim, _, subs = _overlay(0)
    reader = subs[Visibility.ON_COMMIT]
    window = "[time,>=,'2025-12-30T00:00:00+00:00'],[time,<,'2025-12-31T00:00:00+00:00']"
    historic = parse_subscription(f"[class,eq,'Order'],{window}", id="h")
    sim.send(reader, Subscribe(historic, Visibility.ON_ABORT))
    sim.run()
    assert [(e.ref, e.text) for e in reader.errors] == [
        (
            "h",
            "subscription 'h' has a time window: it sees committed publications only, it "
            "cannot have visibility on_abort",
        )
    ]


def test_a_subscription_ended_forgets_its_visibility() -> None:
    sim, shop, subs = _overlay(1)
    watcher = subs[Visibility.ON_ABORT]
    session = next(s for s in sim.brokers["B"].sessions.values() if s.name == "sub2@B")
    assert session.visibility == {"s": Visibility.ON_ABORT}
    sim.send(watcher, Unsubscribe("s"))
    sim.send(watcher, parse_subscription("[class,eq,'Order']", id="s"))  # on_commit
    sim.run()
    assert session.visibility == {}
    _transaction(sim, shop, "t1", range(1))
    sim.send(shop, TxAbort("t1"))
    sim.run()
    assert _seen(watcher) == []


def test_unadvertising_what_an_open_transaction_publishes_aborts_it() -> None:
    sim, shop, subs = _overlay(2)
    sim.send(shop, parse_advertisement("[class,eq,'Payment'],[n,isPresent,0]", id="a2"))
    keeper = sim.attach("keeper", "C")
    sim.send(keeper, Durable(parse_subscription("[class,eq,'Order']", id="d")))
    sim.run()
    _transaction(sim, shop, "t1", range(2))
    sim.send(shop, Unadvertise("a2"))  # no publication of t1 needs it
    sim.run()
    assert not [m for m in shop.other if isinstance(m, TxEnded)]
    sim.send(shop, Unadvertise("a1"))
    sim.run()
    assert _refusal(shop) == "the advertisement its publication 'p0' conforms to was withdrawn"
    sim.send(shop, TxCommit("t1", 2))
    sim.run()
    assert shop.acks.count("t1") == 1  # its begin only
    assert _seen(subs[Visibility.ON_ABORT]) == [(0, "aborted"), (1, "aborted")]
    assert _seen(subs[Visibility.ON_COMMIT]) == [] and keeper.notifications == []


def test_a_publication_id_used_before_aborts_the_transaction() -> None:
    sim, shop, subs = _overlay(3)
    sim.send(shop, Guaranteed(_order(1)))
    sim.run()
    _transaction(sim, shop, "t1", range(1, 2))  # p1 again
    sim.run()
    reused = "publication id {!r} was used by shop@A already (ids must not be reused)"
    assert _refusal(shop) == reused.format("p1")
    shop.other.clear()
    _transaction(sim, shop, "t2", range(2, 3))
    sim.send(shop, Guaranteed(_order(2)))  # meanwhile, outside the transaction
    sim.send(shop, TxCommit("t2", 1))
    sim.run()
    assert _refusal(shop) == reused.format("p2")
    assert _seen(subs[Visibility.ON_COMMIT]) == [(1, ""), (2, "")]


def test_a_publication_id_twice_in_a_transaction_aborts_it() -> None:
    sim, shop, subs = _overlay(4)
    sim.send(shop, TxBegin("t1"))
    sim.send(shop, TxPublish("t1", _order(1)))
    sim.send(shop, TxPublish("t1", replace(_order(1), attributes={"class": "Order", "n": 2})))
    sim.send(shop, TxCommit("t1", 2))
    sim.run()
    assert _refusal(shop) == "publication id 'p1' is used twice in it (ids must not be reused)"
    assert _seen(subs[Visibility.ON_ABORT]) == [(1, "aborted")]


def test_a_publication_the_schema_refuses_aborts_its_transaction_at_once() -> None:
    sim, shop, subs = _overlay(5)
    sim.send(shop, DeclareSchema("d", "Order", parse_attributes("n:integer")))
    sim.run()
    _transaction(sim, shop, "t1", range(1))
    sim.send(shop, TxPublish("t1", Publication("p9", {"class": "Order", "n": "nine"}, T0)))
    sim.run()
    refusal = [e.text for e in shop.errors]
    assert refusal and "expected integer" in refusal[0]
    assert _refusal(shop) == f"a publication in it was refused: {refusal[0]}"
    assert _seen(subs[Visibility.ON_ABORT]) == [(0, "aborted")]


def test_a_commit_counting_fewer_publications_than_were_made_aborts() -> None:
    sim, shop, _ = _overlay(6)
    _transaction(sim, shop, "t1", range(2))
    sim.send(shop, TxCommit("t1", 1))
    sim.run()
    assert _refusal(shop) == "its commit counts 1 publications, but the broker holds 2"


def test_guaranteed_and_transactional_publications_conform_without_the_conformity_check() -> None:
    sim = Simulation(0, conformity=False)
    sim.add_broker("A")
    shop = sim.attach("shop", "A")
    sim.send(shop, parse_advertisement("[class,eq,'Order']", id="a1"))
    watcher = sim.attach("watcher", "A")
    sim.send(watcher, parse_subscription("[class,eq,'Payment']", id="s"))
    sim.run()
    payment: dict[str, str | int] = {"class": "Payment", "n": 1}
    sim.send(shop, Guaranteed(Publication("g", payment, T0)))
    sim.send(shop, TxBegin("t1"))
    sim.send(shop, TxPublish("t1", Publication("x", payment, T0)))
    sim.send(shop, TxCommit("t1", 1))
    sim.send(shop, Publication("plain", payment, T0))  # still let through: plain
    sim.run()
    assert [(e.ref, e.text) for e in shop.errors] == [
        ("g", "guaranteed publication 'g' conforms to none of your advertisements")
    ]
    assert _refusal(shop) == "publication 'x' conforms to none of your advertisements"
    assert [n.publication.id for n in watcher.notifications] == ["plain"]
    assert sim.brokers["A"].journal.head == 0


def test_an_atomic_write_outside_a_transaction_waits_for_the_commit(tmp_path: Path) -> None:
    journal = SqliteJournal(str(tmp_path / "journal.sqlite"))
    with journal.atomic():
        journal.append("t", replace(_order(1), publisher="m@A"), 0.0, tx="m@A:t1")
    journal.rollback()  # what a crash before the frame's commit does
    assert not journal.committed("m@A:t1") and journal.head == 0
    with journal.atomic():
        journal.append("t", replace(_order(1), publisher="m@A"), 0.0, tx="m@A:t1")
    journal.commit()
    assert journal.committed("m@A:t1")
    journal.close()


def test_an_empty_transaction_leaves_no_trace_through_a_restart() -> None:
    sim, shop, _ = _overlay(7)
    sim.send(shop, TxBegin("t1"))
    sim.send(shop, TxCommit("t1", 0))
    sim.run()
    assert shop.acks.count("t1") == 2
    sim.crash("A")
    sim.add_broker("A")
    sim.reattach(shop)
    sim.send(shop, TxCommit("t1", 0))
    sim.run()
    assert [(e.ref, e.text) for e in shop.errors] == [
        ("t1", "no transaction 't1' (a restart of the broker ends them)")
    ]


def test_a_publication_a_grant_refuses_aborts_its_transaction_at_once(tmp_path: Path) -> None:
    cheap = PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)
    accounts = Accounts(tmp_path / "accounts.toml", hasher=cheap, create=True)
    accounts.add("shop", "shop-pw")
    accounts.grant("shop", "advertise", "[class,eq,'Order']")
    accounts.grant("shop", "publish", "[class,eq,'Order'],[n,<,10]")
    sim = Simulation(0, accounts=accounts)
    sim.add_broker("A")
    shop = sim.attach("shop", "A", Credentials("shop", "shop-pw"))
    sim.send(shop, parse_advertisement("[class,eq,'Order'],[n,isPresent,0]", id="a1"))
    sim.run()
    _transaction(sim, shop, "t1", range(9, 11))  # 10 is not granted
    sim.run()
    refusal = [e.text for e in shop.errors]
    assert len(refusal) == 1 and "no publish grant matches it" in refusal[0]
    assert _refusal(shop) == f"a publication in it was refused: {refusal[0]}"
