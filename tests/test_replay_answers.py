"""A broker takes a replay node's answers as they come: decoded without the rules of the language
again (the node read them from its store, which took them from a broker that checked them),
and only from a client with a replay offer standing, only in frames of answers alone."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from padres.broker import Broker
from padres.client.connection import Client, Delivery
from padres.model.messages import Publication, checked_before
from padres.model.protocol import Error, Notify, ReplayBatch, ReplayDone, ReplayEnd, ReplayRequest
from padres.runtime.node import BrokerNode

START = datetime(2026, 1, 1, tzinfo=UTC)
WINDOW = f"[class,eq,'T'],[time,>=,'{START.isoformat()}'],[time,<,'2026-01-02T00:00:00+00:00']"


def _quote(i: int) -> Publication:
    return Publication(f"p{i}", {"class": "T", "n": i}, START + timedelta(seconds=i), "pub@B1")


def _breaking_a_rule() -> Publication:
    """A publication the language refuses ('time' is not an attribute), made as a node that
    skipped the checks could send it."""
    with checked_before():
        return Publication("bad", {"class": "T", "time": 1}, START, "pub@B1")


@pytest.fixture
async def url() -> AsyncIterator[str]:
    node = BrokerNode(Broker("B1"), heartbeat=1)
    port: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    serving = asyncio.ensure_future(node.serve(ready=port.set_result))
    try:
        yield f"ws://127.0.0.1:{await port}/ws"
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving


async def _past(analyst: Client) -> list[Delivery | ReplayDone]:
    got: list[Delivery | ReplayDone] = []
    handle = await analyst.subscribe(WINDOW)
    async for delivery in handle.events():
        got.append(delivery)
    return got


async def _offering(db: Client) -> asyncio.Queue[ReplayRequest]:
    """``db`` offers to replay class T: the requests it gets."""
    requests: asyncio.Queue[ReplayRequest] = asyncio.Queue()
    db.on_replay = requests.put_nowait
    await db.offer_replay("[class,eq,'T']")
    return requests


async def test_a_databases_answers_reach_the_requester_once_in_order(url: str) -> None:
    async with Client(url, "db") as db:
        requests = await _offering(db)
        async with Client(url, "analyst") as analyst:
            past = asyncio.ensure_future(_past(analyst))
            request = await asyncio.wait_for(requests.get(), 5)
            rid, name = request.subscription.id, request.database
            batches = [tuple(_quote(i) for i in range(j, j + 3)) for j in (0, 3)]
            await db.answer([ReplayBatch(rid, name, batches[0])])
            await db.answer([ReplayBatch(rid, name, batches[1]), ReplayEnd(rid, name, 6)])
            got = await asyncio.wait_for(past, 5)
    notified = [d.publication for d in got if isinstance(d, Notify)]
    assert notified == [_quote(i) for i in range(6)]
    assert isinstance(got[-1], ReplayDone) and got[-1].count == 6


async def test_a_frame_of_answers_and_more_from_a_database_is_checked_whole(url: str) -> None:
    """The node's answers pass; the publication sent beside them meets every rule."""
    errors: list[Error] = []
    async with Client(url, "db") as db:
        db.on_error = errors.append
        requests = await _offering(db)
        await db.advertise("[class,eq,'T']")
        async with Client(url, "analyst") as analyst:
            past = asyncio.ensure_future(_past(analyst))
            request = await asyncio.wait_for(requests.get(), 5)
            rid, name = request.subscription.id, request.database
            batch = ReplayBatch(rid, name, (_quote(0),))
            await db._send([batch, _breaking_a_rule(), ReplayEnd(rid, name, 1)])
            got = await asyncio.wait_for(past, 5)
            for _ in range(50):
                if errors:
                    break
                await asyncio.sleep(0.05)
    assert [d.publication for d in got if isinstance(d, Notify)] == [_quote(0)]
    assert errors and "'time' is the publication's timestamp" in errors[0].text


async def test_answers_from_a_client_without_a_replay_offer_are_checked(url: str) -> None:
    errors: list[Error] = []
    async with Client(url, "db") as db, Client(url, "mallory") as mallory:
        mallory.on_error = errors.append
        requests = await _offering(db)
        async with Client(url, "analyst") as analyst:
            past = asyncio.ensure_future(_past(analyst))
            request = await asyncio.wait_for(requests.get(), 5)
            rid, name = request.subscription.id, request.database
            await mallory.answer([ReplayBatch(rid, name, (_breaking_a_rule(),))])
            for _ in range(50):
                if errors:
                    break
                await asyncio.sleep(0.05)
            await db.answer([ReplayBatch(rid, name, (_quote(1),)), ReplayEnd(rid, name, 1)])
            got = await asyncio.wait_for(past, 5)
    assert errors and "'time' is the publication's timestamp" in errors[0].text
    assert [d.publication for d in got if isinstance(d, Notify)] == [_quote(1)]
