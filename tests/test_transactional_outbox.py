"""Publishing from the application's own database transaction, on SQLite and on PostgreSQL (when
a server is reachable at 127.0.0.1:5432): what commits is published exactly once to a durable
subscriber, even when the application is killed between its commit and the publishing or
between the publishing and the clean-up; what rolls back never is."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import sqlalchemy
from sqlalchemy.orm import Session

from historic.errors import OutboxError
from historic.outbox import OutboxRelay, TransactionalOutbox
from padres.client.connection import Client
from padres.errors import RequestFailed
from tests.outbox_app import ADVERTISEMENT, app, orders
from tests.postgres import database_url, drop_schema
from tests.support import Numbers, eventually, journalled_broker

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with journalled_broker(tmp_path_factory) as proc:
        yield proc.url


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The application's database, with its orders table: its URL."""
    schema = f"padres_outbox_{os.getpid()}"
    url = database_url(request.param, schema, tmp_path / "shop.sqlite")
    engine = sqlalchemy.create_engine(url)
    app.create_all(engine)
    TransactionalOutbox(engine).create()
    engine.dispose()
    yield url
    if request.param == "postgresql":
        drop_schema(schema)


@contextlib.asynccontextmanager
async def _subscriber(broker: str, tag: str) -> AsyncIterator[Numbers]:
    received = Numbers()
    async with Client(broker, f"warehouse-{tag}") as client:
        await client.subscribe(f"[class,eq,'Order'],[tag,eq,'{tag}']", received, durable="orders")
        yield received


def _tag(request: pytest.FixtureRequest) -> str:
    """A tag of its own for each test, so that their publications stay apart."""
    return "".join(c for c in request.node.name if c.isalnum())[-40:]


async def _started(relay: OutboxRelay) -> None:
    """Start the relay once the broker has let go of a killed process of the same name."""

    async def started() -> bool:
        try:
            await relay.start()
        except RequestFailed:
            return False
        return True

    await eventually(started)


def _app(database: str, broker: str, name: str, tag: str, mode: str) -> int:
    command = [sys.executable, "-m", "tests.outbox_app", database, broker, name, tag, mode]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, timeout=60, check=False)
    return done.returncode


async def test_what_commits_is_published_once_and_what_rolls_back_never(
    database: str, broker: str, request: pytest.FixtureRequest
) -> None:
    tag = _tag(request)
    engine = sqlalchemy.create_engine(database)
    request.addfinalizer(engine.dispose)
    outbox = TransactionalOutbox(engine)
    with engine.begin() as conn:  # a Connection's transaction
        conn.execute(orders.insert().values(n=1, tag=tag))
        outbox.add(conn, {"class": "Order", "tag": tag, "n": 1})
    with Session(engine) as session, session.begin():  # a Session's
        session.execute(orders.insert().values(n=2, tag=tag))
        outbox.add(session, f"[class,'Order'],[tag,'{tag}'],[n,2]")
    with contextlib.suppress(RuntimeError), engine.begin() as conn:
        conn.execute(orders.insert().values(n=3, tag=tag))
        outbox.add(conn, {"class": "Order", "tag": tag, "n": 3})
        raise RuntimeError("the application changes its mind: rolled back")
    with pytest.raises(OutboxError, match="in the outbox already"), engine.begin() as conn:
        first = outbox.pending(1)[0][1].id
        outbox.add(conn, {"class": "Order", "tag": tag, "n": 4}, id=first)
    assert outbox.count() == 2

    async with _subscriber(broker, tag) as received:
        relay = OutboxRelay(
            outbox, broker, f"shop-{tag}", advertisements=[ADVERTISEMENT], interval=0.2
        )
        async with relay:
            await eventually(lambda: received.got == [1, 2])
            await eventually(lambda: outbox.count() == 0)  # deleted once the broker has them
            with engine.begin() as conn:  # the relay, running, takes what comes later
                outbox.add(conn, {"class": "Order", "tag": tag, "n": 5})
                outbox.add(conn, {"class": "Refund", "tag": tag})  # not advertised: refused
            relay.wake()
            await eventually(lambda: received.got == [1, 2, 5])
            await eventually(lambda: len(outbox.refused()) == 1)
            ((_, refused, why),) = outbox.refused()
            assert refused is not None and refused.attributes["class"] == "Refund"
            assert "conforms to none" in why
            await eventually(lambda: outbox.count() == 0)
        await asyncio.sleep(0.3)
        assert received.got == [1, 2, 5]
    with engine.connect() as conn:
        stored = conn.execute(sqlalchemy.select(orders.c.n).where(orders.c.tag == tag))
        assert sorted(n for (n,) in stored) == [1, 2]


@pytest.mark.parametrize("dies", ["commit", "publish"])
async def test_an_application_killed_after_its_commit_publishes_once_when_it_restarts(
    database: str, broker: str, dies: str, request: pytest.FixtureRequest
) -> None:
    """Killed between the commit and the publishing (``commit``), or between the publishing
    and the deletion of the rows (``publish``): the restarted relay publishes each committed
    publication, and the durable subscriber gets each exactly once."""
    tag = _tag(request)
    name = f"shop-{tag}"
    async with _subscriber(broker, tag) as received:
        returncode = await asyncio.to_thread(_app, database, broker, name, tag, dies)
        assert returncode == -9  # SIGKILL
        outbox = TransactionalOutbox(database)
        request.addfinalizer(outbox.engine.dispose)
        assert outbox.count() == 2  # committed, and not known to be published
        if dies == "publish":
            await eventually(lambda: received.got == [1, 2])
        relay = OutboxRelay(outbox, broker, name, advertisements=[ADVERTISEMENT])
        await _started(relay)
        try:
            await eventually(lambda: outbox.count() == 0)
            await eventually(lambda: received.got == [1, 2])
            await asyncio.sleep(0.5)
            assert received.got == [1, 2]
        finally:
            await relay.stop()
