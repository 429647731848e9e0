"""Guaranteed delivery with real broker processes: kill -9, restarts, clients away."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from padres.client.connection import Client, Delivery
from padres.model.messages import Origin, Publication
from padres.model.protocol import Notify
from padres.testing.processes import BrokerProcess, faketime, free_ports
from tests.support import wait_linked

pytestmark = pytest.mark.anyio

RING = ["AB", "BC", "CD", "DE", "EA", "AC"]


@pytest.fixture
def ring(tmp_path: Path) -> Iterator[dict[str, BrokerProcess]]:
    """Five brokers in a ring with a chord, each with its journal under ``tmp_path``."""
    names = "ABCDE"
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    procs: dict[str, BrokerProcess] = {}
    try:
        for name in names:
            dials = [link[1] for link in RING if link[0] == name]
            procs[name] = BrokerProcess(
                name,
                port=ports[name],
                neighbours=[f"ws://127.0.0.1:{ports[n]}" for n in dials],
                options=["--heartbeat", "1", "--data", str(tmp_path / name)],
            )
            procs[name].start()
        wait_linked(RING, {name: proc.url for name, proc in procs.items()})
        yield procs
    finally:
        for proc in procs.values():
            proc.stop()


class _Received:
    """A durable subscriber's deliveries, by publisher, in the order they came."""

    def __init__(self) -> None:
        self.by_publisher: dict[str, list[int]] = {}

    def __call__(self, delivery: Delivery) -> None:
        assert isinstance(delivery, Notify)
        pub = delivery.publication
        self.by_publisher.setdefault(pub.publisher, []).append(int(pub.attributes["n"]))

    def complete(self, publishers: dict[str, int]) -> bool:
        return all(len(self.by_publisher.get(p, [])) >= n for p, n in publishers.items())


