"""A database node (``padres db``) controlled by DB_CONTROL publications, against a real broker;
its writer, which no publication and no database failure can stop."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest
from msgspec.structs import force_setattr

from historic import Store
from historic.node import Writer
from historic.store import Written
from padres.client.connection import Client, Delivery
from padres.model.messages import Filter, Predicate, Publication, Subscription, TimeWindow
from padres.model.protocol import Notify, ReplayBatch, ReplayEnd, ReplayRequest
from padres.testing.processes import BrokerProcess
from rete.operators import Op


@pytest.fixture
def broker() -> Iterator[str]:
    proc = BrokerProcess("B1")
    yield proc.start()
    proc.stop()


def _control(command: str, request: str, spec: str = "") -> str:
    spec_part = f",[spec,'{spec}']" if spec else ""
    return f"[class,'DB_CONTROL'],[db,'DB1'],[command,'{command}'],[request,'{request}']{spec_part}"


async def _status(replies: list[Delivery], request: str) -> dict[str, object]:
    for _ in range(200):
        for note in replies:
            if isinstance(note, Notify) and note.publication.attributes["request"] == request:
                return dict(note.publication.attributes)
        await asyncio.sleep(0.05)
    raise AssertionError(f"no DB_STATUS for {request}")


async def test_database_node_stores_what_it_is_told_once_and_stops(
    broker: str, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'db1.sqlite'}"
    db = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "padres.cli",
            "db",
            "--id",
            "DB1",
            "--broker",
            broker,
            "--url",
            url,
            "--quiet",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert db.stdout is not None
    assert "database DB1 attached to B1" in db.stdout.readline()
    try:
        await _scenario(broker)
    finally:
        db.terminate()
        _, err = db.communicate(timeout=10)
    assert db.returncode == 0, err
    store = Store(url)
    stored = store.query(Filter((Predicate("class", Op.EQ, "Order"),)))
    assert [p.id for p in stored] == ["o0", "o1", "o2", "o9"]  # o2 matched both specs: once
    assert all(p.publisher == "shop@B1" for p in stored)
    store.close()


async def _scenario(broker: str) -> None:
    async with Client(broker, "manager") as manager, Client(broker, "shop") as shop:
        replies: list[Delivery] = []
        await manager.subscribe("[class,eq,'DB_STATUS'],[db,eq,'DB1']", replies.append)
        await manager.advertise(
            "[class,eq,'DB_CONTROL'],[db,eq,'DB1'],[command,isPresent,''],[request,isPresent,'']"
        )
        await manager.advertise(
            "[class,eq,'DB_CONTROL'],[db,eq,'DB1'],[command,isPresent,''],"
            "[request,isPresent,''],[spec,isPresent,'']"
        )
        await shop.advertise("[class,eq,'Order'],[item,isPresent,''],[price,isPresent,0]")
        await manager.publish(
            _control("STORE", "r1", "[class,eq,\\'Order\\'],[item,eq,\\'shoes\\']")
        )
        assert (await _status(replies, "r1"))["ok"] is True
        await manager.publish(_control("STORE", "r2", "[class,eq,\\'Order\\'],[price,>,100]"))
        status = await _status(replies, "r2")
        assert status["ok"] is True and "[price,>,100]" in str(status["specs"])
        await manager.publish(_control("STORE", "r3", "[class,eq,\\'Order\\'],[price,>,\\'x\\']"))
        assert (await _status(replies, "r3"))["ok"] is False  # a bad spec is refused
        await manager.publish(_control("FLY", "r4"))
        assert "unknown command" in str((await _status(replies, "r4"))["detail"])
        for i, (item, price) in enumerate(
            [("shoes", 50), ("hat", 150), ("shoes", 200), ("hat", 5)]
        ):
            await shop.publish(f"[class,'Order'],[item,'{item}'],[price,{price}]", id=f"o{i}")
        # A round trip: the broker has passed the orders on before the next command.
        await shop.query("subscriptions")
        await manager.publish(_control("LIST", "r5"))
        assert str((await _status(replies, "r5"))["specs"]).count("\n") == 1  # two specs
        await manager.publish(
            _control("STOP", "r6", "[class,eq,\\'Order\\'],[item,eq,\\'shoes\\']")
        )
        assert (await _status(replies, "r6"))["ok"] is True
        await manager.publish(
            _control("STOP", "r7", "[class,eq,\\'Order\\'],[item,eq,\\'shoes\\']")
        )
        assert (await _status(replies, "r7"))["ok"] is False  # no longer stored
        await shop.publish("[class,'Order'],[item,'shoes'],[price,60]", id="late")
        await shop.publish("[class,'Order'],[item,'hat'],[price,300]", id="o9")
        await shop.query("subscriptions")
        await manager.publish(_control("LIST", "r8"))
        await _status(replies, "r8")


T = Filter((Predicate("class", Op.EQ, "T"),))


def _pub(ident: str) -> Publication:
    return Publication(ident, {"class": "T"}, datetime.now(UTC), "pub")


def _poison(ident: str) -> Publication:
    """A publication no database takes: its timestamp has no UTC equivalent (made around the
    check that refuses it, as input from elsewhere could be)."""
    pub = _pub(ident)
    force_setattr(pub, "timestamp", datetime.fromisoformat("0001-01-01T00:00:00+01:00"))
    return pub


async def _until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached in time")


async def test_the_writer_sets_a_poison_publication_aside_and_keeps_storing(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'w.sqlite'}")

    writer = Writer(store, "DB1", batch=10, flush_every=0.02)
    task = asyncio.get_running_loop().create_task(writer.run())
    for i in range(25):
        writer.put(_poison("bad") if i == 12 else _pub(f"a{i}"))
    await _until(lambda: writer.counts.stored == 24)
    for i in range(5):
        writer.put(_pub(f"b{i}"))  # after the poison: stored too
    await _until(lambda: writer.counts.stored == 29)
    task.cancel()
    assert (writer.counts.set_aside, writer.counts.failed, writer.counts.dropped) == (1, 0, 0)
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert len(store.query(T)) == 29
    assert [r.id for r in store.rejected()] == ["bad"]
    store.close()


async def test_the_writer_retries_a_locked_database_and_acknowledges_only_what_is_written(
    tmp_path: Path,
) -> None:
    path = tmp_path / "w.sqlite"
    store = Store(f"sqlite:///{path}?timeout=0.02")
    lock = sqlite3.connect(path, isolation_level=None)
    written: list[str] = []

    writer = Writer(store, "DB1", batch=4, flush_every=0.02)
    task = asyncio.get_running_loop().create_task(writer.run())
    lock.execute("BEGIN EXCLUSIVE")
    for i in range(10):
        writer.put(_pub(f"p{i}"), lambda i=i: written.append(f"p{i}"))  # type: ignore[misc]
    await _until(lambda: writer.counts.failed >= 2)  # tried, failed, tried again
    assert writer.counts.stored == 0 and writer.waiting == 10 and written == []
    lock.execute("ROLLBACK")
    await _until(lambda: writer.counts.stored == 10)  # the batch was kept, not lost
    assert written == [f"p{i}" for i in range(10)]  # acknowledged in order, once written
    for i in range(3):
        writer.put(_pub(f"q{i}"), lambda i=i: written.append(f"q{i}"))  # type: ignore[misc]
    task.cancel()
    lock.execute("BEGIN EXCLUSIVE")
    writer.close()  # at shutdown, one try: what is not written is not acknowledged
    lock.execute("ROLLBACK")
    assert writer.waiting == 0 and len(written) == 10
    with contextlib.suppress(asyncio.CancelledError):
        await task
    lock.close()
    assert len(store.query(T)) == 10
    store.close()


class _Held(Store):
    """A store whose writes wait for ``gate``, recording the size of each."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.sizes: list[int] = []

    def write(self, pubs: Sequence[Publication]) -> Written:
        self.entered.set()
        self.gate.wait(10)
        self.sizes.append(len(pubs))
        return super().write(pubs)


