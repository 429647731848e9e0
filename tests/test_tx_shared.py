"""Shared context with real processes: the producer at broker A, the consumer (a process of
its own, ``tests/joiner_app.py``) at broker B, which links to A through a fault proxy; both
brokers keep their journals on disk. The consumer ships each order in a part of the order's
transaction. What subscribers at A and B see when it commits and when it aborts; a consumer
killed (SIGKILL) before its part is done; either broker killed at a step of the commit and
restarted on its journal; and a vital consumer's vote lost with the link that carries it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from padres.client.connection import Client, ClientState, SubscriptionHandle
from padres.errors import TransactionAborted, TransactionError
from padres.model.protocol import TxNotify
from padres.testing.processes import BrokerProcess, free_ports
from padres.testing.proxy import Proxy
from tests.support import eventually, health

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
SHIPMENT = "[class,eq,'Shipment']"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Overlay:
    a: BrokerProcess
    b: BrokerProcess
    proxy: Proxy
    """On B's link to A."""

    async def linked(self) -> None:
        await eventually(lambda: health(self.b.url)["neighbours"] == ["A"], 20)
        await eventually(lambda: health(self.a.url)["neighbours"] == ["B"], 20)


@asynccontextmanager
async def _overlay(tmp_path: Path) -> AsyncIterator[Overlay]:
    """A and B on fixed ports (a restart keeps them), B dialling A through the proxy."""
    ports = free_ports(2)
    options = ["--heartbeat", "1", "--tx-linger", "2"]
    a = BrokerProcess("A", port=ports[0], options=[*options, "--data", str(tmp_path / "A")])
    proxy = Proxy(ports[0])
    b = BrokerProcess("B", port=ports[1], options=[*options, "--data", str(tmp_path / "B")])
    try:
        await asyncio.to_thread(a.start)  # the proxy runs in this loop: never block it
        b.neighbours = [await proxy.start()]
        await asyncio.to_thread(b.start)
        overlay = Overlay(a, b, proxy)
        await overlay.linked()
        yield overlay
    finally:
        await proxy.cut()
        for proc in (b, a):
            await asyncio.to_thread(proc.stop)


def _app(url: str, app: str, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", f"tests.{app}", url, "stock", mode],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


async def _line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return (await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)).strip()


