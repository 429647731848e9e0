"""An operator's view of durable subscriptions over REST: listed with what waits for them,
deleted; a client's connection closed."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import httpx
import pytest

from padres.cli import main
from padres.client.connection import Client
from padres.model.messages import Publication
from padres.testing.processes import BrokerProcess
from tests.support import eventually


async def test_an_abandoned_durable_subscription_is_seen_and_deleted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    broker = BrokerProcess("D1")
    url = broker.start()
    base = f"http://127.0.0.1:{broker.port}/api/v1"
    try:
        async with Client(url, "shop") as shop:
            await shop.advertise("[class,eq,'T'],[n,isPresent,0]")
            async with Client(url, "away") as away:
                await away.subscribe("[class,eq,'T']", durable="orders")
            published = datetime.now(UTC)
            for n in range(5):
                await shop.publish(Publication(f"p{n}", {"class": "T", "n": n}, published))
            await shop.flush()

            def waiting() -> list[dict[str, object]]:
                rows: list[dict[str, object]] = httpx.get(f"{base}/durables").json()
                return rows

            await eventually(lambda: waiting()[0]["queued"] == 5)
            (row,) = waiting()
            assert row["owner"] == "away@D1" and row["name"] == "orders"
            assert row["connected"] is False and isinstance(row["away"], float)
            assert row["acked"] == 0 and row["queued_bytes"] > 0  # type: ignore[operator]
            assert row["oldest"] == published.isoformat()
            scraped = httpx.get(f"http://127.0.0.1:{broker.port}/metrics").text
            for line in (
                'padres_durable_subscriptions{client="away"} 1.0',
                "padres_durable_queued_messages 5.0",
                "padres_ready 1.0",
                'padres_queue_bytes{kind="client",peer="clients"}',
            ):
                assert line in scraped, line
            assert "padres_build{version=" in scraped and "process_cpu_seconds_total" in scraped
            assert main(["admin", "durables", "--broker", url]) == 0  # the same, for a person
            listed = capsys.readouterr().out.splitlines()
            assert listed[0].split() == ["owner", "name", "state", "queued", "bytes", "oldest"]
            fields = listed[1].split()  # owner, name, "away N s", queued, bytes, oldest
            assert fields[:3] == ["away@D1", "orders", "away"] and fields[5] == "5"
            assert main(["admin", "drop-durable", "--broker", url, "away@D1", "orders"]) == 0
            assert waiting() == []
            again = httpx.delete(f"{base}/durables/away@D1/orders")
            assert again.status_code == 404 and "orders" in again.json()["detail"]
            assert main(["admin", "drop-durable", "--broker", url, "away@D1", "orders"]) == 1
            assert "404: no durable subscription 'orders' of 'away@D1'" in capsys.readouterr().err
            async with Client(url, "away") as back:  # made anew: the past is not kept
                fresh = await back.subscribe("[class,eq,'T']", durable="orders")
                await asyncio.sleep(0.5)
                assert fresh.statistics().delivered == 0
    finally:
        broker.stop()


async def test_an_administrator_closes_a_client() -> None:
    broker = BrokerProcess("D2")
    url = broker.start()
    base = f"http://127.0.0.1:{broker.port}/api/v1"
    try:
        async with Client(url, "idle") as idle:
            assert main(["admin", "close", "--broker", url, "idle@D2"]) == 0
            await eventually(lambda: idle.state.value == "closed")
            assert "closed by an administrator" in idle.closed_reason
        missing = httpx.delete(f"{base}/clients/idle@D2")
        assert missing.status_code == 404
    finally:
        broker.stop()


async def test_a_rest_subscription_nobody_reads_is_removed_after_a_while() -> None:
    """``--rest-idle 2``: a plain REST subscription no stream read for 2 s is removed, and
    says why; one a stream reads stays."""
    broker = BrokerProcess("D3", options=["--rest-idle", "2"])
    broker.start()
    base = f"http://127.0.0.1:{broker.port}/api/v1"
    try:
        made = [
            httpx.post(f"{base}/subscriptions", json={"filter": "[class,eq,'T']"}).json()["id"]
            for _ in range(2)
        ]
        read = made[1]
        events = f"{base}/subscriptions/{read}/events"
        async with (
            httpx.AsyncClient(timeout=30) as http,
            http.stream("GET", events) as stream,
        ):
            assert stream.status_code == 200
            await asyncio.sleep(4)  # two seconds unread, and one more for the check
            gone = await http.get(f"{base}/subscriptions/{made[0]}")
            assert gone.status_code == 404
            assert "no stream read it for 2 s" in gone.json()["detail"]
            assert (await http.get(f"{base}/subscriptions/{read}")).status_code == 200
    finally:
        broker.stop()