async def _wait(check: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            return
        await asyncio.sleep(0.1)


async def test_every_durable_subscriber_gets_every_publication_once_while_each_broker_is_killed(
    ring: dict[str, BrokerProcess],
) -> None:
    count, rate = 20_000, 2_000  # per publisher: ten seconds of publishing
    async with contextlib.AsyncExitStack() as stack:
        url = {name: proc.url for name, proc in ring.items()}
        publishers = {}
        for at in "AC":
            client = Client(url[at], f"pub{at}", reconnect=True, timeout=30)
            publishers[f"pub{at}@{at}"] = await stack.enter_async_context(client)
        inboxes = {}
        for at in "BDE":
            client = Client(url[at], f"sub{at}", reconnect=True, timeout=30)
            sub = await stack.enter_async_context(client)
            inboxes[at] = _Received()
            await sub.subscribe("[class,eq,'T']", inboxes[at], durable="all")
        for pub in publishers.values():
            await pub.advertise("[class,eq,'T'],[n,isPresent,0]")

        async def publish(pub: Client) -> None:
            started = time.monotonic()
            for n in range(count):
                await pub.publish({"class": "T", "n": n}, guaranteed=True)
                ahead = started + n / rate - time.monotonic()
                if ahead > 0:
                    await asyncio.sleep(ahead)

        async def kill_each() -> None:
            for victim in "BCDEA":
                await asyncio.sleep(count / rate / 6)
                ring[victim].kill()
                await asyncio.sleep(0.3)
                await asyncio.to_thread(ring[victim].start)

        await asyncio.gather(kill_each(), *(publish(p) for p in publishers.values()))
        for pub in publishers.values():
            await pub.flush(timeout=60)
        expected = dict.fromkeys(publishers, count)
        await _wait(lambda: all(i.complete(expected) for i in inboxes.values()), 60)
        for at, inbox in inboxes.items():
            for name in publishers:
                got = inbox.by_publisher.get(name, [])
                missing = len(set(range(count)) - set(got))
                twice = len(got) - len(set(got))
                assert got == list(range(count)), (at, name, missing, twice)


async def test_a_durable_subscriber_away_for_a_while_resumes_with_nothing_lost_or_twice(
    ring: dict[str, BrokerProcess],
) -> None:
    url = {name: proc.url for name, proc in ring.items()}
    async with Client(url["A"], "shop") as shop:
        await shop.advertise("[class,eq,'T'],[n,isPresent,0]")
        first = _Received()
        async with Client(url["D"], "manager") as manager:
            await manager.subscribe("[class,eq,'T']", first, durable="orders")
            for n in range(100):
                await shop.publish({"class": "T", "n": n}, guaranteed=True)
            await shop.flush(10)
            await _wait(lambda: first.complete({"shop@A": 100}), 10)
        left = time.monotonic()
        for n in range(100, 1100):  # the manager is away, for ten seconds
            await shop.publish({"class": "T", "n": n}, guaranteed=True)
            await asyncio.sleep(0.008)
        await shop.flush(10)
        await asyncio.sleep(max(0.0, left + 10 - time.monotonic()))
        second = _Received()
        async with Client(url["D"], "manager") as manager:
            await manager.subscribe("[class,eq,'T']", second, durable="orders")
            await _wait(lambda: second.complete({"shop@A": 1000}), 20)
            await manager.unsubscribe("orders")
        assert first.by_publisher["shop@A"] == list(range(100))
        assert second.by_publisher["shop@A"] == list(range(100, 1100))


async def test_padres_pub_guaranteed_run_twice_publishes_twice(
    brokers: dict[str, BrokerProcess],
) -> None:
    """The command's ids are its file's line numbers: each run makes them its own, so the broker
    does not take a second run for a resend of the first."""
    brokers["B1"] = BrokerProcess("B1")
    url = brokers["B1"].start()
    got: list[int] = []
    async with Client(url, "manager") as manager:
        inbox = await manager.subscribe("[class,eq,'Run']", durable="runs")
        for n in (1, 2):
            publish = [sys.executable, "-m", "padres.cli", "pub", "--broker", url, "--name"]
            publish += ["clerk", "--guaranteed", f"[class,'Run'],[n,{n}]"]
            done = await asyncio.to_thread(subprocess.run, publish, capture_output=True)
            assert done.returncode == 0, done.stderr
        for _ in (1, 2):
            delivery = await inbox.get(timeout=10)
            assert isinstance(delivery, Notify)
            got.append(int(delivery.publication.attributes["n"]))
    assert got == [1, 2]


@pytest.mark.parametrize("skew", [-30.0, 30.0])
async def test_a_first_contact_across_skewed_clocks_loses_nothing_and_leaks_nothing(
    tmp_path: Path, skew: float
) -> None:
    """C's clock runs ``skew`` seconds off A's, and C is cut off from A (B, between them, is
    not up) while a durable subscription is made at C: when B comes up and C first meets A's
    tree, the subscription gets exactly what A accepted after it was made."""
    try:
        faketime(skew)
    except RuntimeError as exc:
        pytest.skip(str(exc))
    ports = dict(zip("ABC", free_ports(3), strict=True))
    url = {name: f"ws://127.0.0.1:{port}" for name, port in ports.items()}
    options = ["--heartbeat", "1"]
    a = BrokerProcess("A", port=ports["A"], options=options)
    b = BrokerProcess("B", port=ports["B"], neighbours=[url["A"]], options=options)
    c = BrokerProcess("C", port=ports["C"], neighbours=[url["B"]], options=options, skew=skew)
    try:
        a.start()
        c.start()
        async with Client(a.url, "shop") as shop, Client(c.url, "manager") as manager:
            await shop.advertise("[class,eq,'T'],[n,isPresent,0]")
            for n in range(20):
                await shop.publish({"class": "T", "n": n}, guaranteed=True)
            await shop.flush(10)
            await asyncio.sleep(1.0)
            got = _Received()
            await manager.subscribe("[class,eq,'T']", got, durable="orders")
            await asyncio.sleep(1.0)
            for n in range(20, 40):
                await shop.publish({"class": "T", "n": n}, guaranteed=True)
            await shop.flush(10)
            await asyncio.to_thread(b.start)
            await _wait(lambda: got.complete({"shop@A": 20}), 20)
            await asyncio.sleep(1.0)
            assert got.by_publisher.get("shop@A") == list(range(20, 40))
    finally:
        for proc in (a, b, c):
            proc.stop()


async def test_a_publisher_whose_broker_is_killed_sends_again_through_another_once(
    tmp_path: Path,
) -> None:
    """A chain A-B-C; the publisher knows A and B, the durable subscriber is at C. A is
    killed while the publisher publishes: the publisher fails over to B and sends again what
    A had not acknowledged, with the same producer and numbers; A comes back later with its
    journal. The subscriber gets every publication once."""
    ports = dict(zip("ABC", free_ports(3), strict=True))
    url = {name: f"ws://127.0.0.1:{port}" for name, port in ports.items()}
    procs = {
        name: BrokerProcess(
            name,
            port=ports[name],
            neighbours=[url[n] for n in {"A": "", "B": "A", "C": "B"}[name]],
            options=["--heartbeat", "1", "--data", str(tmp_path / name)],
        )
        for name in "ABC"
    }
    count = 2_000
    try:
        for proc in procs.values():
            proc.start()
        wait_linked(["AB", "BC"], url)
        got = _Received()
        async with (
            Client(url["C"], "manager", reconnect=True) as manager,
            Client([url["A"], url["B"]], "shop", reconnect=True, timeout=30) as shop,
        ):
            await manager.subscribe("[class,eq,'T']", got, durable="orders")
            await shop.advertise("[class,eq,'T'],[n,isPresent,0]")
            for n in range(count):
                await shop.publish({"class": "T", "n": n}, guaranteed=True)
                if n == count // 2:
                    procs["A"].kill()
                await asyncio.sleep(0.001)
            await shop.flush(60)
            assert shop.url == f"{url['B']}/ws"
            await asyncio.to_thread(procs["A"].start)
            await _wait(
                lambda: (
                    len(got.by_publisher.get("shop@A", []))
                    + len(got.by_publisher.get("shop@B", []))
                    >= count
                ),
                60,
            )
            await asyncio.sleep(2.0)
        numbers = [n for ns in got.by_publisher.values() for n in ns]
        twice = len(numbers) - len(set(numbers))
        missing = count - len(set(numbers))
        assert (missing, twice) == (0, 0)
    finally:
        for proc in procs.values():
            proc.stop()


async def test_publications_sent_again_through_another_broker_are_taken_once(
    tmp_path: Path,
) -> None:
    """The application sends its 100 guaranteed publications again, under the same producer
    and numbers, through another broker (as after losing the first with their
    acknowledgements): the durable subscriber gets each once, at both ends of the chain."""
    ports = dict(zip("ABC", free_ports(3), strict=True))
    url = {name: f"ws://127.0.0.1:{port}" for name, port in ports.items()}
    procs = {
        name: BrokerProcess(
            name, port=ports[name], neighbours=[url[n] for n in {"A": "", "B": "A", "C": "B"}[name]]
        )
        for name in "ABC"
    }
    sent = [
        Publication(
            f"order-{n}", {"class": "T", "n": n}, datetime.now(UTC), origin=Origin("shop", n)
        )
        for n in range(1, 101)
    ]
    try:
        for proc in procs.values():
            proc.start()
        wait_linked(["AB", "BC"], url)
        inboxes = {at: _Received() for at in "AC"}
        async with contextlib.AsyncExitStack() as stack:
            for at, inbox in inboxes.items():
                client = await stack.enter_async_context(Client(url[at], f"manager{at}"))
                await client.subscribe("[class,eq,'T']", inbox, durable="orders")
            for at in "AB":
                async with Client(url[at], "shop") as shop:
                    await shop.advertise("[class,eq,'T'],[n,isPresent,0]")
                    await shop.publish_many(sent, guaranteed=True)
                    await shop.flush(10)
            await _wait(lambda: all(i.complete({"shop@A": 100}) for i in inboxes.values()), 10)
            await asyncio.sleep(1.0)
        for inbox in inboxes.values():
            assert inbox.by_publisher == {"shop@A": list(range(1, 101))}
    finally:
        for proc in procs.values():
            proc.stop()
