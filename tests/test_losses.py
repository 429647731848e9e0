"""Plain publications a link dropped, reported to their publishers: the summary of what a link
queue did not send, the report's way up the tree in the broker core, and real brokers whose
link stalls until they give it up (it stops answering, or its queue overflows)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from datetime import UTC, datetime

import orjson
import pytest

from padres.broker import losses as losses_module
from padres.broker.losses import Dropped, Tally
from padres.client.connection import Client
from padres.language.parser import parse_advertisement, parse_subscription
from padres.model.codec import encode
from padres.model.messages import Publication
from padres.model.protocol import (
    Error,
    Lost,
    Notify,
    Outcome,
    Rejected,
    RouteLoss,
    RoutePublish,
    RouteSubscribe,
    RouteTxPublish,
    decode_frame,
)
from padres.runtime.send_queue import SendQueue
from padres.runtime.simulation import SimClient, Simulation
from padres.runtime.unsent import summarise
from padres.testing.processes import BrokerProcess
from padres.testing.proxy import Proxy
from tests.support import Numbers, eventually, health

# -- the tally -------------------------------------------------------------------------------------


def test_a_tally_keeps_count_first_and_last_per_tree_and_publisher() -> None:
    tally = Tally()
    for n in range(5):
        tally.add("t1", "shop@A", f"p{n}")
    tally.add("t2", "shop@A", "q1")
    later = Tally()
    later.add("t1", "shop@A", "p5")
    later.add("t1", "desk@A", "d1")
    tally.extend(later)
    assert list(tally) == [
        Dropped("t1", "shop@A", 6, "p0", "p5"),
        Dropped("t2", "shop@A", 1, "q1", "q1"),
        Dropped("t1", "desk@A", 1, "d1", "d1"),
    ]
    assert tally.total == 8 and tally.others == 0


def test_a_tally_is_bounded_in_publishers_and_counts_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(losses_module, "PUBLISHERS", 2)
    tally = Tally()
    for publisher in ("a@A", "b@A", "c@A", "a@A", "d@A"):
        tally.add("t", publisher, "p")
    later = Tally()
    later.add("t", "e@A", "p")
    later.add("t", "b@A", "p9")
    tally.extend(later)
    assert [(d.publisher, d.count, d.last) for d in tally] == [("a@A", 2, "p"), ("b@A", 2, "p9")]
    assert tally.total == 7 and tally.others == 3


# -- what a link queue did not send ----------------------------------------------------------------


_AT = datetime(2026, 1, 1, tzinfo=UTC)


def _pub(n: int, publisher: str = "shop@A") -> Publication:
    return Publication(f"p{n}", {"class": "T", "n": n}, _AT, publisher=publisher)


async def test_the_unsent_plain_publications_are_summarised_the_rest_skipped() -> None:
    sub = parse_subscription("[class,eq,'T']", id="B#1.1")
    queued = deque(
        encode(message)
        for message in (
            RoutePublish(_pub(1), "A#1.1"),
            RouteSubscribe(sub, ("A#1.1",)),
            RoutePublish(_pub(2), "A#1.1", position=7),  # guaranteed: recovered, not reported
            RoutePublish(_pub(3, "desk@A"), "A#1.2"),
            RouteTxPublish(_pub(4), "A#1.1", "shop@A:t1", Outcome.PENDING),
            Notify(_pub(5), ("s1",)),
            RoutePublish(_pub(6), "A#1.1"),
            RoutePublish(_pub(8), "A#1.1"),
        )
    )
    queued.append(b'{"type":"route_publish","tree":')  # not JSON: skipped
    tally = await summarise(queued)
    assert list(tally) == [
        Dropped("A#1.1", "shop@A", 3, "p1", "p8"),
        Dropped("A#1.2", "desk@A", 1, "p3", "p3"),
    ]
    assert tally.total == 4 and not queued  # read once, and let go of


async def test_a_full_link_queue_is_summarised_between_other_work() -> None:
    """64 MiB of small publications: read in slices, the event loop serving others between."""
    data = encode(RoutePublish(_pub(1), "A#1.1"))
    queued = deque([data] * ((64 << 20) // len(data)))
    count = len(queued)
    gaps: list[float] = []  # between two turns of another task

    async def other_work() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    other = asyncio.get_running_loop().create_task(other_work())
    started = time.perf_counter()
    tally = await summarise(queued)
    took = time.perf_counter() - started
    other.cancel()
    assert tally.total == count and [d.count for d in tally] == [count]
    assert len(gaps) > 1  # measured: 324,000 messages in 0.35 s, the longest wait 27 ms
    assert max(gaps) < 0.25, f"the loop waited {max(gaps):.3f} s ({count:,} in {took:.2f} s)"


async def test_a_link_queue_keeps_what_it_did_not_send_a_client_queue_does_not() -> None:
    async def send(frame: bytes) -> None:
        await asyncio.Event().wait()  # a peer that reads nothing

    async def close(code: int, reason: str) -> None:
        pass

    def queued(n: int) -> bytes:
        return encode(RoutePublish(_pub(n), "t"))

    link = SendQueue(send, close, limit=1 << 20)
    link.make_link(4 * len(queued(0)), lambda: None)
    assert link.put(queued(0))
    await asyncio.sleep(0)  # the writer takes it into a frame: in the socket, never read
    assert [link.put(queued(n)) for n in range(1, 6)] == [True] * 3 + [False] * 2
    assert link.failing  # it overflowed at p4: what it held is given up, p5 refused
    unsent = link.unsent()
    assert list(unsent) == [queued(n) for n in (1, 2, 3)] and not link.unsent()
    assert link.dropped == 3
    await link.close()

    client = SendQueue(send, close, limit=1 << 20)
    assert client.put(queued(1))
    client.discard()
    assert not client.unsent()
    await client.close()


# -- the report's way to its publisher (sans-IO) ---------------------------------------------------


def _chain(*names: str) -> Simulation:
    sim = Simulation(3)
    for name in names:
        sim.add_broker(name)
    for a, b in itertools.pairwise(names):
        sim.link(a, b)
    sim.run()
    return sim


def _lost(client: SimClient) -> list[Lost]:
    return [m for m in client.other if isinstance(m, Lost)]


def _tree(sim: Simulation, broker: str) -> str:
    (tree,) = sim.brokers[broker].trees
    return tree.id


def test_a_report_goes_up_the_tree_to_the_publisher_at_its_root(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A-B-C-D, the publisher at A, a subscriber at D: C dropped what it had for D; its report
    goes to B, which passes it on to A, which tells the publisher."""
    sim = _chain("A", "B", "C", "D")
    shop, desk = sim.attach("shop", "A"), sim.attach("desk", "A")
    sub = sim.attach("sub", "D")
    sim.send(shop, parse_advertisement("[class,eq,'T']", id="a"))
    sim.run()
    sim.send(sub, parse_subscription("[class,eq,'T']", id="s"))
    sim.run()
    tree = _tree(sim, "C")
    tally = Tally()
    for n in range(17, 1221):
        tally.add(tree, "shop@A", f"p{n}")
    tally.add(tree, "desk@A", "d1")  # made in the same tree, by a client that is not its root
    with caplog.at_level(logging.INFO, "padres.broker"):
        reports = sim.brokers["C"].lost("D", tally, "link queue overflow")
        assert [(hop, type(m)) for hop, m in reports] == [("B", RouteLoss)] * 2  # up the tree
        caplog.clear()
        sim.lose("C", "D", tally, "link queue overflow")  # passed on by B, the only way to A
        sim.run()
    assert _lost(shop) == [
        Lost(tree, "shop@A", 1204, "p17", "p1220", "C", "D", "link queue overflow")
    ]
    assert _lost(desk) == [Lost(tree, "desk@A", 1, "d1", "d1", "C", "D", "link queue overflow")]
    assert not _lost(sub)
    assert "1,205 plain publications dropped on the link to D" in caplog.text
    assert "2 of 2 publishers told" in caplog.text


