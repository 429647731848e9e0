"""Exception queues: handlers retried with backoff, then publications set aside at the broker with
the error and the attempts, listed, replayed and purged from the client, the command line and
the REST API; kept across broker crashes."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from padres.broker import Broker
from padres.broker.sqlite_journal import SqliteJournal
from padres.client.connection import Client, Delivery, SubscriptionHandle
from padres.errors import RequestFailed
from padres.language.parser import parse_advertisement, parse_filter, parse_subscription
from padres.model.messages import Publication, Subscription
from padres.model.protocol import (
    Durable,
    ExceptionAction,
    ExceptionReport,
    Exceptions,
    Failed,
    Guaranteed,
    Hello,
    Notify,
    Ok,
)
from padres.runtime.node import BrokerNode
from padres.testing.processes import BrokerProcess
from tests.support import eventually, health

pytestmark = pytest.mark.anyio

ORDER = "[class,eq,'Order'],[n,isPresent,0]"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@contextlib.asynccontextmanager
async def _broker(path: Path, **limits: int) -> AsyncIterator[tuple[str, Broker]]:
    """A broker served in this process, its journal at ``path``; ``limits`` set its exception
    queues' bounds."""
    broker = Broker("B", journal=SqliteJournal(str(path)))
    for name, value in limits.items():
        setattr(broker.dead_letters, name, value)
    node = BrokerNode(broker, heartbeat=1)
    port: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    serving = asyncio.ensure_future(node.serve(ready=port.set_result))
    try:
        yield f"ws://127.0.0.1:{await port}", broker
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        broker.journal.close()


