"""Adaptive paths between test hosts (``padres.bench.paths``): a cycle of four brokers
A-B-C-D with the default heartbeat (a silent link is given up after 10 s only), the publisher
at A, the subscribers at C, the trees reaching C through B first. A way slowed by 200 ms is
left for the faster one; the broker on the publications' way frozen (SIGSTOP) is left within
two seconds, and guaranteed publications reach a durable subscription exactly once and in
order throughout, the freeze and the thaw included."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from padres.bench.paths import DELAY, Ring, frozen, ring, slowed
from padres.testing.hosts import unavailable

WHY = unavailable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=WHY or "")


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """One event loop for the module: the proxy of the shared cycle runs in it."""
    return "asyncio"


@pytest.fixture(scope="module")
async def cycle() -> AsyncIterator[Ring]:
    async with ring() as state:
        yield state


async def test_a_slowed_way_is_left_for_the_faster_one(cycle: Ring) -> None:
    """The proxy delays B-C: publications through B take more than the delay until C
    measures it and moves its trees to D; from then on they take the fast way."""
    result = await slowed(cycle)
    print(result)
    assert result["arrived"] == result["published"]  # none lost on the way
    assert result["before_ms"] < 50
    assert result["first_second_max_ms"] >= DELAY * 1000  # the slow way, before the move
    assert result["after_ms"] < 50 and result["after_p90_ms"] < 100
    assert result["moves"] >= 1


async def test_a_frozen_broker_on_the_way_is_left_within_two_seconds(cycle: Ring) -> None:
    """The broker carrying the publications to C is frozen for 6 s, then thawed: plain
    publications go on by the other way within two seconds (the heartbeat would give it up
    after ten), none twice; every guaranteed one comes once, in order."""
    result = await frozen(cycle, 6.0)
    print(result)
    assert result["gap_seconds"] < 2.0
    assert result["twice"] == 0
    assert result["guaranteed_once_in_order"], result
    assert result["moves"] >= 1
