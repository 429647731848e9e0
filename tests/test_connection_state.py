"""A broker node's connection lifecycle refuses transitions it cannot make."""

from __future__ import annotations

import pytest

from padres.runtime.connection import Connection, InvalidTransition, Phase
from padres.runtime.rate import Rate
from padres.runtime.send_queue import SendQueue


async def _connection() -> Connection:
    async def send(data: bytes) -> None:
        return None

    async def close(code: int, reason: str) -> None:
        return None

    return Connection("h1", SendQueue(send, close, limit=1 << 10), Rate(10), Rate(10))


async def test_an_accepted_connection_becomes_a_link_then_closes_and_goes_no_further() -> None:
    connection = await _connection()
    assert connection.phase is Phase.ACCEPTED and not connection.link
    connection.move(Phase.LINK)
    assert connection.link
    with pytest.raises(InvalidTransition, match="h1: link -> accepted"):
        connection.move(Phase.ACCEPTED)
    connection.move(Phase.CLOSED)
    for phase in Phase:
        with pytest.raises(InvalidTransition):
            connection.move(phase)
    await connection.queue.close()


async def test_a_connection_is_closed_once() -> None:
    connection = await _connection()
    connection.move(Phase.CLOSED)
    with pytest.raises(InvalidTransition, match="closed -> closed"):
        connection.move(Phase.CLOSED)
    await connection.queue.close()
