"""An archive node: a client of a broker that offers an archive for replay, as a database node
offers its store, and answers the historic queries routed to it from the archive's files.

It offers one ``[class,eq,'<class>']`` per class the catalog holds, with the time range the
archive holds of it, so a historic or hybrid subscription reaches it by content and time,
wherever it is in the overlay; ``watch`` offers again what a later load added (a new class, or
a class's wider range: the new offer is made before the old one is withdrawn, so no query in
between misses the archive). A query is planned from the
catalog (only files whose statistics overlap the filter and its window are read), answered
exactly, and streamed back in time order in batches, then ``ReplayEnd``. The subscriber's broker
merges the answer with those of the live databases, each publication once.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Iterator
from typing import Final

from padres.client.connection import Client
from padres.client.replay import responder
from padres.errors import PadresError
from padres.model.messages import Filter, Predicate, Publication
from padres.model.protocol import ReplayRequest, Span
from rete.operators import Op
from spark.archive import Archive
from spark.catalog import ClassRange

__all__ = ["WATCH_EVERY", "ArchiveNode"]

WATCH_EVERY: Final = 10.0
"""Seconds between two looks at the catalog for what a load added."""

log = logging.getLogger("padres.archive")


class ArchiveNode:
    """Offers ``archive`` through ``client`` and answers its replay requests."""

    def __init__(self, node_id: str, client: Client, archive: Archive, *, batch: int = 500) -> None:
        self.id = node_id
        self.client = client
        self.archive = archive
        self.offers: dict[str, tuple[str, Span]] = {}
        """Class -> the id of its replay offer and the period offered."""
        self.files_read = 0
        self.name = "archive"
        self.replies = responder(client, node_id, batch=batch)
        """Answers the historic queries routed here, from the archive (a ``ReplaySource``)."""
        self.replies.add(self)

    @property
    def replayed(self) -> int:
        """Publications sent in answers to historic queries so far."""
        return self.replies.replayed

    async def start(self) -> None:
        """Offer every class of the archive (called again, offers what was loaded since)."""
        for held in await asyncio.to_thread(self.archive.classes):
            period = Span(held.start.timestamp(), held.end.timestamp())
            old = self.offers.get(held.class_name)
            if old is not None and old[1] == period:
                continue
            ident = _offer_id(held, period)
            offer = Filter((Predicate("class", Op.EQ, held.class_name),))
            await self.client.offer_replay(offer, id=ident, period=period)
            self.offers[held.class_name] = ident, period
            if old is not None:
                await self.client.unadvertise(old[0])
            log.info(
                "%s: offers %s, %s to %s, %d publications in %d files",
                self.id,
                held.class_name,
                held.start.isoformat(),
                held.end.isoformat(),
                held.rows,
                held.files,
            )

    async def watch(self, every: float = WATCH_EVERY) -> None:
        """Offer what later loads add, looking at the catalog every ``every`` seconds."""
        while True:
            await asyncio.sleep(every)
            try:
                await self.start()
            except PadresError as exc:
                log.warning("%s: could not offer what was loaded: %s", self.id, exc)

    async def stop(self) -> None:
        await self.replies.stop()

    async def ready(self, request: ReplayRequest) -> None:
        """The archive holds what it holds: nothing to wait for."""

    def stream(self, flt: Filter, size: int) -> Iterator[list[Publication]]:
        plan = self.archive.plan(flt)
        self.files_read += len(plan.read)
        return self.archive.stream(flt, size, plan)


def _offer_id(held: ClassRange, period: Span) -> str:
    """The same class and period give the same id: an offer made again after a restart."""
    key = f"{held.class_name}|{period.first!r}|{period.last!r}"
    return "archive-" + hashlib.sha256(key.encode()).hexdigest()[:16]
