"""Answering historic queries: one responder per client, whatever it replays from.

A database node replays from its store, an archive node from Parquet files; a client may host
both. Each registers a ``ReplaySource`` with the client's responder (``responder``); the
responder takes every ``ReplayRequest`` routed to the client, waits until each source is ready
for it, reads the sources on a worker thread, merges them into one stream in time order (a
publication several sources hold is sent once), and sends it back in ``ReplayBatch``es of
``batch`` publications (the next batch is read while one is sent), then ``ReplayEnd`` with the
count, or with the error that cut it short.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from itertools import chain
from typing import Any, Protocol

from padres.errors import ConnectionLost, PadresError
from padres.model.messages import Filter, Publication
from padres.model.protocol import ReplayBatch, ReplayEnd, ReplayRequest

__all__ = ["ReplayResponder", "ReplaySource", "Replier", "responder"]

log = logging.getLogger("padres.replay")


class ReplaySource(Protocol):
    """Where a node replays from."""

    name: str
    """What the source is, in errors and logs (``store``, ``archive``)."""

    async def ready(self, request: ReplayRequest) -> None:
        """Return once what ``request`` asks for can be read (what arrived before it was
        made is stored, say)."""

    def stream(self, flt: Filter, size: int) -> Iterable[Sequence[Publication]]:
        """The publications matching ``flt`` and its window, in time order, about ``size`` at
        a time. Called on a worker thread; a failure raises ``PadresError`` or ``OSError``."""


class Replier(Protocol):
    """The part of a client a responder needs (``padres.client.Client`` is one)."""

    on_replay: Callable[[ReplayRequest], Any] | None

    async def answer(self, messages: list[ReplayBatch | ReplayEnd]) -> None: ...


class ReplayResponder:
    """Answers the replay requests routed to one client from its sources (see the module)."""

    def __init__(self, client: Replier, name: str, *, batch: int = 500) -> None:
        self.client = client
        self.name = name
        self.batch = batch
        self.sources: list[ReplaySource] = []
        self.replayed = 0
        """Publications sent in answers so far."""
        self._tasks: set[asyncio.Task[None]] = set()
        client.on_replay = self._on_replay

    def add(self, source: ReplaySource) -> None:
        self.sources.append(source)

    async def stop(self) -> None:
        """Abandon the answers under way."""
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _on_replay(self, request: ReplayRequest) -> None:
        task = asyncio.get_running_loop().create_task(self.answer(request))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def answer(self, request: ReplayRequest) -> None:
        """Answer ``request`` from every source, then end it."""
        rid, db = request.subscription.id, request.database
        await asyncio.gather(*(source.ready(request) for source in self.sources))
        loop = asyncio.get_running_loop()

        def run() -> int:
            flt = request.query()  # the window cut where the requester's history grant ends
            if flt is None:
                return 0
            sent = 0
            sending: Future[None] | None = None
            try:
                for chunk in _chunks(self._merged(flt), self.batch):
                    if sending is not None:
                        sending.result()  # one batch on its way while the next is read
                    batch = ReplayBatch(rid, db, tuple(chunk))
                    sending = asyncio.run_coroutine_threadsafe(self.client.answer([batch]), loop)
                    sent += len(chunk)
            finally:
                if sending is not None:
                    sending.result()
            return sent

        try:
            try:
                end = ReplayEnd(rid, db, await asyncio.to_thread(run))
            except ConnectionLost:  # sending a batch failed: handled below, not a bug
                raise
            except (PadresError, OSError) as exc:
                log.warning("%s: replay %s failed: %s", self.name, rid, exc)
                end = ReplayEnd(rid, db, 0, f"query failed: {exc}")
            except Exception as exc:  # a bug, or a row that cannot be read: this replay fails
                log.exception("%s: replay %s failed", self.name, rid)
                end = ReplayEnd(rid, db, 0, f"query failed: {type(exc).__name__}: {exc}")
            await self.client.answer([end])
        except ConnectionLost as exc:  # the broker ends the request for its requester
            log.warning("%s: replay %s abandoned: %s", self.name, rid, exc)
            return
        self.replayed += end.count

    def _merged(self, flt: Filter) -> Iterator[Publication]:
        streams = [chain.from_iterable(s.stream(flt, self.batch)) for s in self.sources]
        if len(streams) == 1:
            yield from streams[0]
            return
        seen: set[tuple[str, str]] = set()
        at = None
        for pub in heapq.merge(*streams, key=lambda p: p.timestamp):
            if pub.timestamp != at:  # duplicates share a timestamp: remember one instant's
                at = pub.timestamp
                seen.clear()
            key = (pub.publisher, pub.id)
            if key not in seen:
                seen.add(key)
                yield pub


def _chunks(pubs: Iterator[Publication], size: int) -> Iterator[list[Publication]]:
    chunk: list[Publication] = []
    for pub in pubs:
        chunk.append(pub)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


_RESPONDERS: weakref.WeakKeyDictionary[Replier, ReplayResponder] = weakref.WeakKeyDictionary()


def responder(client: Replier, name: str, *, batch: int = 500) -> ReplayResponder:
    """The responder of ``client``, made on first use: the nodes a client hosts share it."""
    found = _RESPONDERS.get(client)
    if found is None:
        found = _RESPONDERS[client] = ReplayResponder(client, name, batch=batch)
    return found
