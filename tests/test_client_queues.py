"""Client-side queues: each subscription's queue in the client is bounded in deliveries and
bytes; a plain subscription read too slowly drops what does not fit and is told once per episode,
without slowing the connection or the other subscriptions; a durable one never drops, its
broker's window holding the rest back.

The queue on its own first; then through real brokers.
"""

from __future__ import annotations

import asyncio
import logging
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

import pytest

from padres import SlowConsumer
from padres.client.connection import Client, Delivery, SubscriptionHandle
from padres.client.pending import MAX_PENDING, MAX_PENDING_BYTES, Pending, PendingStatistics
from padres.client.resume import Seen
from padres.errors import PadresError
from padres.model.codec import encode_frame
from padres.model.messages import Publication
from padres.model.protocol import DURABLE_WINDOW_BYTES, Notify
from padres.testing.processes import BrokerProcess

# -- the queue on its own -------------------------------------------------------------------------


async def test_a_full_queue_drops_counts_and_tells_once_where_the_loss_began() -> None:
    queue: Pending[int] = Pending("s1", 4, 1000)
    accepted = [queue.put(n, 10) for n in range(10)]
    assert accepted == [True] * 4 + [False] * 6
    assert queue.statistics() == PendingStatistics(4, 40, 0, 6, 60, 4, 1000)
    got = [await queue.get() for _ in range(4)]
    assert got == [0, 1, 2, 3]
    with pytest.raises(SlowConsumer) as caught:
        await queue.get()
    slow = caught.value
    assert isinstance(slow, PadresError)
    assert (slow.subscription, slow.pending, slow.pending_bytes) == ("s1", 0, 0)
    assert (slow.dropped, slow.dropped_bytes) == (6, 60)
    assert "'s1'" in str(slow) and "6 deliveries" in str(slow)
    assert queue.put(10, 10)  # room again, and the iterator goes on
    assert await queue.get() == 10
    assert queue.statistics().delivered == 5


async def test_one_episode_of_losses_is_told_once_and_the_next_again() -> None:
    queue: Pending[int] = Pending("s1", 4, 1000)
    for n in range(6):  # 4 kept, 4 and 5 dropped: one episode
        queue.put(n, 1)
    assert await queue.get() == 0
    assert queue.put(6, 1)  # room for one: taken, after where the loss began
    assert not queue.put(7, 1)  # the same episode, not told again
    told = 0
    got = []
    while queue.pending or told == 0:
        try:
            got.append(await queue.get())
        except SlowConsumer as slow:
            told += 1
            assert slow.dropped == 3
    assert got == [1, 2, 3, 6] and told == 1
    for n in range(8, 14):  # the queue drained: a new episode
        queue.put(n, 1)
    got = []
    with pytest.raises(SlowConsumer) as caught:
        while True:
            got.append(await queue.get())
    assert got == [8, 9, 10, 11] and caught.value.dropped == 5


async def test_bytes_bound_the_queue_and_one_large_delivery_always_fits() -> None:
    queue: Pending[int] = Pending("s1", 100, 1000)
    assert queue.put(1, 5000)  # alone in the queue: however large
    assert not queue.put(2, 1)
    assert await queue.get() == 1
    with pytest.raises(SlowConsumer):
        await queue.get()
    assert queue.put(3, 600) and not queue.put(4, 600) and queue.put(5, 400)
    assert queue.statistics().pending_bytes == 1000


async def test_a_queue_that_keeps_says_when_it_is_full_and_when_it_has_room() -> None:
    told: list[bool] = []
    queue: Pending[int] = Pending("d1", 3, 1000, flow=told.append)
    for n in range(5):
        assert queue.put(n, 10, keep=True)
    assert told == [False] and queue.statistics().dropped == 0
    assert [await queue.get() for _ in range(2)] == [0, 1]
    assert told == [False]  # 3 pending: still at the limit
    assert await queue.get() == 2
    assert told == [False, True]
    queue.put(5, 10, keep=True)
    assert told == [False, True, False]
    queue.keep_only(lambda n: n < 4)  # the rest comes again
    assert told == [False, True, False, True]
    assert queue.statistics()[:4] == (1, 10, 3, 0)
    queue.close()
    assert await queue.get() == 3
    assert await queue.get() is None
    assert await queue.get() is None
    assert not queue.put(6, 1, keep=True)


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Client("ws://127.0.0.1:1", max_pending=0)
    with pytest.raises(ValueError, match="at least 1"):
        Pending("s", 10, 0)


