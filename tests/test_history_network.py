"""Historic and hybrid subscriptions across real broker and database processes."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from historic import Store
from padres.client.connection import Client, Delivery
from padres.errors import ConnectionLost
from padres.language.parser import parse_composite
from padres.matching.matcher import CompositeMatch
from padres.matching.reference_temporal import over_range
from padres.model.messages import Publication
from padres.model.protocol import Notify
from padres.testing.processes import BrokerProcess, DatabaseProcess
from tests.support import eventually, health

ORDERS = "[class,eq,'Order']"
PAID = "[class,eq,'Paid']"
FOREVER = datetime(9999, 1, 1, tzinfo=UTC)


@pytest.fixture
def triangle(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Brokers A, B, C in a cycle; databases D1 at B and D2 at C, both storing orders."""
    a = BrokerProcess("A", options=["--heartbeat", "1"])
    urls = {"A": a.start()}
    b = BrokerProcess("B", neighbours=[urls["A"]])
    urls["B"] = b.start()
    c = BrokerProcess("C", neighbours=[urls["A"], urls["B"]])
    urls["C"] = c.start()
    d1 = DatabaseProcess("D1", urls["B"], f"sqlite:///{tmp_path / 'd1.sqlite'}", stores=[ORDERS])
    d2 = DatabaseProcess("D2", urls["C"], f"sqlite:///{tmp_path / 'd2.sqlite'}", stores=[ORDERS])
    d1.start()
    d2.start()
    yield urls
    for proc in (d1, d2, c, b, a):
        proc.stop()


async def _offers_reach(client: Client, count: int) -> None:
    """Wait until ``count`` offers to replay are in the table of the client's broker (asked
    under the broker's limit of 10 queries a second per connection)."""

    async def arrived() -> bool:
        rows = await client.query("advertisements")
        return sum("replay=" in row for row in rows) >= count

    await eventually(arrived)


def _order(i: int) -> Publication:
    attrs = {"class": "Order", "item": "shoes" if i % 2 else "hat", "n": i}
    return Publication(f"o{i}", attrs, datetime.now(UTC))


def _paid(n: int) -> Publication:
    return Publication(f"paid{n}", {"class": "Paid", "n": n}, datetime.now(UTC))


def _match(match: Delivery | CompositeMatch) -> tuple[str, ...]:
    """The ids of a composite match's publications."""
    if isinstance(match, Notify):
        raise TypeError(f"a publication where a match was expected: {match}")
    return tuple(p.id for p in match.publications)


def _stored(url: str) -> list[Publication]:
    """What the database at ``url`` stored."""
    store = Store(url)
    try:
        return [p for chunk in store.older(FOREVER) for _, p in chunk]
    finally:
        store.close()


def _collecting(into: list[tuple[str, ...]]) -> Callable[[Delivery], None]:
    """A callback that adds each match's ids to ``into``."""
    return lambda delivery: into.append(_match(delivery))


def _ids(got: list[Delivery]) -> list[str]:
    return [d.publication.id for d in got if isinstance(d, Notify)]


@contextmanager
def _chain(tmp_path: Path, database_at: str) -> Iterator[dict[str, BrokerProcess]]:
    """Brokers A-B-C in a chain, each pinging every second, and database D at broker
    ``database_at`` storing orders; gives the brokers by name."""
    procs: dict[str, BrokerProcess] = {}
    previous: list[str] = []
    for name in "ABC":
        procs[name] = BrokerProcess(name, neighbours=previous, options=["--heartbeat", "1"])
        previous = [procs[name].start()]
    store = f"sqlite:///{tmp_path / 'd.sqlite'}"
    db = DatabaseProcess("D", procs[database_at].url, store, stores=[ORDERS])
    db.start()
    try:
        yield procs
    finally:
        db.stop()
        for proc in reversed(procs.values()):
            proc.stop()


def _taking() -> tuple[list[int], Callable[[Delivery], None]]:
    """The numbers of the orders delivered, and the callback that collects them."""
    got: list[int] = []

    def take(delivery: Delivery) -> None:
        assert isinstance(delivery, Notify)
        got.append(int(delivery.publication.attributes["n"]))

    return got, take


