"""Brokers in the test's process (the ``cluster`` fixture): routing across a chain, and the
fixture's own promises (every link up before the test, every broker stopped after it)."""

from __future__ import annotations

import pytest

from padres.errors import ConnectError
from padres.model.protocol import Notify
from padres.testing.cluster import Cluster, cluster


async def test_a_publication_crosses_the_chain_to_the_subscriber_only(cluster: Cluster) -> None:
    subscriber = await cluster.client(2, "far")
    bystander = await cluster.client(1, "middle")
    publisher = await cluster.client(0, "near")
    wanted = await subscriber.subscribe("[class,eq,'Quote'],[price,>,10]")
    other = await bystander.subscribe("[class,eq,'Quote'],[price,<,5]")
    await publisher.advertise("[class,eq,'Quote'],[price,isPresent,0]")
    for price in (3, 30):
        await publisher.publish(f"[class,'Quote'],[price,{price}]")
    got = await wanted.get(5)
    assert isinstance(got, Notify) and got.publication.attributes["price"] == 30
    low = await other.get(5)
    assert isinstance(low, Notify) and low.publication.attributes["price"] == 3


@pytest.mark.cluster(2)
async def test_the_marker_sets_the_size_and_every_link_is_up(cluster: Cluster) -> None:
    assert [sorted(n.broker.peers.values()) for n in cluster.nodes] == [["B2"], ["B1"]]


async def test_every_broker_stops_with_the_block_even_when_it_fails() -> None:
    with pytest.raises(RuntimeError, match="inside"):
        async with cluster(2) as started:
            nodes = started.nodes
            raise RuntimeError("inside")
    for node in nodes:
        with pytest.raises(ConnectError, match="cannot connect"):
            await Cluster([node]).client(0, "late")