async def test_the_writer_groups_what_gathers_during_a_write_into_larger_commits(
    tmp_path: Path,
) -> None:
    store = _Held(f"sqlite:///{tmp_path / 'w.sqlite'}")
    written: list[int] = []

    writer = Writer(store, "DB1", batch=10, most=1000, flush_every=0.02)
    task = asyncio.get_running_loop().create_task(writer.run())
    for i in range(10):
        writer.put(_pub(f"p{i}"), lambda i=i: written.append(i))  # type: ignore[misc]
    await _until(store.entered.is_set)  # the first write has started, and waits
    for i in range(10, 2500):
        writer.put(_pub(f"p{i}"), lambda i=i: written.append(i))  # type: ignore[misc]
    store.gate.set()
    await _until(lambda: writer.counts.stored == 2500)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert store.sizes == [10, 1000, 1000, 490]  # one commit for each, at most ``most``
    assert written == list(range(2500))  # each acknowledged once, in order, once written
    assert store.count() == 2500
    store.close()


class _Answers:
    """Stands for a database node's client: keeps what the node answers."""

    def __init__(self) -> None:
        self.on_replay: object = None
        self.answers: list[ReplayBatch | ReplayEnd] = []

    async def answer(self, messages: list[ReplayBatch | ReplayEnd]) -> None:
        self.answers += messages