class _Flaky:
    """A handler that fails ``failures`` times on each publication, then takes it."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls: dict[int, int] = {}
        self.taken: list[int] = []

    def __call__(self, delivery: Delivery) -> None:
        assert isinstance(delivery, Notify)
        n = int(delivery.publication.attributes["n"])
        self.calls[n] = self.calls.get(n, 0) + 1
        if self.calls[n] <= self.failures:
            raise ValueError(f"order {n} is not ready")
        self.taken.append(n)


async def _publish(client: Client, *numbers: int) -> None:
    for n in numbers:
        await client.publish({"class": "Order", "n": n}, id=f"order-{n}", guaranteed=True)
    await client.flush(10)


async def _entries(client: Client, sub: str, count: int, **kw: Any) -> ExceptionReport:
    report = ExceptionReport("", sub)

    async def enough() -> bool:
        nonlocal report
        report = await client.exceptions(sub, **kw)
        return len(report.entries) >= count

    await eventually(enough)
    return report


async def test_a_handler_that_fails_twice_then_succeeds_takes_the_publication_once(
    tmp_path: Path,
) -> None:
    async with (
        _broker(tmp_path / "journal.sqlite") as (url, _),
        Client(url, "shop") as shop,
        Client(url, "manager") as manager,
    ):
        await shop.advertise(ORDER)
        flaky = _Flaky(failures=2)
        await manager.subscribe("[class,eq,'Order']", flaky, durable="orders", retries=3)
        await _publish(shop, 1, 2)
        await eventually(lambda: flaky.taken == [1, 2])
        await asyncio.sleep(0.3)
        assert flaky.taken == [1, 2] and flaky.calls == {1: 3, 2: 3}
        report = await manager.exceptions("orders")
        assert report.entries == () and report.length == 0


async def test_a_handler_that_keeps_failing_sets_the_publication_aside_without_holding_back_others(
    tmp_path: Path,
) -> None:
    async with (
        _broker(tmp_path / "journal.sqlite") as (url, _),
        Client(url, "shop") as shop,
        Client(url, "manager") as manager,
    ):
        await shop.advertise(ORDER)
        failing = _Flaky(failures=100)
        others: list[Delivery] = []
        # The first waits 1 to 2 s before it tries publication 7 again, and only then 8.
        await manager.subscribe("[class,eq,'Order']", failing, id="slow", retries=1, backoff=2)
        await manager.subscribe("[class,eq,'Order']", others.append)
        await _publish(shop, 7, 8)
        await eventually(lambda: len(others) == 2)
        assert failing.calls == {7: 1}  # the others were not held back behind it
        report = await _entries(manager, "slow", 2)
        assert [e.publication.id for e in report.entries] == ["order-7", "order-8"]
        first = report.entries[0]
        assert first.attempts == 2 and failing.calls == {7: 2, 8: 2}
        assert first.error == "ValueError: order 7 is not ready"
        assert first.at == pytest.approx(datetime.now(UTC).timestamp(), abs=30)
        (shown,) = (await manager.exceptions("slow", [first.id])).entries
        assert shown == first
        with pytest.raises(RequestFailed, match="no entry 999"):
            await manager.exceptions("slow", [999])


async def test_purge_removes_entries_one_by_one_or_all(tmp_path: Path) -> None:
    async with (
        _broker(tmp_path / "journal.sqlite") as (url, _),
        Client(url, "shop") as shop,
        Client(url, "manager") as manager,
    ):
        await shop.advertise(ORDER)
        await manager.subscribe("[class,eq,'Order']", _Flaky(9), id="s", retries=0)
        await _publish(shop, 1, 2, 3)
        first, *rest = (await _entries(manager, "s", 3)).entries
        assert await manager.purge_exceptions("s", [first.id]) == 1
        assert await manager.purge_exceptions("s", [first.id]) == 0
        assert [e.id for e in (await manager.exceptions("s")).entries] == [e.id for e in rest]
        assert await manager.purge_exceptions("s") == 2
        assert (await manager.exceptions("s")).length == 0


async def test_a_subscription_without_a_handler_sends_a_replayed_entry_back(
    tmp_path: Path,
) -> None:
    async with (
        _broker(tmp_path / "journal.sqlite") as (url, _),
        Client(url, "shop") as shop,
        Client(url, "manager") as manager,
    ):
        await shop.advertise(ORDER)
        await manager.subscribe("[class,eq,'Order']", _Flaky(9), id="s", retries=0)
        await _publish(shop, 1)
        first = await _entries(manager, "s", 1)
        (entry,) = first.entries
        await manager.unsubscribe("s")
        plain = await manager.subscribe("[class,eq,'Order']", id="s")  # an iterator
        assert await manager.replay_exceptions("s") == 1

        async def sent_back() -> bool:
            (again,) = (await manager.exceptions("s")).entries
            return "no handler with retries" in again.error and not again.replaying

        await eventually(sent_back)
        with pytest.raises(TimeoutError):
            await plain.get(timeout=0.2)  # nothing reached the iterator
        report = await manager.exceptions("s")
        (again,) = report.entries
        assert again.attempts == entry.attempts == 1
        assert report.bytes - first.bytes == len(again.error) - len(entry.error)


@pytest.mark.parametrize("limit", ["max_entries", "max_bytes"])
async def test_a_full_queue_drops_its_oldest_entries_and_counts_them(
    tmp_path: Path, limit: str
) -> None:
    """Five entries of the same size; then a queue bounded to three and a half of them takes
    a sixth."""
    async with (
        _broker(tmp_path / "journal.sqlite") as (url, broker),
        Client(url, "shop") as shop,
        Client(url, "manager") as manager,
    ):
        await shop.advertise(ORDER)
        handler = _Flaky(9)
        handle = await manager.subscribe("[class,eq,'Order']", handler, id="s", retries=0)
        await _publish(shop, *range(5))
        await eventually(lambda: _all_failed(handle, 5))
        size = (await manager.exceptions("s")).bytes // 5
        if limit == "max_entries":
            broker.dead_letters.max_entries = 3
        else:
            broker.dead_letters.max_bytes = size * 7 // 2
        await _publish(shop, 5)
        await eventually(lambda: _all_failed(handle, 6))
        report = await manager.exceptions("s")
        assert [e.publication.id for e in report.entries] == ["order-3", "order-4", "order-5"]
        assert report.dropped == 3 and report.length == 3 and report.bytes == 3 * size


def _all_failed(handle: SubscriptionHandle, count: int) -> bool:
    return handle.handler is not None and handle.handler.failed == count


async def test_a_replay_that_fails_again_goes_back_with_its_attempts_added_up(
    tmp_path: Path,
) -> None:
    async with (
        _broker(tmp_path / "journal.sqlite") as (url, _),
        Client(url, "shop") as shop,
        Client(url, "manager") as manager,
    ):
        await shop.advertise(ORDER)
        handler = _Flaky(failures=4)
        await manager.subscribe("[class,eq,'Order']", handler, id="s", retries=1, backoff=0.01)
        await _publish(shop, 1)
        (entry,) = (await _entries(manager, "s", 1)).entries
        assert entry.attempts == 2
        assert await manager.replay_exceptions("s") == 1

        async def attempts() -> int:
            (again,) = (await manager.exceptions("s")).entries
            return again.attempts

        await eventually(lambda: _is(attempts(), 4))
        (again,) = (await manager.exceptions("s")).entries
        assert again.id == entry.id and not again.replaying
        assert await manager.replay_exceptions("s", [entry.id]) == 1
        await eventually(lambda: handler.taken == [1])
        await eventually(lambda: _is(_length(manager, "s"), 0))


async def _is(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


async def _length(client: Client, sub: str) -> int:
    return (await client.exceptions(sub)).length


def test_failing_a_durable_delivery_acknowledges_it_in_the_same_journal_transaction(
    tmp_path: Path,
) -> None:
    """Whatever the moment of a crash, a delivery is queued for its subscriber or in the
    exception queue: the journal commits both changes together or neither."""
    path = str(tmp_path / "journal.sqlite")
    sub = Subscription("orders", parse_filter("[class,eq,'Order']"))

    def restarted(broker: Broker | None) -> tuple[Broker, Notify]:
        """The broker started (again) on the journal, the subscriber back: its delivery."""
        if broker is not None:
            broker.journal.close()
        broker = Broker("B", journal=SqliteJournal(path))
        broker.handle(Hello("manager"), "h2")
        out = broker.handle(Durable(sub), "h2")
        broker.journal.commit()
        (note,) = [m for hop, m in out if hop == "h2" and isinstance(m, Notify)]
        return broker, note

    first = Broker("B", journal=SqliteJournal(path))
    first.handle(Hello("manager"), "h2")
    first.handle(Durable(sub), "h2")
    first.handle(Hello("shop"), "h1")
    first.handle(parse_advertisement(ORDER, id="a1"), "h1")
    pub = Publication("p1", {"class": "Order", "n": 1}, datetime.now(UTC), "")
    first.handle(Guaranteed(pub), "h1")
    first.journal.commit()
    broker, note = restarted(first)
    failed = Failed("f1", "orders", note.publication, "ValueError: no", 4, seq=note.seq)
    assert broker.handle(failed, "h2") == [("h2", Ok("f1"))]
    broker.journal.rollback()  # the broker dies before the frame's commit: neither happened
    assert _queued(path) == (1, 0)

    broker, note = restarted(broker)  # so the delivery comes again, and fails again
    assert broker.handle(failed, "h2") == [("h2", Ok("f1"))]
    broker.journal.commit()
    assert _queued(path) == (0, 1)
    assert broker.handle(failed, "h2") == [("h2", Ok("f1"))]  # sent again: recognised
    again = Failed("f2", "orders", note.publication, "ValueError: no", 2, seq=note.seq)
    assert broker.handle(again, "h2") == [("h2", Ok("f2"))]  # failed again, acknowledged already
    broker.journal.commit()
    assert _queued(path) == (0, 1)
    listing = Exceptions("x1", "orders", ExceptionAction.LIST, client="manager")
    broker.handle(Hello("admin"), "h3")
    ((_, report),) = broker.handle(listing, "h3")  # asked by another client
    assert isinstance(report, ExceptionReport)
    assert [(e.attempts, e.error) for e in report.entries] == [(4, "ValueError: no")]
    broker.journal.close()


def _queued(path: str) -> tuple[int, int]:
    """Deliveries queued for durable subscriptions, and exception entries, as on disk."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        queued = db.execute("SELECT coalesce(sum(last - first + 1), 0) FROM runs").fetchone()[0]
        entries = db.execute("SELECT count(*) FROM exceptions").fetchone()[0]
    return int(queued), int(entries)


