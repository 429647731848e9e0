"""Consuming into the application's own database transaction (``historic.inbox``), on SQLite and
on PostgreSQL (when a server is reachable at 127.0.0.1:5432): each delivery of a durable
subscription has exactly one effect, in order, with the consumer killed (SIGKILL) over and over
at random points, between its write and its commit, between its commit and its acknowledgement,
and with its broker killed and restarted meanwhile."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy
from sqlalchemy.orm import Session

from historic.errors import InboxError
from historic.inbox import AtomicConsumer, Position, TransactionalInbox
from padres.client.connection import Client
from padres.model.messages import Origin, Publication
from padres.model.protocol import Notify
from padres.testing.processes import BrokerProcess, free_ports
from tests.inbox_app import FILTER, app, applied
from tests.postgres import database_url, drop_schema
from tests.support import eventually

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
ADVERTISEMENT = "[class,eq,'Order'],[tag,isPresent,''],[n,isPresent,0]"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker process on a port of its own, its journal on disk, to restart on it."""
    data = tmp_path_factory.mktemp("broker")
    proc = BrokerProcess(
        "B", port=free_ports(1)[0], options=["--heartbeat", "1", "--data", str(data)]
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The consumer's database, with its table of applied orders and its inbox: its URL."""
    schema = f"padres_inbox_{os.getpid()}"
    url = database_url(request.param, schema, tmp_path / "warehouse.sqlite")
    engine = sqlalchemy.create_engine(url)
    app.create_all(engine)
    TransactionalInbox(engine).create()
    engine.dispose()
    yield url
    if request.param == "postgresql":
        drop_schema(schema)


def _apart(database: str, tag: str) -> str:
    """``tag`` for the tests on ``database``'s kind: they share the broker, not its names."""
    return f"{tag}{database.split(':')[0].split('+')[0]}"


def _applied(engine: sqlalchemy.Engine, tag: str) -> list[int]:
    """The orders applied, in the order they were."""
    query = sqlalchemy.select(applied.c.n).where(applied.c.tag == tag).order_by(applied.c.row)
    with engine.connect() as conn:
        return [n for (n,) in conn.execute(query)]


async def _publish(url: str, tag: str, total: int) -> None:
    async with Client(url, f"shop-{tag}", reconnect=True) as shop:
        await shop.advertise(ADVERTISEMENT)
        for n in range(1, total + 1):
            await shop.publish({"class": "Order", "tag": tag, "n": n}, guaranteed=True)
        await shop.flush(60)


async def test_a_delivery_and_its_record_commit_together(
    database: str, broker: BrokerProcess
) -> None:
    """Applied once each, in order, through a Connection or a Session; a handler that fails
    rolls its writes back with the record, and is tried again; what the broker sends again is
    recognised; a consumer resumes only at the broker where its subscription lives."""
    engine = sqlalchemy.create_engine(database)
    inbox = TransactionalInbox(engine)
    failures = [RuntimeError("the warehouse is busy")]
    tag, name = _apart(database, "s"), f"warehouse-{_apart(database, 's')}"

    def apply(session: Session, note: Notify) -> None:
        n = note.publication.attributes["n"]
        session.execute(applied.insert().values(tag=tag, n=n))
        if n == 2 and failures:
            raise failures.pop()

    try:
        async with Client(broker.url, name, reconnect=True) as client:
            consumer = AtomicConsumer(
                client, inbox, "orders", FILTER.format(tag=tag), apply, session=True, backoff=0.01
            )
            async with consumer:
                await _publish(broker.url, tag, 5)
                await eventually(lambda: consumer.applied == 5)
            assert _applied(engine, tag) == [1, 2, 3, 4, 5] and consumer.skipped == 0
            assert not failures  # the failed attempt was rolled back, and tried again
            position = inbox.position(name, "orders", client.broker)
            assert position.seq == 5 and len(position.taken) == 1

            # a delivery sent again (its acknowledgement lost) changes nothing
            now = datetime.now(UTC)
            pub = Publication("again", {"class": "Order", "tag": tag, "n": 5}, now)
            with engine.begin() as conn:
                assert not inbox.consume(conn, name, "orders", Notify(pub, ("orders",), 5))
                producer = next(iter(position.taken))
                retried = Publication("x", pub.attributes, now, origin=Origin(producer, 3))
                assert not inbox.consume(conn, name, "orders", Notify(retried, ("orders",)))
                fresh = Publication("y", pub.attributes, now, origin=Origin(producer, 6))
                assert inbox.consume(conn, name, "orders", Notify(fresh, ("orders",)))
                conn.rollback()
            assert inbox.position(name, "orders", client.broker).seq == 5

        with engine.begin() as conn:  # the row says it lives at another broker
            conn.execute(inbox.table.update().values(broker="elsewhere"))
        async with Client(broker.url, name) as client:
            with pytest.raises(InboxError, match="lives at broker elsewhere"):
                await AtomicConsumer(client, inbox, "orders", FILTER, apply).start()
        async with Client([broker.url, "ws://127.0.0.1:1"], name) as client:
            with pytest.raises(InboxError, match=r"give client .* one broker's URL, not 2"):
                await AtomicConsumer(client, inbox, "orders", FILTER, apply).start()
        inbox.forget(name, "orders")  # ended for good: a new subscription starts from nothing
        assert inbox.position(name, "orders", "B") == Position("B")
    finally:
        engine.dispose()


def _spawn(
    database: str, url: str, tag: str, mode: str, die: int, total: int
) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "tests.inbox_app", database, url, f"warehouse-{tag}", tag]
    return subprocess.Popen(
        [*command, mode, str(die), str(total)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=None,
    )


async def _ready(proc: subprocess.Popen[bytes]) -> bool:
    """Whether the consumer made its subscription (False: it died before)."""
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
    return line.strip() == b"ready"


async def test_a_consumer_killed_at_random_points_applies_each_delivery_once_in_order(
    database: str, broker: BrokerProcess
) -> None:
    """A stream of guaranteed publications; the consumer process is killed (SIGKILL) over and
    over, at a random point of the stream: in the middle of its transaction, right after its
    commit, or from outside whatever it is doing once it has come that far, and started
    again; in the second round its broker is killed too, and restarted on its journal, while
    the consumer runs. Every publication is applied exactly
    once, in order. ``PADRES_TEST_KILLS``: how many times (3 by default, one of each kind),
    ``PADRES_TEST_PUBLICATIONS`` how many (100 for every 3 kills by default),
    ``PADRES_TEST_SEED`` the random choices."""
    rounds = int(os.environ.get("PADRES_TEST_KILLS", "3"))  # more for a longer run
    total = int(os.environ.get("PADRES_TEST_PUBLICATIONS", 100 * max(1, rounds // 3)))
    tag = _apart(database, "k")
    rng = random.Random(int(os.environ.get("PADRES_TEST_SEED", "7")))
    engine = sqlalchemy.create_engine(database)
    publisher: asyncio.Task[None] | None = None
    kills: dict[str, int] = {"write": 0, "commit": 0, "outside": 0}
    modes = [mode for mode in kills for _ in range(rounds // len(kills))]
    rng.shuffle(modes)
    try:
        for number, mode in enumerate(modes, 1):
            done = len(_applied(engine, tag))
            # A dying point before the end of the stream, with room left for the later rounds.
            room = max(1, (total - done) // (len(modes) - number + 2))
            die = done + rng.randint(1, room)
            proc = _spawn(database, broker.url, tag, mode, die, total)
            try:
                if await _ready(proc) and publisher is None:
                    publisher = asyncio.create_task(_publish(broker.url, tag, total))
                if mode == "outside":  # once it has come that far, whatever it is doing then
                    while len(_applied(engine, tag)) < die and proc.poll() is None:
                        await asyncio.sleep(0.002)
                    proc.kill()
                if number == 2:
                    await asyncio.sleep(rng.uniform(0.0, 0.1))
                    broker.kill()
                    await asyncio.to_thread(broker.start)
                code = await asyncio.to_thread(proc.wait, 60)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                assert proc.stdout is not None
                proc.stdout.close()
            assert code in (-9, 0), f"the consumer failed (exit status {code})"
            if code == -9:
                kills[mode] += 1
        proc = _spawn(database, broker.url, tag, "run", 0, total)  # the last one, left to finish
        assert await asyncio.to_thread(proc.wait, max(60, total // 20)) == 0
        assert proc.stdout is not None
        proc.stdout.close()
        assert publisher is not None
        await publisher
        assert _applied(engine, tag) == list(range(1, total + 1))
        assert kills["write"] and kills["commit"] and kills["outside"], kills
    finally:
        if publisher is not None and not publisher.done():
            publisher.cancel()
        engine.dispose()