class _Frames:
    """A transport that hands the client ``frames`` as from its broker, then ends."""

    url = "test"
    reason = ""

    def __init__(self, frames: list[bytes]) -> None:
        self._frames = frames

    async def send(self, frame: bytes) -> None:
        pass

    async def frames(self) -> AsyncIterator[bytes]:
        for frame in self._frames:
            yield frame

    async def close(self) -> None:
        pass


def _notify(pid: str, *subscriptions: str, seq: int = 0) -> Notify:
    publication = Publication(id=pid, attributes={"class": "T"}, timestamp=datetime.now(UTC))
    return Notify(publication, subscriptions, seq=seq)


async def test_plain_deliveries_reach_the_callback_counted_and_a_failing_one_stops_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = Client("ws://127.0.0.1:1", "c")
    got: list[str] = []

    def callback(delivery: Delivery) -> None:
        assert isinstance(delivery, Notify)
        got.append(delivery.publication.id)
        if delivery.publication.id == "p1":
            raise RuntimeError("boom")

    handle = SubscriptionHandle(client, "s", callback)
    queued = SubscriptionHandle(client, "q", None)  # read with get(): its queue holds them
    client._subs.update(s=handle, q=queued)
    frame = encode_frame([_notify("p1", "s", "q"), _notify("p2", "s"), _notify("p3", "x")])
    with caplog.at_level(logging.ERROR):
        await client._read(_Frames([frame]))
    assert got == ["p1", "p2"]
    assert handle.statistics().delivered == 2
    assert [r.getMessage() for r in caplog.records] == ["subscription s: callback failed"]
    first = await queued.get(timeout=1)
    assert isinstance(first, Notify) and first.publication.id == "p1"


async def test_deliveries_sent_again_reach_neither_a_durable_nor_a_windowed_callback() -> None:
    client = Client("ws://127.0.0.1:1", "c")
    got: list[tuple[str, int]] = []

    def callback(delivery: Delivery) -> None:
        assert isinstance(delivery, Notify)
        got.append((delivery.publication.id, delivery.seq))

    handle = SubscriptionHandle(client, "s", callback)
    client._subs["s"] = handle
    frames = [encode_frame([_notify("p1", "s", seq=1), _notify("p1", "s", seq=1)])]
    await client._read(_Frames(frames))
    assert got == [("p1", 1)]  # the second is the same delivery sent again: dropped
    assert handle.received == 1
    handle.seen = Seen()  # as a subscription whose window reaches into the past
    await client._read(_Frames([encode_frame([_notify("p2", "s"), _notify("p2", "s")])]))
    assert got == [("p1", 1), ("p2", 0)]  # received already: not handed out twice


# -- through real brokers -------------------------------------------------------------------------

BLOB = "x" * 1_000_000
COUNT = 200
SLACK = 24 << 20
"""What the client may allocate beyond the slow queue's limit: the frames on their way, the
publisher's own encoding, the reading subscription's latest deliveries."""


def _start(brokers: dict[str, BrokerProcess], name: str, *options: str) -> str:
    proc = BrokerProcess(name, options=options)
    brokers[name] = proc
    return proc.start()