def test_at_the_root_itself_the_publisher_is_told_at_once() -> None:
    sim = _chain("A", "B")
    shop, sub = sim.attach("shop", "A"), sim.attach("sub", "B")
    sim.send(shop, parse_advertisement("[class,eq,'T']", id="a"))
    sim.run()
    sim.send(sub, parse_subscription("[class,eq,'T']", id="s"))
    sim.run()
    tally = Tally()
    tally.add(_tree(sim, "A"), "shop@A", "p1")
    sim.lose("A", "B", tally, "the link was lost")
    assert sim.queued("A", "B") == []
    sim.run()
    (lost,) = _lost(shop)
    assert (lost.count, lost.first, lost.broker, lost.neighbour) == (1, "p1", "A", "B")


def test_a_report_nobody_can_take_is_logged_and_dropped(caplog: pytest.LogCaptureFixture) -> None:
    sim = _chain("A", "B", "C")
    shop, sub = sim.attach("shop", "A"), sim.attach("sub", "C")
    sim.send(shop, parse_advertisement("[class,eq,'T']", id="a"))
    sim.run()
    sim.send(sub, parse_subscription("[class,eq,'T']", id="s"))
    sim.run()
    tree = _tree(sim, "B")
    tally = Tally()
    tally.add(tree, "gone@A", "p1")  # its publisher is not connected at A
    tally.add("A#9.9", "shop@A", "p2")  # a tree B does not know
    with caplog.at_level(logging.INFO, "padres.broker"):
        sim.lose("B", "C", tally, "link queue overflow")
        sim.run()
    assert not _lost(shop)
    assert "A: not told: 1 publications of gone@A dropped at B (it is not connected here)" in (
        caplog.text
    )
    assert "tree A#9.9 is unknown here" in caplog.text
    assert "1 of 2 publishers told" in caplog.text


