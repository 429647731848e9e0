"""A broker's journal in PostgreSQL (``padres broker --journal``), with real broker processes:
a broker lost with its machine is replaced elsewhere; one journal, one process; a broker that
loses its database stops, and takes up again from what the journal committed."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from padres.broker import Broker
from padres.broker.postgres_journal import PostgresJournal, drop_journal
from padres.client.connection import Client, Delivery
from padres.runtime.node import BrokerNode
from padres.testing.processes import BrokerProcess, free_ports
from tests.postgres import LIBPQ, postgres_or_skip
from tests.support import Numbers, eventually, wait_linked

pytestmark = pytest.mark.anyio

COUNT = 600


@pytest.fixture
def broker_id() -> Iterator[str]:
    """A broker id of its own for the test, its journal's schema dropped afterwards."""
    postgres_or_skip()
    name = f"B{uuid.uuid4().hex[:8]}"
    yield name
    drop_journal(LIBPQ, name)


def _broker(name: str, port: int, neighbours: list[str], options: list[str]) -> BrokerProcess:
    return BrokerProcess(
        name, port=port, neighbours=neighbours, options=["--heartbeat", "1", *options]
    )


async def test_a_broker_lost_with_its_machine_is_replaced_elsewhere_with_nothing_lost(
    broker_id: str, tmp_path: Path
) -> None:
    """A chain A-B-C, B's journal in PostgreSQL and nothing of B on disk. The durable
    subscriber's broker C hangs while the publisher at B publishes, so B holds what it
    accepted and could not forward; then B is killed. A new process of B on another port, with
    the same id and journal, takes over; the publisher, which lists both addresses, fails over
    to it and advertises again, so its tree is back: the subscriber gets every publication
    once, in order."""
    a, b, c, b2 = free_ports(4)
    url = {"A": f"ws://127.0.0.1:{a}", "C": f"ws://127.0.0.1:{c}"}
    journal = ["--journal", LIBPQ]
    procs = [
        _broker("A", a, [], ["--data", str(tmp_path / "A")]),
        _broker("C", c, [], ["--data", str(tmp_path / "C")]),
        _broker(broker_id, b, [url["A"], url["C"]], journal),
    ]
    replacement = _broker(broker_id, b2, [url["A"], url["C"]], journal)
    try:
        for proc in procs:
            proc.start()
        url[broker_id] = procs[2].url
        wait_linked([("A", broker_id), (broker_id, "C")], url)
        got = Numbers()
        b_urls = [url[broker_id], f"ws://127.0.0.1:{b2}"]
        async with (
            Client(url["C"], "manager", reconnect=True, timeout=30) as manager,
            Client(b_urls, "shop", reconnect=True, timeout=30) as shop,
        ):
            await manager.subscribe("[class,eq,'T']", got, durable="orders")
            await shop.advertise("[class,eq,'T'],[n,isPresent,0]")
            for n in range(COUNT):
                if n == COUNT // 3:
                    await eventually(lambda: len(got.got) == COUNT // 3)
                    procs[1].pause()  # C hangs: B keeps what it cannot forward
                await shop.publish({"class": "T", "n": n}, guaranteed=True)
            await shop.flush(30)  # B acknowledged all: its journal holds them
            assert len(got.got) == COUNT // 3
            procs[2].kill()  # B, with its machine
            procs[1].resume()
            await asyncio.to_thread(replacement.start)
            await eventually(lambda: len(got.got) >= COUNT, 60)
            await asyncio.sleep(2.0)  # anything sent twice would have come by now
        assert got.got == list(range(COUNT))
    finally:
        for proc in [*procs, replacement]:
            proc.stop()


def test_a_second_process_of_a_broker_may_not_open_its_journal(broker_id: str) -> None:
    first = _broker(broker_id, 0, [], ["--journal", LIBPQ])
    try:
        first.start()
        second = subprocess.run(
            [
                sys.executable,
                "-m",
                "padres.cli",
                "broker",
                "--id",
                broker_id,
                "--port",
                "0",
                "--journal",
                LIBPQ,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1
        assert "in use by another process of the same broker" in second.stderr
    finally:
        first.stop()


async def test_a_broker_that_loses_its_database_stops_and_takes_up_again(
    broker_id: str,
) -> None:
    """B's database session is cut while a publisher publishes guaranteed publications to it:
    B stops rather than go on without its journal; started again, it takes up from what the
    journal committed, the publisher sends again what B had not acknowledged, and the durable
    subscriber at A gets every publication once."""
    a, b = free_ports(2)
    url = {"A": f"ws://127.0.0.1:{a}", broker_id: f"ws://127.0.0.1:{b}"}
    procs = [_broker("A", a, [], []), _broker(broker_id, b, [url["A"]], ["--journal", LIBPQ])]
    try:
        for proc in procs:
            proc.start()
        wait_linked([("A", broker_id)], url)
        got = Numbers()
        async with (
            Client(url["A"], "manager") as manager,
            Client(url[broker_id], "shop", reconnect=True, timeout=60) as shop,
        ):
            await manager.subscribe("[class,eq,'T']", got, durable="orders")
            await shop.advertise("[class,eq,'T'],[n,isPresent,0]")
            for n in range(COUNT):
                if n == COUNT // 2:
                    _cut(broker_id)
                await shop.publish({"class": "T", "n": n}, guaranteed=True)
                await asyncio.sleep(0.001)
            deadline = time.monotonic() + 30
            while procs[1].alive and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert not procs[1].alive, "the broker went on without its journal"
            await asyncio.to_thread(procs[1].start)
            await shop.flush(60)
            await eventually(lambda: len(got.got) >= COUNT, 30)
            await asyncio.sleep(1.0)
        assert got.got == list(range(COUNT))
    finally:
        for proc in procs:
            proc.stop()


def _cut(broker: str) -> None:
    """End the database sessions of broker ``broker``, as a lost network would."""
    with psycopg.connect(LIBPQ, autocommit=True) as db:
        ended = db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (f"padres broker {broker}",),
        ).fetchall()
    assert ended, "the broker has no database session"


async def test_an_error_text_with_a_nul_is_set_aside_whole_in_postgresql(broker_id: str) -> None:
    """PostgreSQL's text takes no NUL: a handler's error holding one is kept with U+FFFD in its
    place, and the broker goes on."""
    broker = Broker(broker_id, journal=PostgresJournal(LIBPQ, broker_id))
    node = BrokerNode(broker, heartbeat=1)
    port: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    serving = asyncio.ensure_future(node.serve(ready=port.set_result))
    url = f"ws://127.0.0.1:{await port}"

    def refuse(delivery: Delivery) -> None:
        raise ValueError("bad\x00order")

    try:
        async with Client(url, "shop") as shop, Client(url, "manager") as manager:
            await shop.advertise("[class,eq,'Order'],[n,isPresent,0]")
            await manager.subscribe("[class,eq,'Order']", refuse, durable="orders", retries=0)
            for n in range(3):
                await shop.publish({"class": "Order", "n": n}, guaranteed=True)
            await shop.flush(10)

            async def set_aside() -> bool:
                return len((await manager.exceptions("orders")).entries) == 3

            await eventually(set_aside)
            report = await manager.exceptions("orders")
            assert {e.error for e in report.entries} == {"ValueError: bad\ufffdorder"}
        assert node.failure is None and not serving.done()
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        broker.journal.close()