async def test_a_database_answers_nothing_older_than_the_requests_bound(tmp_path: Path) -> None:
    """The requester's broker puts its history grant's bound in the request (``not_before``);
    the database applies it whatever the window asks for."""
    from historic.node import DatabaseNode

    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    days = [datetime(2026, 1, d, tzinfo=UTC) for d in range(1, 11)]
    store.add([Publication(f"o{d.day}", {"class": "Order", "n": d.day}, d, "shop") for d in days])
    client = _Answers()
    node = DatabaseNode("DB1", client, store)  # type: ignore[arg-type]

    async def answered(window: TimeWindow | None, not_before: datetime | None) -> list[str]:
        flt = Filter((Predicate("class", Op.EQ, "Order"),), window)
        bound = None if not_before is None else not_before.timestamp()
        request = ReplayRequest(Subscription("r", flt), "t", "DB1@B1", 0.0, bound)
        client.answers.clear()
        await node.replies.answer(request)
        end = client.answers[-1]
        assert isinstance(end, ReplayEnd) and not end.error
        ids = [p.id for b in client.answers if isinstance(b, ReplayBatch) for p in b.publications]
        assert end.count == len(ids)
        return ids

    everything = TimeWindow(None, datetime(2027, 1, 1, tzinfo=UTC))
    assert await answered(everything, None) == [f"o{d}" for d in range(1, 11)]
    assert await answered(everything, days[6]) == ["o7", "o8", "o9", "o10"]
    assert await answered(TimeWindow(days[8], None), days[6]) == ["o9", "o10"]
    assert await answered(TimeWindow(days[0], days[5]), days[6]) == []
    store.close()


async def test_a_replay_that_fails_for_any_reason_ends_saying_why(tmp_path: Path) -> None:
    """Not only the store's own errors: whatever a replay raises ends it, so the requester is
    not left waiting for the broker's timeout."""
    from historic.node import DatabaseNode

    class Unreadable(Store):
        def stream(self, *args: object, **kwargs: object) -> Iterator[list[Publication]]:
            raise ValueError("a row that cannot be read")

    store = Unreadable(f"sqlite:///{tmp_path / 'db.sqlite'}")
    client = _Answers()
    node = DatabaseNode("DB1", client, store)  # type: ignore[arg-type]
    flt = Filter((Predicate("class", Op.EQ, "Order"),), TimeWindow(None, datetime.now(UTC)))
    await node.replies.answer(ReplayRequest(Subscription("r", flt), "t", "DB1@B1", 0.0))
    [end] = client.answers
    assert isinstance(end, ReplayEnd) and end.count == 0
    assert end.error == "query failed: ValueError: a row that cannot be read"
    store.close()


async def test_a_replay_whose_connection_is_lost_is_abandoned_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A lost connection is no bug of the replay: it is abandoned with a warning (the requester
    asks again), not ended with an error answer on a connection that may be back by then."""
    from historic.node import DatabaseNode
    from padres.errors import ConnectionLost

    class Dropping(_Answers):
        async def answer(self, messages: list[ReplayBatch | ReplayEnd]) -> None:
            if not self.answers:
                self.answers.append(messages[0])
                raise ConnectionLost("connection to ws://B1 closed")
            self.answers += messages

    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    stamp = datetime(2026, 1, 1, tzinfo=UTC)
    store.add([Publication("o1", {"class": "Order", "n": 1}, stamp, "shop@B1")])
    client = Dropping()
    node = DatabaseNode("DB1", client, store)  # type: ignore[arg-type]
    flt = Filter((Predicate("class", Op.EQ, "Order"),), TimeWindow(None, datetime.now(UTC)))
    await node.replies.answer(ReplayRequest(Subscription("r", flt), "t", "DB1@B1", 0.0))
    assert [type(m) for m in client.answers] == [ReplayBatch]  # nothing after the loss
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    assert any("abandoned" in r.getMessage() for r in caplog.records)
    store.close()
