"""Durable composite subscriptions at real broker processes: the edge broker killed (kill -9)
in the middle of a sequence's window and of an absence's, its client away, its state bounded.

Two brokers, each with its journal on disk: the publisher's P and the subscriber's edge broker
E, which dials P. Publications are guaranteed: what is published while E is down comes back
from P's journal when E is back.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from padres.bench.network import settled
from padres.broker.durable import HOLD
from padres.client.connection import Client, ClientState, SubscriptionHandle
from padres.model.messages import Publication
from padres.model.protocol import CompositeNotify
from padres.testing.processes import BrokerProcess, free_ports
from tests.support import eventually, wait_linked

SEQUENCE = "{[class,eq,'A'],[k,eq,$K]} ; {[class,eq,'B'],[k,eq,$K]} within 30s"
ABSENCE = "{[class,eq,'A'],[k,eq,$K]} ; !{[class,eq,'B'],[k,eq,$K]} within 2s"


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[dict[str, BrokerProcess]]:
    """P and E, linked, on ports that stay theirs across restarts."""
    ports = free_ports(2)
    procs = {
        name: BrokerProcess(
            name, port=port, options=["--heartbeat", "1", "--data", str(tmp_path / name)]
        )
        for name, port in zip("PE", ports, strict=True)
    }
    procs["E"].neighbours = [f"ws://127.0.0.1:{ports[0]}"]
    try:
        for proc in procs.values():
            proc.start()
        wait_linked(["PE"], {name: proc.url for name, proc in procs.items()})
        yield procs
    finally:
        for proc in procs.values():
            proc.stop()


def _durables(proc: BrokerProcess) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = httpx.get(f"http://127.0.0.1:{proc.port}/api/v1/durables").json()
    return rows


def _held(proc: BrokerProcess) -> int:
    rows = _durables(proc)
    return int(rows[0]["held"]) if rows else -1


async def _shop(shop: Client) -> None:
    for cls in "AB":
        await shop.advertise(f"[class,eq,'{cls}'],[k,isPresent]")


async def _publish(shop: Client, cls: str, key: str, at: datetime | None = None) -> str:
    pub = Publication(f"{cls}-{key}", {"class": cls, "k": key}, at or datetime.now(UTC))
    await shop.publish(pub, guaranteed=True)
    await shop.flush(10)
    return pub.id


def _restart(proc: BrokerProcess) -> None:
    proc.kill()
    proc.start()


async def _nothing_more(handle: SubscriptionHandle, seconds: float) -> None:
    with pytest.raises(TimeoutError):
        await handle.get(seconds)


def _ids(note: object) -> list[str]:
    assert isinstance(note, CompositeNotify)
    return [p.id for p in note.publications]


async def test_a_sequence_half_matched_when_its_broker_is_killed_is_matched_once(
    pair: dict[str, BrokerProcess],
) -> None:
    """A came; E is killed (kill -9) and started again; B comes: the match comes, once,
    numbered 1; E killed again after it, nothing comes twice."""
    procs = pair
    async with (
        Client(procs["P"].url, "shop") as shop,
        Client(procs["E"].url, "watch", reconnect=True, timeout=30) as watch,
    ):
        await _shop(shop)
        handle = await watch.subscribe_composite(SEQUENCE, durable="orders")
        await settled(shop, quiet=0.5, timeout=10)
        a = await _publish(shop, "A", "x")
        await eventually(lambda: _held(procs["E"]) == 1)  # A is in its window, on disk
        await asyncio.to_thread(_restart, procs["E"])
        await eventually(lambda: watch.state is ClientState.OPEN)
        b = await _publish(shop, "B", "x")
        note = await handle.get(HOLD + 10)
        assert _ids(note) == [a, b]
        assert isinstance(note, CompositeNotify) and note.seq == 1 and note.bindings == {"K": "x"}
        await eventually(lambda: _durables(procs["E"])[0]["acked"] == 1)
        await asyncio.to_thread(_restart, procs["E"])
        await eventually(lambda: watch.state is ClientState.OPEN)
        await _nothing_more(handle, 2.0)


async def test_a_match_made_while_its_client_is_away_and_its_broker_is_killed_waits(
    pair: dict[str, BrokerProcess],
) -> None:
    """The client leaves; A and B come, and the match is queued at E; E is killed and
    started again; the client comes back and gets the match, once."""
    procs = pair
    async with Client(procs["P"].url, "shop") as shop:
        await _shop(shop)
        async with Client(procs["E"].url, "watch") as watch:
            await watch.subscribe_composite(SEQUENCE, durable="orders")
        await settled(shop, quiet=0.5, timeout=10)
        a, b = await _publish(shop, "A", "y"), await _publish(shop, "B", "y")
        await eventually(lambda: _durables(procs["E"])[0]["queued"] == 1)
        await asyncio.to_thread(_restart, procs["E"])
        async with Client(procs["E"].url, "watch") as watch:
            handle = await watch.subscribe_composite(SEQUENCE, durable="orders")
            note = await handle.get(10)
            assert _ids(note) == [a, b]
            await _nothing_more(handle, 1.5)


async def test_an_absence_whose_window_closes_while_its_broker_is_down_fires_once(
    pair: dict[str, BrokerProcess],
) -> None:
    """A came; E is killed; its window (2 s) closes while E is down, and a guaranteed B for
    another key comes meanwhile: once E is back (and ``HOLD`` has passed), the absence fires,
    once, for A's key only."""
    procs = pair
    async with (
        Client(procs["P"].url, "shop") as shop,
        Client(procs["E"].url, "watch", reconnect=True, timeout=30) as watch,
    ):
        await _shop(shop)
        handle = await watch.subscribe_composite(ABSENCE, durable="unpaid")
        await settled(shop, quiet=0.5, timeout=10)
        a = await _publish(shop, "A", "z")
        paid = await _publish(shop, "A", "w")
        await eventually(lambda: _held(procs["E"]) >= 1)
        procs["E"].kill()
        await _publish(shop, "B", "w")  # w is paid, while E is down
        await asyncio.sleep(3.0)  # the window closes
        down = time.monotonic()
        await asyncio.to_thread(procs["E"].start)
        note = await handle.get(HOLD + 10)
        assert _ids(note) == [a] and time.monotonic() - down >= HOLD
        await _nothing_more(handle, 2.0)
        assert paid != a


