"""Event streams stay alive while nothing is delivered."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from padres.model.protocol import Envelope, Error
from web import subscribing

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _slow(messages: list[Envelope], pause: float) -> AsyncIterator[Envelope]:
    for message in messages:
        await asyncio.sleep(pause)
        yield message


async def test_a_quiet_stream_sends_keepalives_between_deliveries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(subscribing, "KEEPALIVE", 0.05)
    sent: list[Envelope] = [Error("one"), Error("two")]
    got = [m async for m in subscribing._with_keepalives(_slow(sent, 0.18))]
    assert [m for m in got if m is not None] == sent
    first, second = got.index(sent[0]), got.index(sent[1])
    assert first >= 2 and second - first >= 3, got  # about 3 keepalives in each pause


async def test_a_busy_stream_sends_no_keepalives(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subscribing, "KEEPALIVE", 5.0)
    sent: list[Envelope] = [Error(str(n)) for n in range(50)]
    assert [m async for m in subscribing._with_keepalives(_slow(sent, 0))] == sent
