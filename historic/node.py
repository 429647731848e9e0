"""A database-client node: a client of a broker that stores what it is told to, as in PADRES.

It is controlled by publications of class ``DB_CONTROL`` addressed to it::

    [class,'DB_CONTROL'],[db,'DB1'],[command,'STORE'],[spec,'[class,eq,\\'Order\\']'],[request,'r1']

(the spec is a filter in PADRES syntax, as a string). Commands:

- ``STORE`` with ``spec``: subscribe to the spec and store every publication matching it from
  then on (a publication matching several specs is stored once), and offer to replay it.
- ``STOP`` with ``spec`` (the same text): stop storing it and withdraw the offer; what is
  stored stays and is still replayed for the other specs it matches.
- ``LIST``: report what it stores.

Every command is answered with a ``DB_STATUS`` publication: ``[db, <id>]``, ``[request, ...]``
(the command's), ``[ok, true|false]``, ``[detail, <text>]`` and ``[specs, <specs, one per
line>]``. Writes are batched: publications are flushed to the store every ``flush_every``
seconds or ``batch`` publications, whichever comes first.

Historic queries routed to the node (``ReplayRequest``) are answered once the node's clock has
passed the request's ``ready_at`` and what was pending is written: one query, its results
streamed back in time order in batches, then ``ReplayEnd`` with the count or the error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime
from typing import Final

from historic.store import Store, StoreError
from padres.client import Client, Delivery
from padres.errors import ParseError
from padres.messages import Publication
from padres.parser import parse_filter
from padres.printer import format_filter
from padres.protocol import Notify, ReplayBatch, ReplayEnd, ReplayRequest

__all__ = ["CONTROL", "STATUS", "DatabaseNode"]

log = logging.getLogger("padres.db")

CONTROL: Final = "DB_CONTROL"
STATUS: Final = "DB_STATUS"
MAX_WAIT: Final = 10.0
"""A request's ``ready_at`` further ahead than this (a skewed clock) is not waited for."""