async def test_a_durable_composite_keeps_only_its_window_across_a_kill(
    pair: dict[str, BrokerProcess], tmp_path: Path
) -> None:
    """2,000 A publications, 10 ms apart in event time (20 s of it), then a B, to a composite
    whose window is 1 s: E holds about the last second of them (100), in memory and in its
    journal, and after a kill -9 it holds the same again."""
    procs = pair
    count, step = 2_000, timedelta(milliseconds=10)
    async with Client(procs["P"].url, "shop") as shop:
        await _shop(shop)
        async with Client(procs["E"].url, "watch") as watch:
            await watch.subscribe_composite(SEQUENCE.replace("30s", "1s"), durable="bounded")
        await settled(shop, quiet=0.5, timeout=10)
        start = datetime.now(UTC)
        for n in range(count):
            pub = Publication(f"a{n}", {"class": "A", "k": f"k{n % 5}"}, start + n * step)
            await shop.publish(pub, guaranteed=True)
        await _publish(shop, "B", "k0", start + count * step)
        # A later A lets the B out of the reorder buffer, whose match then says that every
        # publication is in (they come in order on the link from P).
        await _publish(shop, "A", "end", start + count * step + timedelta(milliseconds=1))
        await eventually(lambda: _durables(procs["E"])[0]["queued"] > 0, 20)
        (row,) = _durables(procs["E"])
        assert row["queued"] == 20  # the A of k0 in the second before the B: one in five
        held = row["held"]
        assert 90 <= held <= 102  # the last second, and the newest in the reorder buffer
        journal = tmp_path / "E" / "journal.sqlite"
        with closing(sqlite3.connect(f"file:{journal}?mode=ro", uri=True)) as db:
            (size,) = db.execute("SELECT length(state) FROM partials").fetchone()
        assert size < 300 * held  # the window's publications (about 200 bytes each), not 2,000
        await asyncio.to_thread(_restart, procs["E"])
        (again,) = _durables(procs["E"])
        fields = ("held", "queued", "queued_bytes", "next", "acked")
        assert {f: again[f] for f in fields} == {f: row[f] for f in fields}
