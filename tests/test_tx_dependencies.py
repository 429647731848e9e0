"""Dependencies with real broker processes. Backward: a producer at broker A names a consumer
at broker B vital; its commit completes once the consumer (a process of its own) has voted
ready, and aborts when the consumer is killed (SIGKILL) before it voted. Forward: a consumer's
reaction commits only if the transaction that triggered it ended as the reaction says."""

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


@pytest.fixture(scope="module")
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


async def test_a_reaction_commits_only_if_its_trigger_ended_as_it_depends(
    overlay: tuple[str, str],
) -> None:
    """Reactions at B to orders published in transactions at A: a shipment that commits only
    if its order commits, and a refund that commits only if its order aborts."""
    a, b = overlay
    async with (
        Client(a, "shop2") as shop,
        Client(b, "warehouse") as warehouse,
        Client(a, "ledger") as ledger,
    ):
        await shop.advertise("[class,eq,'Order'],[n,isPresent,0]")
        await warehouse.advertise("[class,eq,'Shipment'],[n,isPresent,0],[kind,isPresent,'']")
        orders = await warehouse.subscribe("[class,eq,'Order']", visibility="immediate")
        booked = await ledger.subscribe("[class,eq,'Shipment']")  # on_commit

        async def react(n: int, on: str) -> asyncio.Task[None]:
            """The reaction to order ``n``, begun when its pending copy arrives."""
            note = await orders.get(timeout=10)
            assert isinstance(note, TxNotify) and note.publication.attributes["n"] == n
            reaction = warehouse.transaction(trigger=note.tx, on=on, wait=10)
            await reaction.begin()
            kind = "shipment" if on == "committed" else "refund"
            await reaction.publish({"class": "Shipment", "n": n, "kind": kind})
            return asyncio.create_task(reaction.commit())

        outcomes = []
        for n, ends in ((1, "commit"), (2, "abort")):
            for on in ("committed", "aborted"):
                order = shop.transaction()
                await order.begin()
                await order.publish({"class": "Order", "n": n})
                reaction = await react(n, on)
                await asyncio.sleep(0.2)
                assert not reaction.done()  # it waits for its trigger's outcome
                await (order.commit() if ends == "commit" else order.abort())
                try:
                    await asyncio.wait_for(reaction, 10)
                    outcomes.append((n, on, "committed"))
                except TransactionAborted as exc:
                    assert f"its trigger shop2@A:{order.id} was" in exc.reason
                    outcomes.append((n, on, "aborted"))
                await orders.get(timeout=10)  # the order's outcome, as the reaction saw it
        assert outcomes == [
            (1, "committed", "committed"),
            (1, "aborted", "aborted"),
            (2, "committed", "aborted"),
            (2, "aborted", "committed"),
        ]
        got = [await booked.get(timeout=10) for _ in range(2)]
        pubs = [g.publication.attributes for g in got if isinstance(g, TxNotify)]
        assert [(p["n"], p["kind"]) for p in pubs] == [(1, "shipment"), (2, "refund")]
        with pytest.raises(TimeoutError):
            await booked.get(timeout=0.5)


def test_the_command_line_commits_only_once_its_vital_consumers_are_ready(
    overlay: tuple[str, str],
) -> None:
    """``padres pub --transaction --vital``: no consumer named ``audit`` reacts, so the commit
    is aborted once its wait is over, and the command fails saying so."""
    a, _ = overlay
    command = [sys.executable, "-m", "padres.cli", "pub", "--broker", a, "--transaction"]
    options = ["--vital", "audit", "--vital-wait", "0.5", "[class,'Order'],[n,7]"]
    done = subprocess.run(
        [*command, *options], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1
    assert "its vital consumers audit did not report ready within 0.5 s" in done.stderr