async def test_hybrid_and_historic_subscriptions_with_publishers_running(
    triangle: dict[str, str],
) -> None:
    start = datetime.now(UTC) - timedelta(seconds=1)
    async with (
        Client(triangle["A"], "shop") as shop,
        Client(triangle["C"], "manager") as manager,
        Client(triangle["B"], "other") as other,
    ):
        await _offers_reach(manager, 2)
        await shop.advertise(ORDERS)
        await asyncio.sleep(0.5)  # the databases' subscriptions reach A
        published = 0

        async def publish(n: int) -> None:
            nonlocal published
            for _ in range(n):
                await shop.publish(_order(published))
                published += 1
                await asyncio.sleep(0.004)

        await publish(150)
        running = asyncio.get_running_loop().create_task(publish(350))
        await asyncio.sleep(0.2)
        live: list[Delivery] = []
        await other.subscribe(ORDERS, live.append)
        hybrid = await manager.subscribe(f"{ORDERS},[time,>=,'{start.isoformat()}']", id="h")
        got: list[Delivery] = []

        async def collect() -> None:
            async for delivery in hybrid:
                got.append(delivery)

        collector = asyncio.get_running_loop().create_task(collect())
        done = await hybrid.replayed(timeout=20)
        await running
        for _ in range(100):
            if len(got) >= published:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # nothing more arrives: no duplicate is on its way
        collector.cancel()
        assert _ids(got) == [f"o{i}" for i in range(published)]  # no gap, no duplicate, in order
        assert done.databases == ("D1@B", "D2@C") and done.failed == () and done.live
        assert done.count >= 150
        # An overlapping live subscriber got the live stream only: no replayed publication.
        ids = _ids(live)
        assert len(ids) == len(set(ids)) and 0 < len(ids) < published
        assert ids == [f"o{i}" for i in range(published - len(ids), published)]

        # A historic subscription (ending in the past) ends with its replay.
        end = datetime.now(UTC)
        await asyncio.sleep(0.1)
        await shop.publish(_order(published))  # after the window: not replayed
        window = f"[time,>=,'{start.isoformat()}'],[time,<,'{end.isoformat()}']"
        past = await manager.subscribe(f"{ORDERS},[item,eq,'shoes'],{window}")
        shoes = [d async for d in past]  # the iterator ends when every database finished
        assert _ids(shoes) == [f"o{i}" for i in range(1, published, 2)]
        done = await past.replayed()
        assert done.count == published // 2 and not done.live

        # The same from the command line: it prints the past and exits.
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "padres.cli",
            "sub",
            f"{ORDERS},[item,eq,'shoes'],{window}",
            "--broker",
            triangle["B"],
            "--json",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, err
        assert len(out.splitlines()) == published // 2
        assert f"replayed {published // 2} from D1@B, D2@C" in err.decode()


async def test_every_run_of_a_publisher_is_kept_in_history(tmp_path: Path) -> None:
    """Three runs of ``padres pub`` and ten of a Python publisher, each numbering its
    publications from the start under the same name: history keeps every one once."""
    broker = BrokerProcess("B")
    url = broker.start()
    db = DatabaseProcess("D", url, f"sqlite:///{tmp_path / 'd.sqlite'}", stores=[ORDERS])
    try:
        db.start()
        start = datetime.now(UTC) - timedelta(seconds=1)
        async with Client(url, "manager") as manager:
            await _offers_reach(manager, 1)
            for run in range(3):
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "padres.cli", "pub", "--broker", url, "--name",
                    "shop", f"[class,'Order'],[run,{run}]",
                )  # fmt: skip
                assert await proc.wait() == 0
            for run in range(3, 13):
                async with Client(url, "shop") as shop:
                    await shop.advertise(ORDERS)
                    await shop.publish({"class": "Order", "run": run})
            got: list[Publication] = []

            async def stored() -> bool:
                window = (
                    f"[time,>=,'{start.isoformat()}'],[time,<,'{datetime.now(UTC).isoformat()}']"
                )
                past = await manager.subscribe(f"{ORDERS},{window}")
                got[:] = [d.publication async for d in past if isinstance(d, Notify)]
                return len(got) >= 13

            await eventually(stored)
        assert sorted(int(p.attributes["run"]) for p in got) == list(range(13))
        assert len({p.id for p in got}) == 13
    finally:
        db.stop()
        broker.stop()