def test_only_a_neighbour_below_in_the_tree_may_report() -> None:
    sim = _chain("A", "B")
    shop, sub = sim.attach("shop", "A"), sim.attach("sub", "B")
    sim.send(shop, parse_advertisement("[class,eq,'T']", id="a"))
    sim.run()
    tree = _tree(sim, "B")
    report = RouteLoss(tree, "shop@A", 3, "p1", "p3", "B", "C", "link queue overflow")
    a, b = sim.brokers["A"], sim.brokers["B"]
    told = Lost(tree, "shop@A", 3, "p1", "p3", "B", "C", "link queue overflow")
    assert a.handle(report, "B") == [(next(iter(a.sessions)), told)]
    assert b.handle(report, "A") == []  # from its parent: it goes up, never down
    (refused,) = b.handle(report, next(iter(b.sessions)))  # sub's: a client may not
    assert isinstance(refused[1], Error) and "may not send RouteLoss" in refused[1].text
    assert not _lost(sub)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"count": 0}, "count"),
        ({"count": 2**53 + 1}, "count"),
        ({"first": "p 1"}, "publication id"),
        ({"publisher": ""}, "publisher id"),
        ({"reason": "x" * 1001}, "reason"),
    ],
)
def test_a_report_out_of_bounds_is_refused(change: dict[str, object], why: str) -> None:
    fields = {
        "type": "route_loss",
        "v": 1,
        "tree": "A#1.1",
        "publisher": "shop@A",
        "count": 3,
        "first": "p1",
        "last": "p3",
        "broker": "B",
        "neighbour": "C",
        "reason": "link queue overflow",
    }
    (ok,) = decode_frame(orjson.dumps(fields))
    assert isinstance(ok, RouteLoss)
    (refused,) = decode_frame(orjson.dumps(fields | change))
    assert isinstance(refused, Rejected) and why in str(refused.error)


