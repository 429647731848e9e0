"""Flow control and limits: bounded queues, slow consumers told and evicted, publishers slowed
down rather than cut off, links that never thin, bad input that costs only itself.

The outbox is tested on its own first; then real broker processes on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from padres.broker import Broker, Out
from padres.client.connection import Client, Delivery
from padres.model.messages import Publication
from padres.model.protocol import Envelope, Error, Notify
from padres.runtime.node import BrokerNode
from padres.runtime.send_queue import FRAME_BYTES, SendQueue
from padres.testing.processes import BrokerProcess
from tests.support import eventually, health

# -- the outbox on its own ------------------------------------------------------------------------


class _Peer:
    """The far end of an outbox: records frames; while ``flowing`` is clear, the writer waits
    in the middle of a frame (a peer that reads nothing)."""

    def __init__(self) -> None:
        self.frames: list[list[dict[str, Any]]] = []
        self.sizes: list[int] = []
        self.closed: tuple[int, str] | None = None
        self.flowing = asyncio.Event()
        self.flowing.set()

    async def send(self, frame: bytes) -> None:
        await self.flowing.wait()
        self.frames.append(orjson.loads(frame))
        self.sizes.append(len(frame))

    async def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)

    def messages(self) -> list[dict[str, Any]]:
        return [m for frame in self.frames for m in frame]


def _message(n: int, size: int) -> bytes:
    return orjson.dumps({"v": 1, "type": "ok", "ref": f"{n}:" + "x" * size})


async def test_frames_are_bounded_in_bytes_and_keep_the_order() -> None:
    peer = _Peer()
    box = SendQueue(peer.send, peer.close, limit=10 << 20)
    for n in range(40):
        assert box.put(_message(n, 30_000))
    assert box.size > 40 * 30_000
    await _until(lambda: len(peer.messages()) == 40)
    assert [int(m["ref"].split(":")[0]) for m in peer.messages()] == list(range(40))
    assert max(peer.sizes) <= FRAME_BYTES and len(peer.frames) >= 40 * 30_000 // FRAME_BYTES
    assert box.size == 0 and box.sent == 40 and box.frames == len(peer.frames)
    assert box.statistics().sent_bytes == sum(peer.sizes)  # every frame's bytes, counted
    await box.close()


async def test_a_full_client_queue_drops_counts_and_tells_once() -> None:
    peer = _Peer()
    peer.flowing.clear()  # the client reads nothing for now
    box = SendQueue(peer.send, peer.close, limit=100_000)
    accepted = [box.put(_message(n, 10_000)) for n in range(30)]
    assert accepted.count(True) == 10 and box.dropped == 20
    assert box.dropped_bytes == sum(len(_message(n, 10_000)) for n in range(10, 30))
    assert box.over_for() > 0
    peer.flowing.set()  # it catches up
    await _until(lambda: box.size == 0)
    errors = [m for m in peer.messages() if m["type"] == "error"]
    assert len(errors) == 1 and "20 messages" in errors[0]["text"]
    assert f"{box.dropped_bytes:,} bytes" in errors[0]["text"]
    assert peer.messages()[0]["type"] == "error"  # ahead of what was still queued
    assert box.over_for() == 0.0  # the episode is over: no eviction ahead
    await box.close()


async def test_a_link_queue_never_drops_it_overflows_and_closes() -> None:
    peer = _Peer()
    peer.flowing.clear()
    box = SendQueue(peer.send, peer.close, limit=100_000)
    box.make_link(200_000, lambda: None)
    assert all(box.put(_message(n, 10_000)) for n in range(20))  # over a client's limit
    assert not box.put(_message(20, 10_000))  # over the link's: the link goes
    await asyncio.wait_for(box.gone, 5)
    peer.flowing.set()
    await box.close()
    assert peer.closed is not None and peer.closed[0] == 1013
    assert "resynchronised" in peer.closed[1]
    assert not box.put(_message(21, 10))


async def _until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


# -- real broker processes ------------------------------------------------------------------------


def _start(
    brokers: dict[str, BrokerProcess], name: str, *options: str, neighbours: tuple[str, ...] = ()
) -> str:
    proc = BrokerProcess(name, neighbours=neighbours, options=options)
    brokers[name] = proc
    return proc.start()


def _rss(pid: int) -> int:
    """Resident memory of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _frame(*messages: dict[str, Any]) -> bytes:
    return orjson.dumps([{"v": 1, **m} for m in messages])