async def test_a_hybrid_subscription_whose_broker_is_killed_resumes_without_gap_or_duplicate(
    tmp_path: Path,
) -> None:
    """A chain A-B, the database and the publisher at A, the hybrid subscriber at B (listing
    A as well). B is killed while publications flow: the client fails over to A and asks for
    the past again from its latest deliveries on, so it gets every publication once, what
    was published while it was away included."""
    a = BrokerProcess("A", options=["--heartbeat", "1"])
    url_a = a.start()
    b = BrokerProcess("B", neighbours=[url_a], options=["--heartbeat", "1"])
    url_b = b.start()
    db = DatabaseProcess("D", url_a, f"sqlite:///{tmp_path / 'd.sqlite'}", stores=[ORDERS])
    db.start()
    start = datetime.now(UTC) - timedelta(seconds=1)
    try:
        async with (
            Client(url_a, "shop") as shop,
            Client([url_b, url_a], "manager", reconnect=True, timeout=30) as manager,
        ):
            await _offers_reach(manager, 1)
            await shop.advertise(ORDERS)
            await asyncio.sleep(0.5)  # the database's subscription reaches A
            got, take = _taking()
            hybrid = await manager.subscribe(f"{ORDERS},[time,>=,'{start.isoformat()}']", take)
            total = 600
            for n in range(total):
                if n == 100:
                    await hybrid.replayed(timeout=20)
                if n == 300:
                    b.kill()  # the subscriber's broker, at once
                await shop.publish(_order(n))
                await asyncio.sleep(0.005)
            await eventually(lambda: len(got) >= total, 30)
            await asyncio.sleep(1.0)  # anything sent twice would have come by now
            assert sorted(got) == list(range(total))  # each once: no gap, no duplicate
            assert manager.broker == "A"
    finally:
        for proc in (db, b, a):
            proc.stop()


async def test_a_hybrid_sequence_whose_broker_is_killed_reports_each_match_once(
    tmp_path: Path,
) -> None:
    """As above, with two hybrid sequences (an order then its payment; an order not paid
    within half a second): B is killed while orders and payments flow, the client fails over
    to A and makes them again, their whole range replayed, and drops the matches it had.
    Each match comes once, none is lost: the same as the reference evaluation of what the
    database stored."""
    a = BrokerProcess("A", options=["--heartbeat", "1"])
    url_a = a.start()
    b = BrokerProcess("B", neighbours=[url_a], options=["--heartbeat", "1"])
    url_b = b.start()
    store = f"sqlite:///{tmp_path / 'd.sqlite'}"
    db = DatabaseProcess("D", url_a, store, stores=[ORDERS, PAID])
    db.start()
    start = datetime.now(UTC) - timedelta(seconds=1)
    window = f"[time,>=,'{start.isoformat()}']"
    texts = {
        "paid": f"{{{ORDERS},[n,=,$N],{window}}} ; {{{PAID},[n,=,$N],{window}}} within 2s late 1s",
        "unpaid": f"{{{ORDERS},[n,=,$N],{window}}} ; !{{{PAID},[n,=,$N],{window}}}"
        " within 500ms late 1s",
    }
    try:
        async with (
            Client(url_a, "shop") as shop,
            Client([url_b, url_a], "manager", reconnect=True, timeout=30) as manager,
        ):
            await _offers_reach(manager, 2)
            await shop.advertise(ORDERS)
            await shop.advertise(PAID)
            await asyncio.sleep(0.5)  # the database's subscriptions reach A
            got: dict[str, list[tuple[str, ...]]] = {name: [] for name in texts}
            handles = {}
            for name, text in texts.items():
                handles[name] = await manager.subscribe_composite(
                    text, _collecting(got[name]), id=name
                )
            published = 0
            for n in range(240):
                if n == 60:
                    for handle in handles.values():
                        await handle.replayed(timeout=20)
                if n == 130:
                    await eventually(lambda: all(got.values()))  # some matches came from B
                    b.kill()  # the subscriber's broker, at once
                await shop.publish(_order(n))
                published += 1
                if n % 3 and n >= 4:  # paid, four orders later
                    await shop.publish(_paid(n - 4))
                    published += 1
                await asyncio.sleep(0.005)
            pubs: list[Publication] = []

            def all_stored() -> bool:
                pubs[:] = _stored(store)
                return len(pubs) == published

            await eventually(all_stored)
            for name, text in texts.items():
                sub = parse_composite(text, id=name)
                want = sorted(_match(m) for m in over_range(sub, pubs, FOREVER))
                await eventually(lambda: len(got[name]) >= len(want), 30)  # noqa: B023
                await asyncio.sleep(0.5)  # anything sent twice would have come by now
                assert sorted(got[name]) == want, name  # each once: none lost, none twice
                assert len(want) > 50, name
            assert manager.broker == "A"
    finally:
        for proc in (db, b, a):
            proc.stop()


