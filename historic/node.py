"""A database-client node: a client of a broker that stores what it is told to, as in PADRES.

It is controlled by publications of class ``DB_CONTROL`` addressed to it::

    [class,'DB_CONTROL'],[db,'DB1'],[command,'STORE'],[spec,'[class,eq,\\'Order\\']'],[request,'r1']

(the spec is a filter in PADRES syntax, as a string). PADRES' own names work too:
``[database_id,'socket://host:port/DB1']`` (or ``[database_id,'DB1']``) for ``db``, and
``content_spec`` for ``spec``. Commands:

- ``STORE`` with ``spec``: subscribe durably to the spec and store every publication matching
  it from then on (a publication matching several specs is stored once), and offer to replay it.
- ``STOP`` with ``spec`` (the same text): stop storing it and withdraw the offer; what is
  stored stays and is still replayed for the other specs it matches.
- ``LIST``: report what it stores.

Every command is answered with a ``DB_STATUS`` publication: ``[db, <id>]``, ``[request, ...]``
(the command's), ``[ok, true|false]``, ``[detail, <text>]``, ``[specs, <specs, one per
line>]`` and the node's counts: ``[stored, n]``, ``[set_aside, n]``, ``[failed, n]``,
``[dropped, n]`` (see ``Counts``). The specs are kept in the store, and taken up again when the
node starts.

Writes are grouped by a ``Writer``, on a worker thread: a write starts every ``flush_every``
seconds, or as soon as ``batch`` publications wait, and takes everything waiting then, up to
``most`` publications, in one transaction (one commit, one fsync). While it runs the next
publications gather, so that the faster they come the larger the commits grow. A write is never
fatal: a database that is unreachable or busy is retried with backoff, keeping the batch; a
publication the database refuses is set aside by the store (``Store.write``).

Each spec is a durable subscription at the node's broker, named after the spec: the broker
keeps what it matches while the node is away (paused, disconnected, restarting), and sends at
most a window of deliveries ahead of the node's acknowledgements, which the node gives only once
a delivery is written. So nothing the broker accepted is lost, the node's memory stays bounded
however far behind it is, and a node killed with -9 takes up its specs and gets again what it
had not written. The node's client should be made with ``reconnect=True``: it then dials again
when the connection is lost and resumes its subscriptions and offers.

Historic queries routed to the node (``ReplayRequest``) are answered once the node's clock has
passed the request's ``ready_at`` and what was pending is written: one query, its results
streamed back in time order in batches, then ``ReplayEnd`` with the count or the error.

A node may also run SQL in its database for the publications it is sent: its *internal
subscriptions* (``historic.internal``), given by its operator when it starts (never by
``DB_CONTROL``), each applied exactly once per publication, in priority order, a failure going
to the subscription's exception queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from historic.errors import StoreError
from historic.internal import Executor, InternalSubscription
from historic.store import Store, Written
from padres.client.connection import Client, Delivery
from padres.client.replay import responder
from padres.errors import ConnectionLost, ParseError, RequestFailed
from padres.language.parser import parse_filter
from padres.model.messages import Filter, Publication
from padres.model.printer import format_filter
from padres.model.protocol import Notify, ReplayRequest
from padres.runtime.backoff import Backoff

__all__ = ["CONTROL", "STATUS", "Counts", "DatabaseNode", "Writer"]

log = logging.getLogger("padres.db")

CONTROL: Final = "DB_CONTROL"
STATUS: Final = "DB_STATUS"
MAX_WAIT: Final = 10.0
"""A request's ``ready_at`` further ahead than this (a skewed clock) is not waited for."""


@dataclass(slots=True)
class Counts:
    """What became of the publications a node received.

    ``stored``: written (each publication once); ``set_aside``: refused by the database and
    kept in its ``rejected`` table with the reason; ``dropped``: lost, with a log line (the
    database refused even to set one aside); ``failed``: writes that failed and were tried
    again (the database was unreachable or busy).
    """

    stored: int = 0
    set_aside: int = 0
    dropped: int = 0
    failed: int = 0

    def add(self, written: Written) -> None:
        self.stored += written.stored
        self.set_aside += written.set_aside
        self.dropped += written.dropped


Done = Callable[[], None]
"""Called once a publication is written: the node acknowledges its delivery."""


