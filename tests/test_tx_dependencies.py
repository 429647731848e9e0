"""Backward dependencies with real broker processes: a producer at broker A names a consumer at
broker B vital; its commit completes once the consumer (a process of its own) has voted ready,
and aborts when the consumer is killed (SIGKILL) before it voted."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from padres.client.connection import Client
from padres.errors import TransactionAborted
from padres.model.protocol import TxNotify
from padres.testing.processes import BrokerProcess

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def overlay() -> Iterator[tuple[str, str]]:
    """Brokers A and B, linked: their URLs."""
    a = BrokerProcess("A", options=["--heartbeat", "1"])
    b = BrokerProcess("B", options=["--heartbeat", "1"])
    try:
        a.start()
        b.neighbours = [a.url]
        b.start()
        yield a.url, b.url
    finally:
        b.stop()
        a.stop()


def _consumer(url: str, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.vital_app", url, "stock", mode],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


async def _line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return (await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)).strip()


async def test_a_commit_waits_for_a_vital_consumer_and_aborts_when_it_dies(
    overlay: tuple[str, str],
) -> None:
    a, b = overlay
    async with Client(a, "shop") as shop, Client(b, "billing") as billing:
        await shop.advertise("[class,eq,'Order'],[n,isPresent,0]")
        orders = await billing.subscribe("[class,eq,'Order']")  # on_commit
        for mode, n in (("ready", 1), ("hang", 2)):
            consumer = _consumer(b, mode)
            try:
                assert await _line(consumer) == "ready"
                tx = shop.transaction(vital=["stock"], wait=20)
                await tx.begin()
                await tx.publish({"class": "Order", "n": n})
                commit = asyncio.create_task(tx.commit())
                got = await _line(consumer)
                assert got == f"got shop@A:{tx.id}"
                if mode == "ready":
                    await commit  # the consumer voted ready: committed
                    note = await orders.get(timeout=10)
                    assert isinstance(note, TxNotify) and note.publication.attributes["n"] == 1
                    continue
                await asyncio.sleep(0.2)
                assert not commit.done()  # it waits for the consumer
                consumer.kill()  # killed before it voted: gone
                with pytest.raises(TransactionAborted, match="vital consumer stock@B is gone"):
                    await asyncio.wait_for(commit, 15)
                with pytest.raises(TimeoutError):
                    await orders.get(timeout=0.5)  # nothing of it was committed
            finally:
                consumer.kill()
                consumer.wait()
                assert consumer.stdout is not None
                consumer.stdout.close()
