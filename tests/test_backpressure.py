"""Back-pressure across the overlay, with real broker processes: a slow link between two
brokers slows the publishers of another."""

from __future__ import annotations

from datetime import UTC, datetime

from padres.client.connection import Client
from padres.model.messages import Publication
from padres.testing.processes import BrokerProcess
from padres.testing.proxy import Proxy
from tests.support import Numbers, eventually, health

COUNT = 6000
BATCH = 100


async def test_a_slow_link_further_on_slows_the_publisher_and_nothing_is_lost() -> None:
    """A chain A-B-C whose link from B to C carries 1.5 MB a second (a proxy); B pauses at
    0.25 MiB of link backlog and gives up a link at 4 MiB. A publisher at A sends 6 MB as fast
    as it can: B's congestion reaches A, which reads its publisher no more until it clears,
    so B's link never overflows and the subscriber at C gets every publication."""
    c = BrokerProcess("C")
    url = {"C": c.start()}
    proxy = Proxy(c.port, rate=1_500_000)
    b = BrokerProcess(
        "B",
        neighbours=[await proxy.start()],
        options=["--link-queue", "4", "--pause-at", "0.25"],
    )
    url["B"] = b.start()
    a = BrokerProcess("A", neighbours=[url["B"]])
    url["A"] = a.start()
    try:
        # The proxy runs in this event loop: wait without blocking it.
        await eventually(lambda: health(url["B"])["neighbours"] == ["A", "C"])
        got = Numbers()
        async with (
            Client(url["A"], "shop") as shop,
            Client(url["C"], "manager", timeout=30) as manager,
        ):
            await manager.subscribe("[class,eq,'T']", got)
            await shop.advertise("[class,eq,'T'],[n,isPresent,0],[pad,isPresent,'']")
            for first in range(0, COUNT, BATCH):
                batch = [
                    Publication(
                        f"p{n}", {"class": "T", "n": n, "pad": "x" * 900}, datetime.now(UTC)
                    )
                    for n in range(first, first + BATCH)
                ]
                await shop.publish_many(batch)
            try:
                await eventually(lambda: len(got.got) >= COUNT, 60)
            except AssertionError:
                status = {name: health(u) for name, u in url.items()}
                raise AssertionError(f"{len(got.got)} of {COUNT} arrived; {status}") from None
        assert got.got == list(range(COUNT))
        assert health(url["A"])["paused"] > 0  # A's publisher was held back
        assert health(url["B"])["neighbours"] == ["A", "C"]  # the link was never given up
    finally:
        await proxy.cut()
        for proc in (a, b, c):
            proc.stop()