async def test_a_hybrid_subscription_gets_what_a_killed_broker_on_its_path_kept_from_it(
    tmp_path: Path,
) -> None:
    """A chain A-B-C, the shop and the database at A, the hybrid subscriber at C. B, between
    them, is killed while orders flow, and started again: the database stored every order,
    and once B is back C asks it again for the past since the link was lost. The subscriber
    gets each order once, in order."""
    start = datetime.now(UTC) - timedelta(seconds=1)
    with _chain(tmp_path, "A") as procs:
        b, url_a, url_c = procs["B"], procs["A"].url, procs["C"].url
        async with Client(url_a, "shop") as shop, Client(url_c, "manager") as manager:
            await _offers_reach(manager, 1)
            await shop.advertise(ORDERS)
            await asyncio.sleep(0.5)  # the database's subscription reaches A
            got, take = _taking()
            hybrid = await manager.subscribe(f"{ORDERS},[time,>=,'{start.isoformat()}']", take)
            await hybrid.replayed(timeout=20)
            total = 600
            restart: asyncio.Task[str] | None = None
            for n in range(total):
                if n == 200:
                    b.kill()
                if n == 300:
                    restart = asyncio.create_task(asyncio.to_thread(b.start))
                if n == 500:  # the rest once B is back between A and C
                    assert restart is not None
                    await restart
                    await eventually(lambda: health(url_c)["neighbours"] == ["B"], 20)
                await shop.publish(_order(n))
                await asyncio.sleep(0.005)
            try:
                await eventually(lambda: len(got) >= total, 30)
            except AssertionError:
                missing = sorted(set(range(total)) - set(got))
                raise AssertionError(f"{len(missing)} missing: {missing[:20]}...") from None
            await asyncio.sleep(1.0)  # anything sent twice would have come by now
            assert got == list(range(total))  # each once, in order


async def test_a_hybrid_subscription_loses_nothing_stored_when_the_publishers_broker_dies(
    tmp_path: Path,
) -> None:
    """A chain A-B-C: the shop at A (listing B as well), the database at B, the hybrid
    subscriber at C. A is killed while orders flow: the shop fails over to B and advertises
    again (a new tree). What A held when it died is lost to everyone; of the rest, the
    subscriber gets exactly what the database stored, each once."""
    start = datetime.now(UTC) - timedelta(seconds=1)
    with _chain(tmp_path, "B") as procs:
        a, url_a, url_b, url_c = procs["A"], procs["A"].url, procs["B"].url, procs["C"].url
        async with (
            Client([url_a, url_b], "shop", reconnect=True, timeout=30) as shop,
            Client(url_c, "manager") as manager,
        ):
            await _offers_reach(manager, 1)
            await shop.advertise(ORDERS)
            await asyncio.sleep(0.5)  # the database's subscription reaches A
            got, take = _taking()
            window = f"[time,>=,'{start.isoformat()}']"
            hybrid = await manager.subscribe(f"{ORDERS},{window}", take)
            await hybrid.replayed(timeout=20)
            total = 500
            n = 0
            while n < total:
                if n == 200 and a.alive:
                    a.kill()
                try:
                    await shop.publish(_order(n))
                except ConnectionLost:
                    await asyncio.sleep(0.1)  # failing over: this order again
                    continue
                n += 1
                await asyncio.sleep(0.005)
            assert shop.broker == "B"
            await asyncio.sleep(1.0)  # what was published has reached the database
            ended = datetime.now(UTC).isoformat()
            past = await manager.subscribe(f"{ORDERS},{window},[time,<,'{ended}']")
            stored = sorted([int(d.publication.attributes["n"]) async for d in past])  # type: ignore[union-attr]
            assert len(stored) > total - 100
            await eventually(lambda: set(stored) <= set(got), 30)
            await asyncio.sleep(1.0)  # anything sent twice would have come by now
            assert len(got) == len(set(got))  # nothing twice
            assert set(stored) <= set(got)  # nothing the database stored is missing
