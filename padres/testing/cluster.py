"""Brokers in the test's own process: ``async with cluster(3) as c:`` serves brokers B1..B3 on
loopback ports, each linked to the one before (a chain), waits until every link is up, and
stops them all when the block ends, whatever happens in it. ``c.client(i, name)`` connects a
client to broker ``i`` (from 0) in the process, without a socket (``Client.attached``);
``c.client(i, name, socket=True)`` through its WebSocket endpoint. Clients are closed with the
cluster.

Real links between real nodes, with no process to start: what a test of routing, flow
control or the client needs. A test of what a process does (kill -9, SIGSTOP, a restart, the
command line) uses ``padres.testing.processes``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from padres.broker import Broker
from padres.client.connection import Client
from padres.runtime.node import BrokerNode

__all__ = ["Cluster", "cluster"]

LINK_TIMEOUT = 15.0
"""Seconds the brokers may take to link before ``cluster`` gives up."""


@dataclass
class Cluster:
    """Started brokers and the clients connected to them."""

    nodes: list[BrokerNode]
    clients: list[Client] = field(default_factory=list)

    @property
    def urls(self) -> list[str]:
        return [_url(node) for node in self.nodes]

    async def client(self, at: int, name: str, *, socket: bool = False, **options: Any) -> Client:
        """A client of broker ``at``, connected (closed with the cluster): attached to it in
        this process, or through a WebSocket if ``socket``."""
        if socket:
            client = Client(self.urls[at], name, **options)
        else:
            client = Client.attached(self.nodes[at], name, **options)
        await client.connect()
        self.clients.append(client)
        return client


def _url(node: BrokerNode) -> str:
    assert node.address is not None, "the node is not serving yet"
    host, port = node.address
    return f"ws://{host}:{port}/ws"


@contextlib.asynccontextmanager
async def cluster(
    size: int = 3, links: Sequence[tuple[int, int]] | None = None, **node_options: Any
) -> AsyncIterator[Cluster]:
    """Serve ``size`` brokers; ``links`` (pairs of indexes, the second dials the first) default
    to a chain. ``node_options`` go to every ``BrokerNode`` (``heartbeat``, ``limits``)."""
    wanted = list(links) if links is not None else [(i - 1, i) for i in range(1, size)]
    nodes: list[BrokerNode] = []
    serving: list[asyncio.Task[None]] = []
    started = Cluster(nodes)
    try:
        for index in range(size):
            dials = [_url(nodes[a]) for a, b in wanted if b == index and a < index]
            node = BrokerNode(Broker(f"B{index + 1}"), neighbours=dials, **node_options)
            ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            serving.append(asyncio.ensure_future(node.serve(port=0, ready=ready.set_result)))
            await asyncio.wait_for(ready, LINK_TIMEOUT)
            nodes.append(node)
        degree = [sum(index in pair for pair in wanted) for index in range(size)]
        async with asyncio.timeout(LINK_TIMEOUT):
            while any(len(n.broker.peers) < d for n, d in zip(nodes, degree, strict=True)):
                await asyncio.sleep(0.02)
        yield started
    finally:
        for client in started.clients:
            with contextlib.suppress(Exception):  # the test may have closed it, or broken it
                await client.close()
        for task in serving:
            task.cancel()
        for task in serving:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