# -- real brokers: a link that stalls --------------------------------------------------------------

PAD = "x" * 16_000
"""Publications of about 16 KB: a stalled link's queue fills with many bytes, few of which sit
in the sockets on the way (about 1 MB, measured)."""
IN_SOCKETS = 2 << 20
"""Bytes of publications that may be neither delivered nor reported: what B had written into
its socket to the proxy (256 KiB asked of the kernel, which doubles it, the frame being
written, 256 KiB at most, and the transport's buffer) and what the proxy holds (its small
buffers), which go with the connection unreported."""


async def test_a_publisher_is_told_what_a_link_that_stopped_answering_dropped(
    brokers: dict[str, BrokerProcess],
) -> None:
    """A chain A-B-C whose link goes through a proxy (C dials B through it); B pings every
    2 s and drops a neighbour it has not heard for 4. The publisher at A sends 200
    publications, which reach the subscriber at C; the proxy stalls, and the publisher sends
    1,800 more of 16 KB, which wait in B's link queue until B drops the link, 4 to 6 s
    later. B then reports them up the tree to A, which tells the publisher.

    Every publication is either received at C or reported, never both: the reported ones are
    one run of numbers after the received ones, and the gap between the two is what sat in
    the sockets (``IN_SOCKETS``: 48 to 64 publications, measured)."""
    count, before = 2000, 200
    url = {"B": _start(brokers, "B", "--heartbeat", "2", "--pause-at", "48")}
    proxy = Proxy(brokers["B"].port, buffers=1 << 16)
    url["C"] = _start(brokers, "C", neighbours=(await proxy.start(),))
    url["A"] = _start(brokers, "A", neighbours=(url["B"],))
    reports: list[Lost] = []
    got = Numbers()
    try:
        # The proxy runs in this event loop: wait without blocking it.
        await eventually(lambda: health(url["B"])["neighbours"] == ["A", "C"])
        async with (
            Client(url["A"], "shop", on_lost=reports.append) as shop,
            Client(url["C"], "manager", timeout=30) as manager,
        ):
            await manager.subscribe("[class,eq,'T']", got)
            await shop.advertise("[class,eq,'T'],[n,isPresent,0],[pad,isPresent,'']")
            await _publish(shop, 0, before)
            await eventually(lambda: len(got.got) == before)
            received = health(url["B"])["received"]
            proxy.stall()
            try:
                await _publish(shop, before, count)
                await eventually(lambda: health(url["B"])["received"] >= received + count - before)
                held = health(url["B"])
                assert held["neighbours"] == ["A", "C"], "B dropped the link before it had all"
                await eventually(lambda: shop.lost > 0)
            finally:
                proxy.resume()
            await asyncio.sleep(0.5)  # what the proxy held reaches C; nothing more is reported
        lost = _numbers(reports)
        assert shop.lost == sum(r.count for r in reports) == len(lost) > count // 2
        assert {(r.broker, r.neighbour, r.reason) for r in reports} == {
            ("B", "C", "the link was lost")
        }
        assert not lost & set(got.got)  # reported lost, and never received
        assert got.got == list(range(len(got.got)))  # the received ones: a prefix, in order
        unaccounted = count - len(got.got) - len(lost)
        size = len(PAD) + 200
        assert 0 <= unaccounted * size <= IN_SOCKETS, (len(got.got), len(lost), unaccounted)
    finally:
        await proxy.cut()