class DatabaseNode:
    """Stores the publications matching its specs (see the module docstring)."""

    def __init__(
        self,
        db_id: str,
        client: Client,
        store: Store,
        *,
        batch: int = 500,
        flush_every: float = 0.1,
    ) -> None:
        self.id = db_id
        self.client = client
        self.store = store
        self.batch = batch
        self.flush_every = flush_every
        self.specs: dict[str, str] = {}
        """Normalized spec text -> the id of its subscription (and of its replay offer)."""
        self.stored = 0
        self._pending: list[Publication] = []
        self._last: Delivery | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._full = asyncio.Event()
        self._replies = 0
        self._writing = asyncio.Lock()
        self._replays: set[asyncio.Task[None]] = set()
        self.replayed = 0
        client.on_replay = self._on_replay

    async def start(self) -> None:
        await self.client.advertise(
            f"[class,eq,'{STATUS}'],[db,eq,'{self.id}'],[request,isPresent,''],"
            "[ok,isPresent,true],[detail,isPresent,''],[specs,isPresent,'']"
        )
        await self.client.subscribe(
            f"[class,eq,'{CONTROL}'],[db,eq,'{self.id}'],[command,isPresent,'']",
            self._on_control,
            id="control",
        )
        self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())

    async def stop(self) -> None:
        for task in list(self._replays):
            task.cancel()
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        self.flush()

    # -- storing -----------------------------------------------------------------------------

    def _on_publication(self, delivery: Delivery) -> None:
        if delivery is self._last or not isinstance(delivery, Notify):
            return  # one delivery naming several specs arrives once per spec: keep one
        self._last = delivery
        self._pending.append(delivery.publication)
        if len(self._pending) >= self.batch:
            self._full.set()

    def flush(self) -> None:
        """Write what is pending now (on the caller's thread)."""
        self._write(self._take())

    def _take(self) -> list[Publication]:
        pending, self._pending = self._pending, []
        return pending

    def _write(self, pending: list[Publication]) -> None:
        if not pending:
            return
        try:
            self.stored += self.store.add(pending)
        except StoreError:
            log.exception("%s: %d publications could not be stored", self.id, len(pending))

    async def _flush_loop(self) -> None:
        """Write in the background, off the event loop, every ``flush_every`` s or when full."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._full.wait(), self.flush_every)
            self._full.clear()
            await self._flush()

    async def _flush(self) -> None:
        async with self._writing:
            await asyncio.to_thread(self._write, self._take())

    # -- replay ------------------------------------------------------------------------------

    def _on_replay(self, request: ReplayRequest) -> None:
        task = asyncio.get_running_loop().create_task(self._replay(request))
        self._replays.add(task)
        task.add_done_callback(self._replays.discard)

    async def _replay(self, request: ReplayRequest) -> None:
        rid, db = request.subscription.id, request.database
        await asyncio.sleep(min(max(0.0, request.ready_at - time.time()), MAX_WAIT))
        await self._flush()  # what arrived before now is in the store before the query runs
        loop = asyncio.get_running_loop()

        def run() -> int:
            flt = request.subscription.filter
            window = flt.window
            sent = 0
            chunks = self.store.stream(
                flt,
                since=window.start if window else None,
                until=window.end if window else None,
                size=self.batch,
            )
            for chunk in chunks:
                batch = ReplayBatch(rid, db, tuple(chunk))
                asyncio.run_coroutine_threadsafe(self.client.answer([batch]), loop).result()
                sent += len(chunk)
            return sent

        try:
            count = await asyncio.to_thread(run)
        except StoreError as exc:
            log.warning("%s: replay %s failed: %s", self.id, rid, exc)
            await self.client.answer([ReplayEnd(rid, db, 0, f"query failed: {exc}")])
            return
        self.replayed += count
        await self.client.answer([ReplayEnd(rid, db, count)])

    # -- control -----------------------------------------------------------------------------

    def _on_control(self, delivery: Delivery) -> None:
        if isinstance(delivery, Notify):
            asyncio.get_running_loop().create_task(self._command(delivery.publication))

    async def _command(self, pub: Publication) -> None:
        attrs = pub.attributes
        command = attrs.get("command")
        request = str(attrs.get("request", pub.id))
        spec_text = attrs.get("spec")
        try:
            if command == "LIST":
                await self._reply(request, True, f"{len(self.specs)} specs")
            elif command not in ("STORE", "STOP"):
                await self._reply(request, False, f"unknown command {command!r}: STORE, STOP, LIST")
            elif not isinstance(spec_text, str):
                await self._reply(request, False, f"{command} needs a spec: [spec,'<filter>']")
            else:
                spec = format_filter(parse_filter(spec_text))
                if command == "STORE":
                    await self._store(request, spec)
                else:
                    await self._stop(request, spec)
        except ParseError as exc:
            await self._reply(request, False, f"bad spec: {exc.reason} (column {exc.column})")

    async def _store(self, request: str, spec: str) -> None:
        if spec in self.specs:
            await self._reply(request, True, f"already storing {spec}")
            return
        await self.store_spec(spec)
        await self._reply(request, True, f"storing {spec}")

    async def store_spec(self, spec: str) -> None:
        """Store what ``spec`` (a filter, normalized) matches from now on, and offer it."""
        handle = await self.client.subscribe(spec, self._on_publication)
        await self.client.offer_replay(spec, id=handle.id)
        self.specs[spec] = handle.id

    async def _stop(self, request: str, spec: str) -> None:
        sid = self.specs.pop(spec, None)
        if sid is None:
            await self._reply(request, False, f"not storing {spec}")
            return
        await self.client.unsubscribe(sid)
        await self.client.unadvertise(sid)
        await self._flush()
        await self._reply(request, True, f"stopped storing {spec}")

    async def _reply(self, request: str, ok: bool, detail: str) -> None:
        self._replies += 1
        await self.client.publish(
            Publication(
                f"{self.id}-r{self._replies}",
                {
                    "class": STATUS,
                    "db": self.id,
                    "request": request,
                    "ok": ok,
                    "detail": detail,
                    "specs": "\n".join(sorted(self.specs)),
                },
                datetime.now(UTC),
            )
        )
