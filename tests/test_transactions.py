"""Transactions through real broker processes: commit, abort, a publisher killed in the middle
of one, and a durable subscriber's broker killed and restarted on its journal."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from padres.client.connection import BlockingClient, Client, ClientState, Delivery
from padres.client.transaction import TransactionState
from padres.errors import (
    TransactionAborted,
    TransactionClosed,
    TransactionError,
    TransactionLimit,
)
from padres.model.protocol import Notify, TxNotify, Visibility
from padres.testing.processes import BrokerProcess, free_ports
from tests.support import eventually, wait_linked

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def overlay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, BrokerProcess]]:
    """Brokers A, B and C in a cycle, each with its journal on disk."""
    data = tmp_path_factory.mktemp("journals")
    ports = dict(zip("ABC", free_ports(3), strict=True))
    dials = {"A": "B", "B": "C", "C": "A"}
    procs: dict[str, BrokerProcess] = {}
    try:
        for name in "ABC":
            procs[name] = BrokerProcess(
                name,
                port=ports[name],
                neighbours=[f"ws://127.0.0.1:{ports[dials[name]]}"],
                options=[
                    *("--tx-linger", "1", "--tx-max-publications", "20"),
                    *("--data", str(data / name)),
                ],
            )
            procs[name].start()
        wait_linked(["AB", "BC", "CA"], {name: proc.url for name, proc in procs.items()})
        yield procs
    finally:
        for proc in procs.values():
            proc.stop()


class Inbox:
    """What one subscription got: (n, outcome), "" for a publication outside a transaction."""

    def __init__(self) -> None:
        self.got: list[tuple[int, str]] = []
        self.transactions: set[str] = set()

    def __call__(self, delivery: Delivery) -> None:
        assert isinstance(delivery, Notify)
        outcome = delivery.outcome.value if isinstance(delivery, TxNotify) else ""
        if isinstance(delivery, TxNotify):
            self.transactions.add(delivery.tx)
        self.got.append((int(delivery.publication.attributes["n"]), outcome))


@contextlib.asynccontextmanager
async def _subscribers(
    overlay: dict[str, BrokerProcess], cls: str
) -> AsyncIterator[dict[Visibility, Inbox]]:
    """One subscriber per visibility, at B and C, to publications of class ``cls``."""
    async with contextlib.AsyncExitStack() as stack:
        inboxes = {}
        for i, visibility in enumerate(Visibility):
            at = overlay["BC"[i % 2]].url
            client = await stack.enter_async_context(Client(at, f"{cls}-{visibility.value}"))
            inboxes[visibility] = Inbox()
            await client.subscribe(
                f"[class,eq,'{cls}']", inboxes[visibility], visibility=visibility
            )
        yield inboxes


def _outcomes(numbers: range, outcome: str) -> list[tuple[int, str]]:
    return [(n, outcome) for n in numbers]


async def test_commit_and_abort_as_each_visibility_sees_them(
    overlay: dict[str, BrokerProcess],
) -> None:
    async with (
        _subscribers(overlay, "Order") as inboxes,
        Client(overlay["A"].url, "shop") as shop,
    ):
        await shop.advertise("[class,eq,'Order'],[n,isPresent,0]")
        on_commit = inboxes[Visibility.ON_COMMIT]
        immediate = inboxes[Visibility.IMMEDIATE]
        on_abort = inboxes[Visibility.ON_ABORT]
        deferred = inboxes[Visibility.DEFERRED]

        async with shop.transaction() as tx:
            for n in range(3):
                await tx.publish({"class": "Order", "n": n})
            await eventually(lambda: len(immediate.got) == 3)
            assert on_commit.got == [] and deferred.got == []  # nothing before the commit
        assert tx.state is TransactionState.COMMITTED
        await eventually(lambda: len(on_commit.got) == 3 and len(immediate.got) == 6)

        with pytest.raises(ValueError):
            async with shop.transaction() as failing:
                await failing.publish({"class": "Order", "n": 10})
                raise ValueError("the payment failed")
        assert failing.state is TransactionState.ABORTED
        await eventually(lambda: len(on_abort.got) == 1 and len(immediate.got) == 8)
        with pytest.raises(TransactionAborted):
            await failing.commit()
        with pytest.raises(TransactionClosed):
            await tx.publish({"class": "Order", "n": 99})

        await shop.publish({"class": "Order", "n": 20})  # outside any transaction
        await eventually(lambda: all(len(i.got) in (4, 9, 2, 8) for i in inboxes.values()))
        await asyncio.sleep(0.3)  # nothing else comes

        assert on_commit.got == [*_outcomes(range(3), "committed"), (20, "")]
        assert immediate.got == [
            *_outcomes(range(3), "pending"),
            *_outcomes(range(3), "committed"),
            (10, "pending"),
            (10, "aborted"),
            (20, ""),
        ]
        assert on_abort.got == [(10, "aborted"), (20, "")]
        assert deferred.got == [
            *_outcomes(range(3), "committing"),
            *_outcomes(range(3), "committed"),
            (10, "aborted"),  # aborted before its commit started: no committing copy
            (20, ""),
        ]
        assert on_commit.transactions == {f"shop@A:{tx.id}"}


async def test_explicit_ends_and_refusals(overlay: dict[str, BrokerProcess]) -> None:
    async with (
        _subscribers(overlay, "Explicit") as inboxes,
        Client(overlay["A"].url, "explicit") as shop,
    ):
        await shop.advertise("[class,eq,'Explicit'],[n,isPresent,0]")
        tx = await shop.transaction().begin()
        await tx.publish("[class,'Explicit'],[n,1]")
        await tx.abort()
        tx2 = await shop.transaction().begin()
        await tx2.publish({"class": "Explicit", "n": 2})
        await tx2.publish({"class": "Other", "n": 3})  # not advertised: the broker aborts
        with pytest.raises(TransactionAborted, match="conforms to none of your advertisements"):
            await tx2.commit()
        unknown = shop.transaction("nobody-began-this")
        unknown.state = TransactionState.OPEN  # as if begun: the broker knows better
        with pytest.raises(TransactionError, match="no transaction 'nobody-began-this'"):
            await unknown.commit()
        on_abort = inboxes[Visibility.ON_ABORT]
        await eventually(lambda: on_abort.got == [(1, "aborted"), (2, "aborted")])
        big = await shop.transaction().begin()
        for n in range(21):
            await big.publish({"class": "Explicit", "n": 100 + n})
        with pytest.raises(TransactionLimit, match="more than 20 publications"):
            await big.commit()
        await eventually(lambda: len(on_abort.got) == 22)
        assert inboxes[Visibility.ON_COMMIT].got == []


def test_the_blocking_client_commits(overlay: dict[str, BrokerProcess]) -> None:
    got: list[Delivery] = []
    with (
        BlockingClient(overlay["C"].url, "bsub") as sub,
        BlockingClient(overlay["A"].url, "bpub") as pub,
    ):
        handle = sub.subscribe("[class,eq,'Blocking']", visibility="on_commit")
        pub.advertise("[class,eq,'Blocking'],[n,isPresent,0]")
        with pub.transaction() as tx:
            tx.publish({"class": "Blocking", "n": 1})
            tx.publish({"class": "Blocking", "n": 2})
        for delivery in sub.deliveries(handle, timeout=10):
            got.append(delivery)
            if len(got) == 2:
                break
    assert [d.publication.attributes["n"] for d in got if isinstance(d, Notify)] == [1, 2]


async def test_a_block_whose_transaction_the_broker_aborted_raises_on_leaving(
    overlay: dict[str, BrokerProcess],
) -> None:
    async with Client(overlay["A"].url, "outgrown") as shop:
        await shop.advertise("[class,eq,'Outgrown'],[n,isPresent,0]")
        with pytest.raises(TransactionLimit, match="more than 20 publications"):
            async with shop.transaction() as tx:
                for n in range(21):  # one more than the broker allows: it aborts
                    await tx.publish({"class": "Outgrown", "n": n})
                await eventually(lambda: tx.state is TransactionState.ABORTED)
                # the block goes on with other work, and ends without an error
        async with shop.transaction() as dropped:  # aborted by the block itself: nothing raised
            await dropped.publish({"class": "Outgrown", "n": 99})
            await dropped.abort()
        assert dropped.state is TransactionState.ABORTED


def test_a_blocking_block_whose_transaction_the_broker_aborted_raises_on_leaving(
    overlay: dict[str, BrokerProcess],
) -> None:
    with BlockingClient(overlay["A"].url, "boutgrown") as pub:
        pub.advertise("[class,eq,'Outgrown'],[n,isPresent,0]")
        limit = pytest.raises(TransactionLimit, match="more than 20 publications")
        with limit, pub.transaction() as tx:
            for n in range(21):
                tx.publish({"class": "Outgrown", "n": n})
            deadline = time.monotonic() + 10
            while tx.state is not TransactionState.ABORTED and time.monotonic() < deadline:
                time.sleep(0.02)


async def test_padres_pub_fails_when_its_transaction_is_aborted(
    overlay: dict[str, BrokerProcess],
) -> None:
    command = [sys.executable, "-m", "padres.cli", "pub", "--broker", overlay["A"].url]
    command += ["--transaction", *(f"[class,'Outgrown'],[n,{n}]" for n in range(21))]
    done = await asyncio.to_thread(subprocess.run, command, cwd=ROOT, capture_output=True)
    assert done.returncode != 0
    assert b"more than 20 publications" in done.stderr


async def test_a_publisher_back_within_the_linger_goes_on_with_its_transaction(
    overlay: dict[str, BrokerProcess],
) -> None:
    async with (
        _subscribers(overlay, "Resumed") as inboxes,
        Client(overlay["A"].url, "resumer", reconnect=True) as shop,
    ):
        await shop.advertise("[class,eq,'Resumed'],[n,isPresent,0]")
        async with shop.transaction() as tx:
            await tx.publish({"class": "Resumed", "n": 1})
            dropped = shop.transport
            assert dropped is not None
            await dropped.close()  # the connection drops; the client dials again
            await eventually(
                lambda: shop.transport is not dropped and shop.state is ClientState.OPEN
            )
            await tx.publish({"class": "Resumed", "n": 2})
        on_commit = inboxes[Visibility.ON_COMMIT]
        await eventually(lambda: len(on_commit.got) == 2)
        assert on_commit.got == _outcomes(range(1, 3), "committed")
        assert inboxes[Visibility.ON_ABORT].got == []


async def test_padres_sub_prints_outcomes(overlay: dict[str, BrokerProcess]) -> None:
    command = [sys.executable, "-m", "padres.cli", "sub", "--broker", overlay["B"].url]
    command += ["[class,eq,'Shown']", "--visibility", "immediate", "--count", "2"]
    sub = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        assert sub.stderr is not None
        assert (await asyncio.to_thread(sub.stderr.readline)).startswith(b"subscribed")
        async with Client(overlay["A"].url, "shower") as shop:
            await shop.advertise("[class,eq,'Shown'],[n,isPresent,0]")
            tx = await shop.transaction().begin()
            await tx.publish({"class": "Shown", "n": 1})
            await tx.abort()
            out, _ = await asyncio.to_thread(sub.communicate, timeout=20)
    finally:
        sub.kill()
        sub.wait()
    lines = out.decode().splitlines()
    assert lines == [
        f"s1 <- [class,'Shown'],[n,1]  (pending in shower@A:{tx.id})",
        f"s1 <- [class,'Shown'],[n,1]  (aborted in shower@A:{tx.id})",
    ]


async def test_padres_pub_commits_a_transaction(overlay: dict[str, BrokerProcess]) -> None:
    inbox = Inbox()
    async with Client(overlay["C"].url, "listener") as listener:
        await listener.subscribe("[class,eq,'Batch']", inbox)
        command = [sys.executable, "-m", "padres.cli", "pub", "--broker", overlay["A"].url]
        command += ["--transaction", "[class,'Batch'],[n,1]", "[class,'Batch'],[n,2]"]
        done = await asyncio.to_thread(subprocess.run, command, cwd=ROOT, capture_output=True)
        assert done.returncode == 0, done.stderr
        await eventually(lambda: len(inbox.got) == 2)
    assert inbox.got == [(1, "committed"), (2, "committed")]
    assert len(inbox.transactions) == 1


_DOOMED = """
import asyncio, sys
from padres.client.connection import Client