async def test_a_publisher_is_told_what_a_link_queue_overflowing_dropped(
    brokers: dict[str, BrokerProcess],
) -> None:
    """A chain A-B-C whose link from B to C goes through a proxy; B gives a link up at 1 MiB
    of backlog (and would pause its publishers only at 16). The proxy stalls and the
    publisher at A sends 600 publications of 16 KB: B's link queue overflows, and B reports
    what it held and refused; the received ones and the reported ones do not meet (what
    came after the link was gone has no route to C: neither received nor reported)."""
    count = 600
    url = {"C": _start(brokers, "C")}
    proxy = Proxy(brokers["C"].port, buffers=1 << 16)
    options = ("--link-queue", "1", "--pause-at", "16")
    url["B"] = _start(brokers, "B", *options, neighbours=(await proxy.start(),))
    url["A"] = _start(brokers, "A", neighbours=(url["B"],))
    reports: list[Lost] = []
    got = Numbers()
    try:
        await eventually(lambda: health(url["B"])["neighbours"] == ["A", "C"])
        async with (
            Client(url["A"], "shop", on_lost=reports.append) as shop,
            Client(url["C"], "manager", timeout=30) as manager,
        ):
            await manager.subscribe("[class,eq,'T']", got)
            await shop.advertise("[class,eq,'T'],[n,isPresent,0],[pad,isPresent,'']")
            proxy.stall()
            try:
                await _publish(shop, 0, count)
                await eventually(lambda: shop.lost > 0)
            finally:
                proxy.resume()
            await asyncio.sleep(0.5)
        lost = _numbers(reports)
        assert shop.lost == sum(r.count for r in reports) == len(lost)
        assert all(r.reason.startswith("link queue overflow") for r in reports)
        assert not lost & set(got.got)
        assert got.got == list(range(len(got.got)))
        assert len(got.got) + len(lost) <= count
    finally:
        await proxy.cut()


async def test_a_broker_drops_a_neighbour_it_dialled_that_stopped_reading(
    brokers: dict[str, BrokerProcess],
) -> None:
    """B dials C through a proxy and pings every second. The proxy stalls while the publisher
    at A sends 600 publications of 16 KB: B's socket to it fills, so B's ping cannot even be
    written. B still drops the link once C has been silent for two seconds (it once waited on
    that ping for ever), and tells the publisher what it held."""
    url = {"C": _start(brokers, "C")}
    proxy = Proxy(brokers["C"].port, buffers=1 << 16)
    options = ("--heartbeat", "1", "--pause-at", "48")
    url["B"] = _start(brokers, "B", *options, neighbours=(await proxy.start(),))
    url["A"] = _start(brokers, "A", neighbours=(url["B"],))
    reports: list[Lost] = []
    try:
        await eventually(lambda: health(url["B"])["neighbours"] == ["A", "C"])
        async with Client(url["A"], "shop", on_lost=reports.append) as shop:
            await shop.advertise("[class,eq,'T'],[n,isPresent,0],[pad,isPresent,'']")
            async with Client(url["C"], "manager", timeout=30) as manager:
                await manager.subscribe("[class,eq,'T']", Numbers())
                proxy.stall()
                stalled = time.monotonic()
                try:
                    await _publish(shop, 0, 600)
                    await eventually(lambda: "C" not in health(url["B"])["neighbours"], 20)
                    dropped_after = time.monotonic() - stalled
                    await eventually(lambda: shop.lost > 0)
                finally:
                    proxy.resume()
        assert dropped_after < 10, dropped_after
        assert {r.reason for r in reports} == {"keepalive ping timeout"}
    finally:
        await proxy.cut()


def _start(
    brokers: dict[str, BrokerProcess], name: str, *options: str, neighbours: tuple[str, ...] = ()
) -> str:
    proc = brokers[name] = BrokerProcess(name, neighbours=neighbours, options=options)
    return proc.start()


def _numbers(reports: list[Lost]) -> set[int]:
    """The numbers of the publications ``reports`` name: each a run from ``first`` to
    ``last`` (ids ``p<n>``)."""
    return {n for r in reports for n in range(int(r.first[1:]), int(r.last[1:]) + 1)}


async def _publish(client: Client, first: int, end: int, batch: int = 50) -> None:
    for start in range(first, end, batch):
        await client.publish_many(
            [
                Publication(f"p{n}", {"class": "T", "n": n, "pad": PAD}, datetime.now(UTC))
                for n in range(start, min(start + batch, end))
            ]
        )
