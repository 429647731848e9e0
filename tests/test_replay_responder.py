"""One replay responder per client: a client hosting a store and an archive answers one
request from both, in time order, each publication once; a failing source ends the answer
with its error."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from padres.client.replay import ReplayResponder, responder
from padres.errors import PadresError
from padres.language.parser import parse_filter
from padres.model.messages import Filter, Publication, Subscription
from padres.model.protocol import ReplayBatch, ReplayEnd, ReplayRequest

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _pub(n: int, publisher: str = "shop") -> Publication:
    return Publication(f"p{n}", {"class": "Order", "n": n}, T0 + timedelta(seconds=n), publisher)


class _Source:
    def __init__(self, name: str, pubs: list[Publication], fail: bool = False) -> None:
        self.name = name
        self.pubs = pubs
        self.fail = fail
        self.readied = 0

    async def ready(self, request: ReplayRequest) -> None:
        self.readied += 1

    def stream(self, flt: Filter, size: int) -> Iterable[Sequence[Publication]]:
        if self.fail:
            raise PadresError(f"{self.name} is unreadable")
        for start in range(0, len(self.pubs), size):
            yield self.pubs[start : start + size]


class _Client:
    def __init__(self) -> None:
        self.on_replay: Callable[[ReplayRequest], Any] | None = None
        self.sent: list[ReplayBatch | ReplayEnd] = []

    async def answer(self, messages: list[ReplayBatch | ReplayEnd]) -> None:
        self.sent += messages


def _request() -> ReplayRequest:
    sub = Subscription("r1", parse_filter("[class,eq,'Order']"))
    return ReplayRequest(sub, "t1", "DB1@B1", ready_at=0.0)


async def test_a_store_and_an_archive_of_one_client_answer_once_in_time_order() -> None:
    client = _Client()
    store = _Source("store", [_pub(n) for n in (2, 4, 5, 9)])
    archive = _Source("archive", [_pub(n) for n in (1, 3, 4, 8)])  # p4 in both
    first = responder(client, "DB1", batch=3)
    first.add(store)
    assert responder(client, "ignored") is first  # the nodes of one client share it
    first.add(archive)
    await first.answer(_request())
    batches = [m for m in client.sent if isinstance(m, ReplayBatch)]
    assert [len(b.publications) for b in batches] == [3, 3, 1]
    ids = [p.id for b in batches for p in b.publications]
    assert ids == ["p1", "p2", "p3", "p4", "p5", "p8", "p9"]
    assert client.sent[-1] == ReplayEnd("r1", "DB1@B1", 7)
    assert store.readied == archive.readied == 1 and first.replayed == 7


async def test_a_failing_source_ends_the_answer_with_its_error() -> None:
    client = _Client()
    replies = ReplayResponder(client, "DB2")
    replies.add(_Source("archive", [], fail=True))
    await replies.answer(_request())
    (end,) = client.sent
    assert isinstance(end, ReplayEnd) and end.count == 0
    assert "archive is unreadable" in end.error


class _Breaking(_Source):
    """Two batches, then the source fails."""

    def stream(self, flt: Filter, size: int) -> Iterable[Sequence[Publication]]:
        yield self.pubs[:size]
        yield self.pubs[size : 2 * size]
        raise PadresError(f"{self.name} broke")


class _SlowClient(_Client):
    """A client whose batches take a while to go out."""

    async def answer(self, messages: list[ReplayBatch | ReplayEnd]) -> None:
        if any(isinstance(m, ReplayBatch) for m in messages):
            await asyncio.sleep(0.05)
        self.sent += messages


async def test_batches_under_way_go_out_before_the_end_of_a_failed_answer() -> None:
    client = _SlowClient()
    replies = ReplayResponder(client, "DB3", batch=2)
    replies.add(_Breaking("store", [_pub(n) for n in range(6)]))
    await replies.answer(_request())
    *batches, end = client.sent
    assert [[p.id for p in b.publications] for b in batches if isinstance(b, ReplayBatch)] == [
        ["p0", "p1"],
        ["p2", "p3"],
    ]
    assert isinstance(end, ReplayEnd) and end.count == 0 and "store broke" in end.error