async def _until(check: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


async def _at_least(items: list[int], count: int) -> None:
    await _until(lambda: len(items) >= count)


async def test_a_subscription_never_read_stays_bounded_while_another_gets_everything(
    brokers: dict[str, BrokerProcess],
) -> None:
    url = _start(brokers, "B")

    async with Client(url, "pub") as pub, Client(url, "sub") as sub:
        await pub.advertise("[class,eq,'Big'],[n,isPresent,0]")
        never = await sub.subscribe("[class,eq,'Big']", id="never")
        reader = await sub.subscribe("[class,eq,'Big'],[n,>=,0]", id="reader")
        assert never.statistics()[5:] == (MAX_PENDING, MAX_PENDING_BYTES)
        read: list[int] = []

        async def read_all() -> None:
            while len(read) < COUNT:
                note = await reader.get(timeout=15)
                assert isinstance(note, Notify)
                read.append(int(note.publication.attributes["n"]))

        reading = asyncio.ensure_future(read_all())
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            for n in range(COUNT):  # a few in flight: the broker's queue for us never fills
                await _at_least(read, n - 4)
                await pub.publish({"class": "Big", "n": n, "blob": BLOB}, id=f"p{n}")
            await asyncio.wait_for(reading, 15)
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        assert read == list(range(COUNT))  # the other subscription got everything, in order

        stats = never.statistics()
        assert stats.pending_bytes <= MAX_PENDING_BYTES < stats.pending_bytes + 1_001_000
        assert stats.pending + stats.dropped == COUNT and stats.delivered == 0
        assert stats.dropped_bytes >= stats.dropped * 1_000_000
        assert peak < MAX_PENDING_BYTES + SLACK, f"the client grew by {peak >> 20} MiB"

        kept, told = [], []
        while True:
            try:
                note = await never.get(timeout=0.5)
            except SlowConsumer as slow:
                told.append(slow)
                continue
            except TimeoutError:
                break
            assert isinstance(note, Notify)
            kept.append(int(note.publication.attributes["n"]))
        assert kept == list(range(stats.pending))  # the first, until the queue was full
        (once,) = told  # once, where the loss began
        assert once.subscription == "never" and once.dropped == stats.dropped
        assert once.pending == 0 and once.dropped_bytes == stats.dropped_bytes
        assert never.statistics().delivered == stats.pending


async def test_a_slow_handler_drops_what_its_queue_cannot_hold_and_logs_it_once(
    brokers: dict[str, BrokerProcess], caplog: pytest.LogCaptureFixture
) -> None:
    url = _start(brokers, "B")

    with caplog.at_level(logging.WARNING, logger="padres.client.connection"):
        release = asyncio.Event()
        handled: list[int] = []

        async def handler(note: Delivery) -> None:
            await release.wait()
            assert isinstance(note, Notify)
            handled.append(int(note.publication.attributes["n"]))

        async with Client(url, "pub") as pub, Client(url, "sub", max_pending=5) as sub:
            await pub.advertise("[class,eq,'T'],[n,isPresent,0]")
            handle = await sub.subscribe("[class,eq,'T']", handler, retries=0)
            await pub.publish({"class": "T", "n": 0})
            await _until(lambda: handle.statistics().delivered == 1)  # the handler has it
            for n in range(1, 20):
                await pub.publish({"class": "T", "n": n})
            await _until(lambda: handle.statistics().dropped == 14)  # five queued
            release.set()
            await _until(lambda: len(handled) == 6)
            assert handled == list(range(6))
            stats = handle.statistics()
            assert (stats.pending, stats.delivered, stats.max_pending) == (0, 6, 5)
    warnings = [r.getMessage() for r in caplog.records if "read too slowly" in r.getMessage()]
    assert len(warnings) == 1 and "14 deliveries" in warnings[0]


async def _read_durable(
    handle: SubscriptionHandle, count: int, pause: float
) -> tuple[list[int], list[int], int]:
    """A slow reader of durable ``handle``: the numbers and the ``n`` of what it gets, and the
    most bytes its queue held."""
    seqs: list[int] = []
    ns: list[int] = []
    most = 0
    while len(seqs) < count:
        most = max(most, handle.statistics().pending_bytes)
        note = await handle.get(timeout=15)
        assert isinstance(note, Notify)
        seqs.append(note.seq)
        ns.append(int(note.publication.attributes["n"]))
        await asyncio.sleep(pause)
    return seqs, ns, most


async def test_a_slow_durable_reader_gets_everything_once_in_order_held_back_by_the_window(
    brokers: dict[str, BrokerProcess],
) -> None:
    url = _start(brokers, "B")
    count, pad = 300, "d" * 40_000  # 12 MB: three times the broker's window

    async with Client(url, "pub") as pub, Client(url, "manager") as manager:
        await pub.advertise("[class,eq,'T'],[n,isPresent,0]")
        orders = await manager.subscribe("[class,eq,'T']", durable="orders")
        for n in range(count):
            await pub.publish({"class": "T", "n": n, "pad": pad}, guaranteed=True)
        await pub.flush(15)
        seqs, ns, most = await _read_durable(orders, count, 0.002)
        assert seqs == list(range(1, count + 1)) and ns == list(range(count))
        assert most <= DURABLE_WINDOW_BYTES + 50_000  # the rest waited at the broker
        stats = orders.statistics()
        assert (stats.pending, stats.dropped, stats.delivered) == (0, 0, count)
        with pytest.raises(TimeoutError):
            await orders.get(timeout=0.3)  # nothing twice
        await manager.unsubscribe("orders")


async def test_a_durable_queue_below_the_window_stops_the_reading_and_loses_nothing(
    brokers: dict[str, BrokerProcess], caplog: pytest.LogCaptureFixture
) -> None:
    url = _start(brokers, "B")
    count = 200

    with caplog.at_level(logging.WARNING, logger="padres.client.connection"):
        async with Client(url, "pub") as pub, Client(url, "manager") as manager:
            await pub.advertise("[class,eq,'T'],[n,isPresent,0]")
            orders = await manager.subscribe(
                "[class,eq,'T']", durable="orders", max_pending=8, max_pending_bytes=1 << 20
            )
            for n in range(count):
                await pub.publish({"class": "T", "n": n, "pad": "p" * 5000}, guaranteed=True)
            await pub.flush(15)
            most = 0
            seqs: list[int] = []
            while len(seqs) < count:
                most = max(most, orders.statistics().pending)
                note = await orders.get(timeout=15)
                assert isinstance(note, Notify)
                seqs.append(note.seq)
                await asyncio.sleep(0.001)
            assert seqs == list(range(1, count + 1))
            assert most <= 8 and orders.statistics().dropped == 0
            assert await manager.query("subscriptions")  # requests are answered meanwhile
            await manager.unsubscribe("orders")
    assert "durable subscription orders may hold 8 deliveries" in caplog.text


async def _durable_round(url: str, shop: Client, first: int) -> list[int]:
    """The manager back on durable subscription ``orders`` while 50 are published from
    ``first``, and gone as soon as its handler took them: what it took."""
    seen: list[int] = []

    def take(delivery: Delivery) -> None:
        assert isinstance(delivery, Notify)
        seen.append(int(delivery.publication.attributes["n"]))

    async with Client(url, "manager") as manager:
        await manager.subscribe("[class,eq,'T']", take, durable="orders")
        for n in range(first, first + 50):
            await shop.publish({"class": "T", "n": n}, guaranteed=True)
        await shop.flush(10)
        await _until(lambda: len(seen) >= 50)
    return seen


async def test_closing_acknowledges_what_was_processed_so_nothing_comes_twice(
    brokers: dict[str, BrokerProcess],
) -> None:
    """A durable subscriber closes right after its handler took the last delivery (before the
    acknowledgement it sends shortly after would have gone): back, it gets only what is new."""
    url = _start(brokers, "B")
    async with Client(url, "shop") as shop:
        await shop.advertise("[class,eq,'T'],[n,isPresent,0]")
        assert await _durable_round(url, shop, 0) == list(range(50))
        assert await _durable_round(url, shop, 50) == list(range(50, 100))


async def test_a_client_that_closes_and_comes_straight_back_is_let_in_under_its_name(
    brokers: dict[str, BrokerProcess],
) -> None:
    """Its old connection's end may not have been handled when the new hello comes: the
    broker waits for it, briefly, rather than refusing the name. A second client of a name
    still connected is refused, after that wait."""
    url = _start(brokers, "B")
    for _ in range(20):
        async with Client(url, "manager") as manager:
            await manager.subscribe("[class,eq,'T']", durable="orders")
    async with Client(url, "manager"):
        started = time.monotonic()
        with pytest.raises(PadresError, match="a client named 'manager' is already connected"):
            async with Client(url, "manager"):
                pass
        assert time.monotonic() - started >= 1.0
