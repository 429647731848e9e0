"""The client's transports: a client attached to a node in its process is routed, checked,
bounded and evicted as a socket's client is; a plain subscription that waits when its queue is
full loses nothing, where one that drops loses what does not fit."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from padres.broker import Broker
from padres.client.connection import Client, ClientState
from padres.errors import AuthenticationError, ConnectError, RequestFailed
from padres.model.protocol import Notify, Role
from padres.runtime.node import BrokerNode, Limits
from padres.security.accounts import Accounts
from padres.testing.cluster import Cluster, cluster
from tests.support import eventually
from tests.test_security import CHEAP

QUOTE = "[class,eq,'Quote'],[n,isPresent,0],[pad,isPresent,'']"


async def _publish(publisher: Client, count: int, pad: int = 10) -> None:
    await publisher.advertise(QUOTE)
    for n in range(count):
        await publisher.publish({"class": "Quote", "n": n, "pad": "x" * pad})


def _numbers(deliveries: list[Notify]) -> list[object]:
    return [d.publication.attributes["n"] for d in deliveries]


async def test_attached_and_socket_clients_meet_across_the_overlay(cluster: Cluster) -> None:
    far = await cluster.client(2, "far")  # attached to B3
    near = await cluster.client(0, "near", socket=True)  # through B1's WebSocket endpoint
    wanted = await far.subscribe("[class,eq,'Quote'],[n,>=,5]")
    await _publish(near, 10)
    got = [await wanted.get(5) for _ in range(5)]
    assert _numbers(got) == [5, 6, 7, 8, 9]  # type: ignore[arg-type]
    assert far.transport is not None and far.session == "far@B3"


@contextlib.asynccontextmanager
async def _served(node: BrokerNode) -> AsyncIterator[BrokerNode]:
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    serving = asyncio.ensure_future(node.serve(port=0, ready=ready.set_result))
    try:
        await asyncio.wait_for(ready, 10)
        yield node
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving


async def test_an_attached_client_is_authenticated_and_held_to_its_grants(tmp_path: Path) -> None:
    accounts = Accounts(tmp_path / "accounts.toml", hasher=CHEAP, create=True)
    accounts.add("eve", "eve-pw")
    accounts.grant("eve", "subscribe", "[class,eq,'Quote']")
    accounts.add("B9", "B9-pw", role=Role.BROKER)
    async with _served(BrokerNode(Broker("B1", accounts=accounts))) as node:
        with pytest.raises(AuthenticationError, match="unknown user or wrong password"):
            await Client.attached(node, "eve", user="eve", password="wrong").connect()
        with pytest.raises(AuthenticationError, match="requires authentication"):
            await Client.attached(node, "eve").connect()
        async with Client.attached(node, "eve", user="eve", password="eve-pw") as eve:
            await eve.subscribe("[class,eq,'Quote']")
            with pytest.raises(RequestFailed, match="no subscribe grant covers it"):
                await eve.subscribe("[class,eq,'Order']")
        account = accounts.get("eve")  # authenticated by the caller: its grants apply
        async with Client.attached(node, "eve", account=account, trusted=True) as trusted:
            with pytest.raises(RequestFailed, match="no subscribe grant covers it"):
                await trusted.subscribe("[class,eq,'Order']")
    with pytest.raises(ConnectError, match="not serving"):
        await Client.attached(node, "late").connect()


@pytest.mark.cluster(1)
async def test_a_plain_subscription_that_waits_when_full_loses_nothing(cluster: Cluster) -> None:
    waits = await cluster.client(0, "waits", max_pending=5)
    drops = await cluster.client(0, "drops", max_pending=5)
    patient = await waits.subscribe("[class,eq,'Quote']", when_full="wait")
    hasty = await drops.subscribe("[class,eq,'Quote']")
    await _publish(await cluster.client(0, "pub"), 500)
    await eventually(lambda: sum(hasty.statistics()[i] for i in (0, 3)) == 500)
    assert hasty.statistics().dropped == 495  # five kept, the rest dropped: it never read
    assert patient.statistics().pending <= 5 and patient.statistics().dropped == 0
    got = [await patient.get(5) for _ in range(500)]
    assert _numbers(got) == list(range(500))  # type: ignore[arg-type]
    assert patient.statistics().dropped == 0


async def test_an_attached_client_that_stops_reading_is_evicted() -> None:
    limits = Limits(client_queue=64 << 10, evict_after=0.3)
    async with cluster(1, limits=limits) as started:
        slow = await started.client(0, "slow", max_pending=1)
        stuck = await slow.subscribe("[class,eq,'Quote']", when_full="wait")
        publisher = await started.client(0, "pub")
        await publisher.advertise(QUOTE)

        async def flood() -> None:
            while slow.transport is not None and not slow.transport.reason:
                pubs = [{"class": "Quote", "n": n, "pad": "x" * 1000} for n in range(100)]
                for attributes in pubs:
                    await publisher.publish(attributes)
                await asyncio.sleep(0.01)

        await asyncio.wait_for(flood(), 20)
        assert slow.transport is not None and "evicted" in slow.transport.reason
        assert started.nodes[0].evicted == 1
        taken = [d async for d in stuck]  # what it held, then the end
        assert len(taken) >= 1 and slow.state is ClientState.CLOSED
        assert "evicted" in slow.closed_reason