async def test_an_exception_queue_outlives_a_killed_broker_and_replays_to_a_fixed_handler(
    tmp_path: Path,
) -> None:
    proc = BrokerProcess("B", options=["--heartbeat", "1", "--data", str(tmp_path / "B")])
    await asyncio.to_thread(proc.start)
    try:
        url = proc.url
        async with Client(url, "shop", reconnect=True) as shop:
            await shop.advertise(ORDER)
            async with Client(url, "manager") as manager:
                broken = _Flaky(failures=100)
                await manager.subscribe(
                    "[class,eq,'Order']", broken, durable="orders", retries=2, backoff=0.01
                )
                await _publish(shop, 1, 2)
                await _entries(manager, "orders", 2)
            async with Client(url, "admin") as admin:  # while the subscriber is away
                first = (await admin.exceptions("orders", client="manager")).entries[0]
                assert await admin.replay_exceptions("orders", [first.id], client="manager") == 1
            await asyncio.to_thread(proc.kill)
            await asyncio.to_thread(proc.start)
            async with Client(url, "manager") as manager:
                fixed = _Flaky(failures=0)
                await manager.subscribe(
                    "[class,eq,'Order']", fixed, durable="orders", retries=2, backoff=0.01
                )
                # The replay asked before the crash comes as soon as the subscriber is back;
                # the other entry waits, and the deliveries, acknowledged with their failures,
                # do not come again.
                await eventually(lambda: fixed.taken == [1])
                report = await manager.exceptions("orders")
                assert [e.publication.id for e in report.entries] == ["order-2"]
                assert report.entries[0].attempts == 3
                assert await manager.replay_exceptions("orders") == 1
                await eventually(lambda: fixed.taken == [1, 2])
                await eventually(lambda: _is(_length(manager, "orders"), 0))
                await asyncio.sleep(0.3)
                assert fixed.taken == [1, 2]
    finally:
        await asyncio.to_thread(proc.stop)