class Writer:
    """Writes publications to a store in batches, off the event loop (see the module docstring).

    ``put`` is called on the event loop for each publication, with what to call once it is
    written; ``run`` writes in the background until cancelled; ``flush`` writes what is
    waiting now; ``close`` writes the rest, once. What waits is bounded by the sender: a
    node's broker sends at most a window of deliveries ahead of the node's acknowledgements.
    """

    def __init__(
        self,
        store: Store,
        name: str,
        *,
        batch: int = 500,
        most: int = 10_000,
        flush_every: float = 0.1,
    ) -> None:
        self.store = store
        self.name = name
        self.batch = batch
        self.most = max(batch, most)
        self.flush_every = flush_every
        self.counts = Counts()
        self._pending: deque[tuple[Publication, Done | None]] = deque()
        self._writing: list[tuple[Publication, Done | None]] = []
        """The batch taken from ``_pending`` and not yet written: kept until the store has it."""
        self._full = asyncio.Event()
        self._lock = asyncio.Lock()

    @property
    def waiting(self) -> int:
        """Publications received and not yet written."""
        return len(self._pending) + len(self._writing)

    def put(self, pub: Publication, done: Done | None = None) -> None:
        self._pending.append((pub, done))
        if len(self._pending) >= self.batch:
            self._full.set()

    async def run(self) -> None:
        """Write every ``flush_every`` s, or sooner when a batch is full, until cancelled."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._full.wait(), self.flush_every)
            self._full.clear()
            await self.flush()

    async def flush(self) -> None:
        """Write what is waiting now (not what arrives meanwhile), in transactions of at most
        ``most`` publications, each tried again until the store takes it."""
        async with self._lock:
            left = len(self._pending)
            while self._writing or left:
                if not self._writing:
                    take = min(self.most, left)
                    self._writing = [self._pending.popleft() for _ in range(take)]
                    left -= take
                await self._write(self._writing)
                _written(self._writing)
                self._writing = []

    async def _write(self, chunk: list[tuple[Publication, Done | None]]) -> None:
        pubs = [pub for pub, _ in chunk]
        backoff = Backoff()
        while True:
            try:
                self.counts.add(await asyncio.to_thread(self.store.write, pubs))
                return
            except Exception as exc:  # never fatal: the batch is kept and tried again
                self.counts.failed += 1
                delay = backoff.next()
                log.warning(
                    "%s: writing %d publications failed, trying again in %.1f s: %s",
                    self.name,
                    len(chunk),
                    delay,
                    exc,
                    exc_info=not isinstance(exc, StoreError),  # a surprise: show where
                )
            await asyncio.sleep(delay)

    def close(self) -> None:
        """Write what is waiting, once, on the caller's thread (at shutdown, after ``run`` is
        cancelled). What the database cannot take now stays unacknowledged: the broker sends
        it again when the node comes back."""
        rest = self._writing + list(self._pending)
        self._writing, self._pending = [], deque()
        for start in range(0, len(rest), self.most):
            chunk = rest[start : start + self.most]
            try:
                self.counts.add(self.store.write([pub for pub, _ in chunk]))
            except Exception as exc:
                self.counts.failed += 1
                log.warning(
                    "%s: %d publications not written at shutdown (the broker keeps them): %s",
                    self.name,
                    len(rest) - start,
                    exc,
                )
                return
            _written(chunk)


def _written(chunk: list[tuple[Publication, Done | None]]) -> None:
    for _, done in chunk:
        if done is not None:
            done()


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
        internal: Sequence[InternalSubscription] = (),
    ) -> None:
        """``internal``: the statements to run for the publications that match them
        (``historic.internal``); the node's client then takes one broker's URL."""
        self.id = db_id
        self.client = client
        self.store = store
        self.executor = Executor(client, store.engine, internal)
        """Runs the internal subscriptions."""
        self.batch = batch
        self.writer = Writer(store, db_id, batch=batch, flush_every=flush_every)
        self.specs: dict[str, str] = {}
        """Normalized spec text -> the id of its subscription (and of its replay offer)."""
        self._replies = 0
        self._flusher: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.name = "store"
        self.replies = responder(client, db_id, batch=batch)
        """Answers the historic queries routed here, from the store (a ``ReplaySource``)."""
        self.replies.add(self)

    @property
    def replayed(self) -> int:
        """Publications sent in answers to historic queries so far."""
        return self.replies.replayed

    @property
    def counts(self) -> Counts:
        return self.writer.counts

    async def start(self) -> None:
        await self.client.advertise(
            f"[class,eq,'{STATUS}'],[db,eq,'{self.id}'],[request,isPresent,''],"
            "[ok,isPresent,true],[detail,isPresent,''],[specs,isPresent,''],"
            "[stored,isPresent,0],[set_aside,isPresent,0],[failed,isPresent,0],"
            "[dropped,isPresent,0]"
        )
        await self.client.subscribe(
            f"[class,eq,'{CONTROL}'],[db,eq,'{self.id}'],[command,isPresent,'']",
            self._on_control,
            durable="control",
        )
        await self.client.subscribe(  # PADRES' words: [database_id,'socket://host:port/<id>']
            f"[class,eq,'{CONTROL}'],[database_id,str-postfix,'{self.id}'],[command,isPresent,'']",
            self._on_control,
            durable="control-padres",
        )
        self._flusher = asyncio.get_running_loop().create_task(self.writer.run())
        for spec in await asyncio.to_thread(self.store.specs):
            await self.store_spec(spec)
        await self.executor.start()

    async def stop(self) -> None:
        await self.executor.stop()
        for task in list(self._tasks):
            task.cancel()
        await self.replies.stop()
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        self.writer.close()
        c = self.counts
        log.info(
            "%s: stored %d, set aside %d, dropped %d; %d failed writes",
            self.id,
            c.stored,
            c.set_aside,
            c.dropped,
            c.failed,
        )

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- storing -----------------------------------------------------------------------------

    def _on_publication(self, delivery: Delivery) -> None:
        """A delivery of one spec's durable subscription (a publication matching several
        specs comes once per spec; the store keeps it once)."""
        if isinstance(delivery, Notify):
            name, seq = delivery.subscriptions[0], delivery.seq
            self.writer.put(delivery.publication, lambda: self.client.ack(name, seq))

    # -- replay ------------------------------------------------------------------------------

    async def ready(self, request: ReplayRequest) -> None:
        """What arrived before the request's ``ready_at`` is in the store before it is read."""
        await asyncio.sleep(min(max(0.0, request.ready_at - time.time()), MAX_WAIT))
        await self.writer.flush()

    def stream(self, flt: Filter, size: int) -> Iterator[list[Publication]]:
        window = flt.window
        return self.store.stream(
            flt,
            since=window.start if window else None,
            until=window.end if window else None,
            size=size,
        )

    # -- control -----------------------------------------------------------------------------

    def _on_control(self, delivery: Delivery) -> None:
        if isinstance(delivery, Notify):
            self._spawn(self._command(delivery.publication))

    async def _command(self, pub: Publication) -> None:
        try:
            await self._obey(pub)
        except (ConnectionLost, RequestFailed, TimeoutError) as exc:
            log.warning("%s: command %s failed: %s", self.id, pub.id, exc)

    def addressed(self, pub: Publication) -> bool:
        """Whether a control publication names this node: ``[db,'<id>']``, or PADRES'
        ``[database_id,'<id>']`` or ``[database_id,'socket://host:port/<id>']``."""
        attrs = pub.attributes
        name = attrs.get("database_id")
        if not isinstance(name, str):
            return attrs.get("db") == self.id
        return name == self.id or name.endswith("/" + self.id)

    async def _obey(self, pub: Publication) -> None:
        if not self.addressed(pub):
            return
        attrs = pub.attributes
        command = attrs.get("command")
        command = command.upper() if isinstance(command, str) else command  # PADRES: any case
        request = str(attrs.get("request", pub.id))
        spec_text = attrs.get("spec", attrs.get("content_spec"))
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
        if spec in self.specs:
            return
        name = "store-" + hashlib.sha256(spec.encode()).hexdigest()[:16]
        await self.client.subscribe(spec, self._on_publication, durable=name, auto_ack=False)
        await self.client.offer_replay(spec, id=name)
        self.specs[spec] = name
        await asyncio.to_thread(self.store.keep_spec, spec, True)

    async def _stop(self, request: str, spec: str) -> None:
        sid = self.specs.pop(spec, None)
        if sid is None:
            await self._reply(request, False, f"not storing {spec}")
            return
        await self.client.unsubscribe(sid)
        await self.client.unadvertise(sid)
        await asyncio.to_thread(self.store.keep_spec, spec, False)
        await self.writer.flush()
        await self._reply(request, True, f"stopped storing {spec}")

    async def _reply(self, request: str, ok: bool, detail: str) -> None:
        self._replies += 1
        c = self.counts
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
                    "stored": c.stored,
                    "set_aside": c.set_aside,
                    "failed": c.failed,
                    "dropped": c.dropped,
                },
                datetime.now(UTC),
            )
        )
