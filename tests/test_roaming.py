"""A durable subscriber that moves between brokers with its client, across real broker
processes: each guaranteed publication once, in order, wherever it goes."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from padres.client.connection import Client
from padres.testing.processes import BrokerProcess, DatabaseProcess
from padres.testing.proxy import Proxy
from tests.support import Numbers, eventually, wait_linked

COUNT = 900


def _at_least(items: list[int], count: int) -> bool:
    return len(items) >= count


async def test_a_durable_subscriber_moves_between_three_brokers_with_nothing_lost_or_doubled(
    tmp_path: Path,
) -> None:
    """A chain A-B-C, the publisher at A, the durable subscriber at C listing C, B and A. C is
    killed while guaranteed publications flow: the client fails over to B and brings its
    subscription along; then B is killed and it moves to A. It gets every publication once,
    in order."""
    procs = {
        name: BrokerProcess(name, options=["--heartbeat", "1", "--data", str(tmp_path / name)])
        for name in "ABC"
    }
    url = {"A": procs["A"].start()}
    procs["B"].neighbours = [url["A"]]
    url["B"] = procs["B"].start()
    procs["C"].neighbours = [url["B"]]
    url["C"] = procs["C"].start()
    try:
        wait_linked([("A", "B"), ("B", "C")], url)
        got = Numbers()
        async with (
            Client(url["A"], "shop") as shop,
            Client([url["C"], url["B"], url["A"]], "manager", reconnect=True, timeout=30) as m,
        ):
            await shop.advertise("[class,eq,'T'],[n,isPresent,0]")
            await m.subscribe("[class,eq,'T']", got, durable="orders")
            assert m.broker == "C"
            for n in range(COUNT):
                if n in (COUNT // 3, 2 * COUNT // 3):
                    await eventually(partial(_at_least, got.got, n - 50))
                    procs[m.broker].kill()  # its machine is gone: it does not come back
                await shop.publish({"class": "T", "n": n}, guaranteed=True)
                await asyncio.sleep(0.002)
            await shop.flush(30)
            await eventually(lambda: len(got.got) >= COUNT, 60)
            await asyncio.sleep(1.5)  # anything sent twice would have come by now
            assert m.broker == "A"
        assert got.got == list(range(COUNT))
    finally:
        for proc in procs.values():
            proc.stop()


async def test_a_database_node_fails_over_to_another_broker_and_stores_each_publication_once(
    tmp_path: Path,
) -> None:
    """A chain A-B, the publisher at A, a database node given B then A. B is killed while
    guaranteed publications flow: the node moves to A with its durable subscription, and its
    store ends with every publication once."""
    a = BrokerProcess("A", options=["--heartbeat", "1", "--data", str(tmp_path / "A")])
    url_a = a.start()
    b = BrokerProcess("B", neighbours=[url_a], options=["--heartbeat", "1"])
    url_b = b.start()
    db = DatabaseProcess(
        "D", [url_b, url_a], f"sqlite:///{tmp_path / 'd.sqlite'}", stores=["[class,eq,'T']"]
    )
    db.start()
    start = datetime.now(UTC) - timedelta(seconds=1)
    try:
        async with Client(url_a, "shop") as shop, Client(url_a, "reader") as reader:
            await shop.advertise("[class,eq,'T'],[n,isPresent,0]")
            await asyncio.sleep(0.5)  # the database's subscription reaches A
            for n in range(COUNT):
                if n == COUNT // 2:
                    b.kill()
                await shop.publish({"class": "T", "n": n}, guaranteed=True)
                await asyncio.sleep(0.002)
            await shop.flush(30)

            async def stored() -> list[int]:
                got = Numbers()
                past = await reader.subscribe(
                    f"[class,eq,'T'],[time,>=,'{start.isoformat()}'],"
                    f"[time,<,'{datetime.now(UTC).isoformat()}']",
                    got,
                )
                await past.replayed(timeout=20)
                return got.got

            async def complete() -> bool:
                return len(await stored()) >= COUNT

            await eventually(complete, 60)
            assert sorted(await stored()) == list(range(COUNT))
    finally:
        for proc in (db, b, a):
            proc.stop()


async def test_a_subscription_taken_to_another_broker_is_let_go_of_where_it_was(
    tmp_path: Path,
) -> None:
    """A chain A-B-C, the publisher at A; the durable subscriber reaches C through a proxy,
    and B directly. The proxy is cut: the client moves to B, C stays up and lets go of its
    copy, and the subscriber gets every publication once, in order."""
    procs = {name: BrokerProcess(name, options=["--heartbeat", "1"]) for name in "ABC"}
    url = {"A": procs["A"].start()}
    procs["B"].neighbours = [url["A"]]
    url["B"] = procs["B"].start()
    procs["C"].neighbours = [url["B"]]
    url["C"] = procs["C"].start()
    proxy = Proxy(procs["C"].port)
    try:
        wait_linked([("A", "B"), ("B", "C")], url)
        got = Numbers()
        via = await proxy.start()
        async with (
            Client(url["A"], "shop") as shop,
            Client([via, url["B"]], "manager", reconnect=True, timeout=30) as m,
        ):
            await shop.advertise("[class,eq,'T'],[n,isPresent,0]")
            await m.subscribe("[class,eq,'T']", got, durable="orders")
            assert m.broker == "C"

            def durables(broker: str) -> list[dict[str, Any]]:
                health = httpx.get(f"http://127.0.0.1:{procs[broker].port}/health").json()
                return list(health["durables"])

            assert [d["owner"] for d in durables("C")] == ["manager@C"]
            for n in range(COUNT // 3):
                if n == COUNT // 6:
                    await proxy.cut()
                await shop.publish({"class": "T", "n": n}, guaranteed=True)
                await asyncio.sleep(0.002)
            await shop.flush(30)
            await eventually(lambda: len(got.got) >= COUNT // 3, 30)
            await asyncio.sleep(1.0)
            assert m.broker == "B"
            await eventually(lambda: not durables("C"), 10)  # C let go of its copy
            assert [d["owner"] for d in durables("B")] == ["manager@B"]
        assert got.got == list(range(COUNT // 3))
    finally:
        await proxy.cut()
        for proc in procs.values():
            proc.stop()