async def test_a_broker_killed_while_a_handler_retries_leaves_one_entry(tmp_path: Path) -> None:
    """The delivery comes again after the reconnection and fails again: still one entry."""
    proc = BrokerProcess("B", options=["--heartbeat", "1", "--data", str(tmp_path / "B")])
    await asyncio.to_thread(proc.start)
    try:
        url = proc.url
        async with (
            Client(url, "shop", reconnect=True) as shop,
            Client(url, "manager", reconnect=True) as manager,
        ):
            await shop.advertise(ORDER)
            broken = _Flaky(failures=100)
            await manager.subscribe(
                "[class,eq,'Order']", broken, durable="orders", retries=1, backoff=2.0
            )
            await _publish(shop, 1)
            await eventually(lambda: broken.calls == {1: 1})  # now waiting to try again
            await asyncio.to_thread(proc.kill)
            await asyncio.to_thread(proc.start)
            await eventually(lambda: broken.calls == {1: 4}, timeout=30)  # twice, twice again
            report = await _entries(manager, "orders", 1)
            await asyncio.sleep(0.5)
            assert (await manager.exceptions("orders")).length == 1
            assert [e.publication.id for e in report.entries] == ["order-1"]
    finally:
        await asyncio.to_thread(proc.stop)


async def _queues(url: str) -> list[dict[str, Any]]:
    """The exception queues ``/health`` reports (asked from a thread: the broker serves on
    this event loop)."""
    found: list[dict[str, Any]] = (await asyncio.to_thread(health, f"{url}/ws"))["exceptions"]
    return found


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "padres.cli", "exceptions", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def _cli(*args: str) -> Any:
    done = _run_cli(*args, "--json")
    assert done.returncode == 0, done.stderr
    return orjson.loads(done.stdout)


async def test_the_command_line_lists_shows_replays_and_purges(tmp_path: Path) -> None:
    async with (
        _broker(tmp_path / "journal.sqlite") as (url, _),
        Client(url, "shop") as shop,
        Client(url, "manager") as manager,
    ):
        await shop.advertise(ORDER)
        handler = _Flaky(failures=2)
        await manager.subscribe("[class,eq,'Order']", handler, id="s", retries=0)
        await _publish(shop, 1, 2, 3)
        await _entries(manager, "s", 3)

        def cli(*args: str) -> Any:
            return _cli(*args, "--broker", url, "--client", "manager", "--subscription", "s")

        listed = await asyncio.to_thread(cli, "list")
        assert [e["publication"]["id"] for e in listed["entries"]] == [
            "order-1",
            "order-2",
            "order-3",
        ]
        first, second, _ = (e["id"] for e in listed["entries"])
        shown = await asyncio.to_thread(cli, "show", str(second))
        assert shown["entries"][0]["error"] == "ValueError: order 2 is not ready"
        assert (await asyncio.to_thread(cli, "purge", str(first)))["affected"] == 1
        assert (await asyncio.to_thread(cli, "replay", str(second)))["affected"] == 1
        await eventually(lambda: _is(_length(manager, "s"), 2))  # it failed once more
        assert (await asyncio.to_thread(cli, "replay"))["affected"] == 2
        await eventually(lambda: handler.taken == [2])  # 3 failed its second attempt
        await eventually(lambda: _is(_length(manager, "s"), 1))
        assert (await asyncio.to_thread(cli, "replay"))["affected"] == 1
        await eventually(lambda: handler.taken == [2, 3])
        await eventually(lambda: _is(_length(manager, "s"), 0))
        where = ("--broker", url, "--client", "manager", "--subscription", "s")
        bad = await asyncio.to_thread(_run_cli, "show", "99", *where)
        assert bad.returncode == 1 and "no entry 99" in bad.stderr