async def _replies(ws: ClientConnection, count: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while len(out) < count:
        out += orjson.loads(await asyncio.wait_for(ws.recv(), 10))
    return out


async def _everything(ws: ClientConnection) -> tuple[list[dict[str, Any]], ConnectionClosed]:
    """Every message left on the connection, and how it was closed."""
    out: list[dict[str, Any]] = []
    try:
        while True:
            out += orjson.loads(await asyncio.wait_for(ws.recv(), 20))
    except ConnectionClosed as closed:
        return out, closed


class _Inbox:
    def __init__(self) -> None:
        self.ids: list[str] = []

    def __call__(self, delivery: Delivery) -> None:
        if isinstance(delivery, Notify):
            self.ids.append(delivery.publication.id)


BLOB = "x" * 1_000_000
RSS_BOUND = 40 << 20
"""How much a broker may grow while 80 MB of publications are published to a consumer that
reads nothing (its queue holds 8 MiB)."""


async def test_a_stalled_consumer_is_told_then_evicted_and_costs_bounded_memory(
    brokers: dict[str, BrokerProcess],
) -> None:
    url = _start(brokers, "B", "--evict-after", "2")
    pid = health(url)["pid"]
    # uncompressed: deflated, the repetitive blobs would hardly fill the socket's buffers
    stalled = connect(url, max_queue=1, max_size=None, ping_interval=None, compression=None)
    async with Client(url, "pub") as pub, stalled as raw:
        hello = {"type": "hello", "name": "raw", "role": "client"}
        sub = {"type": "subscription", "id": "s1", "filter": [["class", "eq", "Big"]]}
        await raw.send(_frame(hello, sub))
        assert [r["type"] for r in await _replies(raw, 2)] == ["welcome", "ok"]
        await pub.advertise("[class,eq,'Big']")
        base = peak = _rss(pid)
        for n in range(80):  # 80 MB; from here on the consumer reads nothing
            await pub.publish({"class": "Big", "n": n, "blob": BLOB}, id=f"p{n}")
            peak = max(peak, _rss(pid))
        assert peak - base < RSS_BOUND, f"the broker grew by {(peak - base) >> 20} MiB"
        await eventually(lambda: health(url)["evicted"] == 1)
        await eventually(lambda: "raw@B" not in health(url)["clients"])
        status = health(url)
        assert status["dropped"] >= 60 and status["dropped_bytes"] >= 60_000_000

        messages, closed = await _everything(raw)  # now it reads: what was it told?
        assert closed.rcvd is not None and closed.rcvd.code == 1008
        assert "too slow" in closed.rcvd.reason
        *earlier, last = messages
        assert last["type"] == "error" and last["text"].startswith("evicted")
        assert f"{status['dropped']:,} messages" in last["text"]
        assert f"({status['dropped_bytes']:,} bytes)" in last["text"]
        notes = [m["publication"]["attributes"]["n"] for m in earlier if m["type"] == "notify"]
        assert notes == list(range(len(notes)))  # what it got came in order
        told = [m["text"] for m in earlier if m["type"] != "notify"]
        assert all("reading too slowly" in text for text in told)  # losses, if any

        await pub.publish({"class": "Big", "n": 80, "blob": "still served"}, id="after")
    await eventually(lambda: health(url)["clients"] == [])  # the publisher's close is seen
    gone = health(url)  # the counts outlive the connections
    assert gone["dropped"] == status["dropped"] and gone["evicted"] == 1


async def test_a_message_with_a_non_string_type_costs_only_itself(
    brokers: dict[str, BrokerProcess],
) -> None:
    url = _start(brokers, "B")
    async with connect(url) as raw:
        await raw.send(_frame({"type": "hello", "name": "raw", "role": "client"}))
        assert (await _replies(raw, 1))[0]["type"] == "welcome"
        adv = {"type": "advertisement", "id": "a1", "filter": [["class", "eq", "T"]]}
        listed = {"type": ["subscription"], "id": "x1", "filter": [["class", "eq", "T"]]}
        nested = {"type": {"kind": "subscription"}, "id": "x2"}
        sub = {"type": "subscription", "id": "s1", "filter": [["class", "eq", "T"]]}
        await raw.send(_frame(adv, listed, nested, sub))
        replies = await _replies(raw, 4)
        assert [(r["type"], r["ref"]) for r in replies] == [
            ("ok", "a1"),
            ("error", "x1"),
            ("error", "x2"),
            ("ok", "s1"),
        ]
        assert all("type" in r["text"] for r in replies[1:3])
        pub = {
            "type": "publication",
            "id": "p1",
            "publisher": "",
            "timestamp": "2026-11-21T10:00:00+00:00",
            "attributes": {"class": "T"},
        }
        await raw.send(_frame(pub))  # the session goes on
        (note,) = await _replies(raw, 1)
        assert note["type"] == "notify" and note["subscriptions"] == ["s1"]
    assert health(url)["rejected"] == 2


async def test_the_accepting_side_of_a_link_queues_without_dropping(
    brokers: dict[str, BrokerProcess],
) -> None:
    """A's clients may queue 256 KiB; its link to B, which B dialled, holds far more than that
    while B is frozen, and everything arrives once B runs again."""
    a = _start(brokers, "A", "--client-queue", "0.25")
    b = _start(brokers, "B", neighbours=(a,))
    payload = "y" * 2000
    async with Client(a, "pub") as pub, Client(b, "sub") as sub:
        inbox = _Inbox()
        await pub.advertise("[class,eq,'T']")
        await sub.subscribe("[class,eq,'T']", inbox, id="s")  # settled: in A's table
        pubs = [_publication(f"p{n}", {"class": "T", "pad": payload}) for n in range(2000)]

        async def publish() -> None:
            for start in range(0, len(pubs), 100):
                await pub.publish_many(pubs[start : start + 100])

        brokers["B"].pause()
        try:
            sending = asyncio.ensure_future(publish())
            await eventually(lambda: health(a)["queued_bytes"] > 1 << 20)
        finally:
            brokers["B"].resume()
        await sending
        await eventually(lambda: len(inbox.ids) == 2000, timeout=30)
        assert inbox.ids == [f"p{n}" for n in range(2000)]
    assert health(a)["dropped"] == 0


async def test_a_link_that_overflows_is_closed_and_resynchronised_never_thinned(
    brokers: dict[str, BrokerProcess],
) -> None:
    """A's link to B may queue 256 KiB (and A pauses its clients only at 4 MiB): with B frozen,
    the link overflows, A drops it whole, and B links again once it runs."""
    a = _start(brokers, "A", "--link-queue", "0.25", "--pause-at", "4")
    b = _start(brokers, "B", neighbours=(a,))
    payload = "w" * 10_000
    async with Client(a, "pub") as pub, Client(b, "sub") as sub:
        inbox = _Inbox()
        await pub.advertise("[class,eq,'T']")
        await sub.subscribe("[class,eq,'T']", inbox, id="s")  # settled: in A's table
        brokers["B"].pause()
        try:
            for start in range(0, 300, 20):
                batch = [
                    _publication(f"p{n}", {"class": "T", "pad": payload})
                    for n in range(start, start + 20)
                ]
                await pub.publish_many(batch)
            await eventually(lambda: health(a)["neighbours"] == [])
        finally:
            brokers["B"].resume()
        await eventually(lambda: health(a)["neighbours"] == ["B"])
        await eventually(lambda: health(a)["subscriptions"] == 1)
        await pub.publish("[class,'T']", id="after")
        await eventually(lambda: inbox.ids[-1:] == ["after"])
        before = inbox.ids[:-1]
        assert before == [f"p{n}" for n in range(len(before))]  # a prefix: no gaps
        assert len(before) < 300  # the rest went with the link


async def test_a_publisher_faster_than_the_overlay_is_slowed_not_cut_off(
    brokers: dict[str, BrokerProcess],
) -> None:
    """B1 - B2 - B3; the publisher at B1 sends as fast as it can while B2 is frozen for a
    while: B1 stops reading it, TCP holds it back, and once B2 runs again every publication
    reaches the subscriber at B3."""
    b1 = _start(brokers, "B1", "--pause-at", "0.5")
    b2 = _start(brokers, "B2", neighbours=(b1,))
    b3 = _start(brokers, "B3", neighbours=(b2,))
    payload = "z" * 4000
    count, per_frame = 4000, 50
    async with Client(b1, "pub") as pub, Client(b3, "sub") as sub:
        inbox = _Inbox()
        await pub.advertise("[class,eq,'T'],[n,isPresent,0]")
        await sub.subscribe("[class,eq,'T'],[n,>=,0]", inbox, id="s")
        await eventually(lambda: health(b1)["subscriptions"] == 1)
        sent = 0

        async def publish() -> None:
            nonlocal sent
            for start in range(0, count, per_frame):
                batch = [
                    _publication(f"p{n}", {"class": "T", "n": n, "pad": payload})
                    for n in range(start, start + per_frame)
                ]
                await pub.publish_many(batch)
                sent += per_frame

        sending = asyncio.ensure_future(publish())
        brokers["B2"].pause()
        try:
            await eventually(lambda: health(b1)["paused"] >= 1)
            await asyncio.sleep(1.0)  # the buffers on the way fill up
            held = sent
            await asyncio.sleep(0.5)
            assert sent == held < count  # held back, not finished
        finally:
            brokers["B2"].resume()
        await asyncio.wait_for(sending, 60)
        await eventually(lambda: len(inbox.ids) == count, timeout=60)
        assert inbox.ids == [f"p{n}" for n in range(count)]
        assert await pub.query("subscriptions")  # still connected
    status = health(b1)
    assert status["dropped"] == 0 and status["evicted"] == 0


async def test_a_dialled_link_that_misbehaves_is_dialled_again(
    brokers: dict[str, BrokerProcess],
) -> None:
    """A neighbour that answers with garbage and hangs up: the broker keeps dialling it."""
    dialled: list[str] = []

    async def neighbour(ws: ServerConnection) -> None:
        hello = orjson.loads(await ws.recv())
        dialled.append(hello[0]["name"])
        await ws.send(b"{not json")
        await ws.send(_frame({"type": ["hello"], "name": "N", "role": "broker"}))
        await ws.send(_frame({"type": "route_publish", "tree": "t"}))
        await ws.send(_frame({"type": "hello", "name": "N", "role": "broker"}))
        await ws.send(_frame({"type": "route_subscribe", "subscription": 7, "trees": []}))
        with contextlib.suppress(ConnectionClosed):
            await ws.close()

    async with serve(neighbour, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        url = _start(brokers, "B", neighbours=(f"ws://127.0.0.1:{port}",))
        await eventually(lambda: len(dialled) >= 3)
        assert set(dialled) == {"B"}
    # each dial may hold the link for a moment; once the neighbour is gone, none is left
    await eventually(lambda: health(url)["neighbours"] == [])


class _Buggy(Broker):
    """A core with a bug: its answer to every message holds something that cannot be sent."""

    def handle(self, message: Envelope, hop: str, now: float = 0.0) -> list[Out]:
        return [*super().handle(message, hop, now), (hop, Error(cast(str, object())))]


async def test_a_failure_on_a_dialled_link_never_stops_the_dialling(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dialled: list[str] = []

    async def neighbour(ws: ServerConnection) -> None:
        dialled.append(orjson.loads(await ws.recv())[0]["name"])
        await ws.send(_frame({"type": "hello", "name": "N", "role": "broker"}))
        await ws.send(_frame({"type": "route_unsubscribe", "subscription_id": "x", "trees": []}))
        await asyncio.sleep(0.2)

    async with serve(neighbour, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        node = BrokerNode(_Buggy("B"), neighbours=[f"ws://127.0.0.1:{port}"])
        serving = asyncio.ensure_future(node.serve())
        try:
            await eventually(lambda: len(dialled) >= 3)
        finally:
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
    assert "failed on a frame from n" in caplog.text


def _publication(ident: str, attributes: dict[str, Any]) -> Publication:
    return Publication(ident, attributes, datetime.now(UTC), "")