def _end(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()


async def _take(handle: SubscriptionHandle, count: int) -> list[tuple[int, int, str, str]]:
    """The next ``count`` deliveries: (order, item, outcome, transaction)."""
    got = []
    for _ in range(count):
        note = await handle.get(timeout=15)
        assert isinstance(note, TxNotify)
        attributes = note.publication.attributes
        got.append((int(attributes["n"]), int(attributes["item"]), note.outcome.value, note.tx))
    return got


async def _nothing(handle: SubscriptionHandle, wait: float = 1.0) -> None:
    with pytest.raises(TimeoutError):
        await handle.get(timeout=wait)


async def test_a_part_is_delivered_with_its_transaction_once_and_never_when_it_aborts(
    tmp_path: Path,
) -> None:
    async with (
        _overlay(tmp_path) as net,
        Client(net.a.url, "shop") as shop,
        Client(net.a.url, "billing") as billing,
        Client(net.a.url, "refunds") as refunds,
        Client(net.b.url, "audit") as audit,
    ):
        await shop.advertise("[class,eq,'Order'],[n,isPresent,0]")
        booked = await billing.subscribe(SHIPMENT, durable="shipments")  # on_commit
        returned = await refunds.subscribe(SHIPMENT, visibility="on_abort")
        watched = await audit.subscribe(SHIPMENT, visibility="immediate")
        consumer = _app(net.b.url, "joiner_app", "done")
        try:
            assert await _line(consumer) == "ready"
            for n, ends in ((1, "commit"), (2, "abort")):
                order = await shop.transaction().begin()
                await order.publish({"class": "Order", "n": n})
                gid = f"shop@A:{order.id}"
                assert [await _line(consumer) for _ in range(3)] == [
                    f"joined {gid}",
                    f"shipped {gid}",
                    f"done {gid}",
                ]
                assert await _take(watched, 2) == [(n, i, "pending", gid) for i in (0, 1)]
                await _nothing(booked, 0.5)  # not before the commit
                await (order.commit() if ends == "commit" else order.abort())
                outcome = "committed" if ends == "commit" else "aborted"
                assert await _line(consumer) == f"outcome {gid} {outcome}"
                assert await _take(watched, 2) == [(n, i, outcome, gid) for i in (0, 1)]
                if ends == "commit":
                    assert await _take(booked, 2) == [(n, i, "committed", gid) for i in (0, 1)]
                else:
                    assert await _take(returned, 2) == [(n, i, "aborted", gid) for i in (0, 1)]
            await _nothing(booked)  # the committed ones once, the aborted ones never
            await _nothing(returned, 0.2)
            await billing.unsubscribe("shipments")
        finally:
            _end(consumer)


@pytest.mark.parametrize("vital", [True, False])
async def test_a_consumer_killed_before_its_part_is_done_aborts_the_commit(
    tmp_path: Path, vital: bool
) -> None:
    """A vital consumer is gone at once; any other's part is aborted once its broker's linger
    (2 s) is over. Either aborts the transaction, and no subscriber sees its shipments as
    committed."""
    async with (
        _overlay(tmp_path) as net,
        Client(net.a.url, "shop") as shop,
        Client(net.a.url, "billing") as billing,
        Client(net.a.url, "refunds") as refunds,
    ):
        await shop.advertise("[class,eq,'Order'],[n,isPresent,0]")
        booked = await billing.subscribe(SHIPMENT)
        returned = await refunds.subscribe(SHIPMENT, visibility="on_abort")
        consumer = _app(net.b.url, "joiner_app", "hang")
        try:
            assert await _line(consumer) == "ready"
            order = await shop.transaction(vital=["stock"] if vital else (), wait=15).begin()
            await order.publish({"class": "Order", "n": 1})
            gid = f"shop@A:{order.id}"
            assert [await _line(consumer) for _ in range(2)] == [
                f"joined {gid}",
                f"shipped {gid}",
            ]
            commit = asyncio.create_task(order.commit())
            await asyncio.sleep(0.5)
            assert not commit.done()  # it waits for the part
            consumer.kill()
            killed = time.monotonic()
            why = (
                "its vital consumer stock@B is gone"
                if vital
                else r"its part stock@B:\S+ was aborted \(its client was disconnected for more"
            )
            with pytest.raises(TransactionAborted, match=why):
                await asyncio.wait_for(commit, 12)
            assert time.monotonic() - killed < (2 if vital else 5)
            assert await _take(returned, 2) == [(1, i, "aborted", gid) for i in (0, 1)]
            await _nothing(booked)
        finally:
            _end(consumer)


@pytest.mark.parametrize(
    "killed", ["the part's broker once done", "the transaction's broker", "it once committed"]
)
async def test_a_broker_killed_mid_commit_ends_every_publication_one_way(
    tmp_path: Path, killed: str
) -> None:
    """B (the part's broker) is killed once the part is done, and the order commits without
    it; or A (the transaction's) is killed before the order commits; or A is killed once it
    committed the order, the decision held up on its way to B (the proxy stalls). The killed
    broker is restarted on its journal: the shipments are committed exactly once, in the
    first and last cases, and never in the second."""
    async with (
        _overlay(tmp_path) as net,
        Client(net.a.url, "shop", reconnect=True) as shop,
        Client(net.a.url, "billing", reconnect=True) as billing,
    ):
        await shop.advertise("[class,eq,'Order'],[n,isPresent,0]")
        booked = await billing.subscribe(SHIPMENT, durable="shipments")
        consumer = _app(net.b.url, "joiner_app", "done")
        try:
            assert await _line(consumer) == "ready"
            order = await shop.transaction().begin()
            await order.publish({"class": "Order", "n": 1})
            gid = f"shop@A:{order.id}"
            assert [await _line(consumer) for _ in range(3)] == [
                f"joined {gid}",
                f"shipped {gid}",
                f"done {gid}",
            ]
            await eventually(lambda: health(net.a.url)["transactions"]["unfinished"] == 0)
            if killed == "the part's broker once done":
                net.b.kill()
                await order.commit()  # the part is done: its decision is lost with B
                await asyncio.to_thread(net.b.start)
            elif killed == "the transaction's broker":
                net.a.kill()
                await asyncio.to_thread(net.a.start)
                await eventually(lambda: shop.state is ClientState.OPEN)
                with pytest.raises(TransactionError, match="no transaction"):
                    await order.commit()
            else:
                net.proxy.stall()
                await order.commit()
                net.a.kill()
                await net.proxy.cut()  # B dials again, to A restarted
                net.proxy.resume()
                await net.proxy.restore()
                await asyncio.to_thread(net.a.start)
            await net.linked()
            if killed == "the transaction's broker":
                assert await _line(consumer) == f"outcome {gid} aborted"
                await _nothing(booked, 3.0)
            else:
                assert await _take(booked, 2) == [(1, i, "committed", gid) for i in (0, 1)]
                await _nothing(booked)
            if killed == "it once committed":  # B lived on: its client learns the outcome
                assert await _line(consumer) == f"outcome {gid} committed"
            await billing.unsubscribe("shipments")
        finally:
            _end(consumer)


@pytest.mark.parametrize("fault", ["cut", "stall"])
async def test_a_vital_consumers_vote_lost_with_its_link_aborts_the_commit_at_its_wait(
    tmp_path: Path, fault: str
) -> None:
    """The link from B, where the vital consumer is, to A is cut (or stalls, a silent
    partition) after the consumer got the transaction and before it voted ready: its vote
    never reaches A, whose commit ends at its ``wait`` as aborted."""
    wait = 3.0
    async with _overlay(tmp_path) as net, Client(net.a.url, "shop") as shop:
        await shop.advertise("[class,eq,'Order'],[n,isPresent,0]")
        consumer = _app(net.b.url, "vital_app", "later")
        try:
            assert await _line(consumer) == "ready"
            order = await shop.transaction(vital=["stock"], wait=wait).begin()
            await order.publish({"class": "Order", "n": 1})
            started = time.monotonic()
            commit = asyncio.create_task(order.commit())
            assert await _line(consumer) == f"got shop@A:{order.id}"
            if fault == "cut":
                await net.proxy.cut()
            else:
                net.proxy.stall()
            assert consumer.stdin is not None
            consumer.stdin.write("go\n")
            consumer.stdin.flush()
            assert await _line(consumer) == f"voted shop@A:{order.id}"  # its broker took it
            why = f"its vital consumers stock did not report ready within {wait:g} s"
            with pytest.raises(TransactionAborted, match=why):
                await asyncio.wait_for(commit, 15)
            assert wait <= time.monotonic() - started < wait + 2.5
        finally:
            net.proxy.resume()
            _end(consumer)