async def test_the_rest_api_lists_shows_replays_and_purges(tmp_path: Path) -> None:
    async with _broker(tmp_path / "journal.sqlite") as (url, _):
        base = url.replace("ws://", "http://") + "/api/v1/exceptions/manager/s"
        async with Client(url, "shop") as shop, Client(url, "manager") as manager:
            await shop.advertise(ORDER)
            handler = _Flaky(failures=1)
            await manager.subscribe("[class,eq,'Order']", handler, id="s", retries=0)
            await _publish(shop, 1, 2, 3)
            await _entries(manager, "s", 3)
            async with httpx.AsyncClient(timeout=30) as http:
                queues = [(q["client"], q["subscription"], q["length"]) for q in await _queues(url)]
                assert queues == [("manager", "s", 3)]
                listed = (await http.get(base)).json()
                assert listed["length"] == 3 and listed["dropped"] == 0
                first, second, _ = (e["id"] for e in listed["entries"])
                page = (await http.get(base, params={"limit": 2})).json()
                assert [e["id"] for e in page["entries"]] == [first, second] and page["more"]
                shown = (await http.get(f"{base}/{second}")).json()
                assert shown["error"] == "ValueError: order 2 is not ready"
                missing = await http.get(f"{base}/999")
                assert missing.status_code == 404
                assert "no entry 999" in missing.json()["detail"]
                assert (await http.delete(f"{base}/{first}")).status_code == 204
                assert (await http.delete(f"{base}/{first}")).status_code == 404
                replayed = await http.post(f"{base}/replay", json={"entries": [second]})
                assert replayed.json()["affected"] == 1
                await eventually(lambda: handler.taken == [2])
                purged = await http.delete(base)
                assert purged.status_code == 200 and purged.json()["affected"] == 1
                assert (await http.get(base)).json()["length"] == 0


def test_an_entry_never_carries_a_publisher_the_broker_cannot_vouch_for(tmp_path: Path) -> None:
    """A subscriber reports failures on publications it dresses up as another's: a durable
    delivery's entry keeps the delivery as queued; any other entry names the reporter as its
    publisher."""
    broker = Broker("B", journal=SqliteJournal(str(tmp_path / "journal.sqlite")))
    broker.handle(Hello("manager"), "h2")
    broker.handle(Durable(Subscription("kept", parse_filter("[class,eq,'Order']"))), "h2")
    broker.handle(parse_subscription("[class,eq,'Order']", id="live"), "h2")
    broker.handle(Hello("shop"), "h1")
    broker.handle(parse_advertisement(ORDER, id="a1"), "h1")
    pub = Publication("p1", {"class": "Order", "n": 1}, datetime.now(UTC), "")
    out = broker.handle(Guaranteed(pub), "h1")
    (seq,) = [m.seq for _, m in out if isinstance(m, Notify) and m.seq]
    forged = Publication("p1", {"class": "Order", "n": 666}, datetime.now(UTC), "bank")
    broker.handle(Failed("f1", "kept", forged, "ValueError: no", 1, seq=seq), "h2")
    broker.handle(Failed("f2", "live", forged, "ValueError: no", 1), "h2")
    broker.journal.commit()
    kept = broker.handle(Exceptions("x1", "kept", ExceptionAction.LIST), "h2")
    live = broker.handle(Exceptions("x2", "live", ExceptionAction.LIST), "h2")
    ((_, durable),), ((_, plain),) = kept, live
    assert isinstance(durable, ExceptionReport) and isinstance(plain, ExceptionReport)
    assert [(e.publication.publisher, e.publication.attributes["n"]) for e in durable.entries] == [
        ("shop@B", 1)
    ]
    assert [(e.publication.publisher, e.publication.attributes["n"]) for e in plain.entries] == [
        ("manager@B", 666)
    ]
    broker.journal.close()