async def main() -> None:
    async with Client(sys.argv[1], "doomed") as client:
        await client.advertise("[class,eq,'Doomed'],[n,isPresent,0]")
        tx = await client.transaction().begin()
        for n in range(2):
            await tx.publish({"class": "Doomed", "n": n})
        print("published", flush=True)
        await asyncio.sleep(60)

asyncio.run(main())
"""


async def test_a_publisher_killed_mid_transaction_is_aborted_for_it(
    overlay: dict[str, BrokerProcess],
) -> None:
    async with _subscribers(overlay, "Doomed") as inboxes:
        publisher = subprocess.Popen(
            [sys.executable, "-c", _DOOMED, overlay["A"].url],
            stdout=subprocess.PIPE,
            cwd=ROOT,
        )
        try:
            assert publisher.stdout is not None
            line = await asyncio.to_thread(publisher.stdout.readline)
            assert line.strip() == b"published"
            immediate = inboxes[Visibility.IMMEDIATE]
            await eventually(lambda: len(immediate.got) == 2)
        finally:
            publisher.kill()  # SIGKILL: the connection drops with the transaction open
            publisher.wait(10)
            if publisher.stdout is not None:
                publisher.stdout.close()
        on_abort = inboxes[Visibility.ON_ABORT]
        await eventually(lambda: len(on_abort.got) == 2 and len(immediate.got) == 4)
        await asyncio.sleep(0.3)
        assert on_abort.got == _outcomes(range(2), "aborted")
        assert immediate.got == [*_outcomes(range(2), "pending"), *_outcomes(range(2), "aborted")]
        assert inboxes[Visibility.ON_COMMIT].got == []


async def test_a_durable_subscriber_gets_a_commit_once_across_restarts_of_its_broker(
    overlay: dict[str, BrokerProcess],
) -> None:
    kept = Inbox()
    async with Client(overlay["C"].url, "keeper") as keeper:
        await keeper.subscribe("[class,eq,'Kept']", kept, durable="kept")
    async with Client(overlay["A"].url, "saver", reconnect=True) as saver:
        await saver.advertise("[class,eq,'Kept'],[n,isPresent,0]")
        async with saver.transaction() as aborted:
            await aborted.publish({"class": "Kept", "n": -1})
            await aborted.abort()
        overlay["C"].kill()  # the subscriber's broker is down during the commit
        async with saver.transaction() as tx:
            for n in range(5):
                await tx.publish({"class": "Kept", "n": n})
        await asyncio.to_thread(overlay["C"].start)
        for _ in range(2):  # resume, then once more after another kill -9
            async with Client(overlay["C"].url, "keeper") as keeper:
                await keeper.subscribe("[class,eq,'Kept']", kept, durable="kept")
                await eventually(lambda: len(kept.got) >= 5, timeout=30)
                await asyncio.sleep(0.5)
            overlay["C"].kill()
            await asyncio.to_thread(overlay["C"].start)
        async with Client(overlay["C"].url, "keeper") as keeper:
            await keeper.subscribe("[class,eq,'Kept']", kept, durable="kept")
            await asyncio.sleep(0.5)
            await keeper.unsubscribe("kept")
    assert kept.got == _outcomes(range(5), "committed")
    assert kept.transactions == {f"saver@A:{tx.id}"}
