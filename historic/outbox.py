"""Publishing from the application's own database transaction: a transactional outbox.

An application that writes to its database and publishes about it must not publish what it
rolls back, nor lose a publication when it dies after committing. So it does not publish
directly: it records the publication in an outbox table *in the same transaction* as its own
writes, and a relay publishes what was committed::

    outbox = TransactionalOutbox(engine)          # the application's own database
    outbox.create()                               # the table, if it is not there yet
    with engine.begin() as conn:                  # or a Session
        conn.execute(orders.insert().values(id=7, price=120))
        outbox.add(conn, {"class": "Order", "id": 7, "price": 120})

    async with OutboxRelay(outbox, "ws://127.0.0.1:8001", "shop-outbox",
                           advertisements=["[class,eq,'Order'],[id,isPresent,0],..."]) as relay:
        ...                                       # it relays in the background
        await relay.relay()                       # or now

A row becomes visible to the relay when (and if) the transaction commits. The relay publishes
each row as a *guaranteed* publication under the id stored in the row, as the same client
(``name``) at the same broker every time, and deletes the rows only once the broker has
acknowledged them (``Client.flush``). A relay that dies in between sends them again when it
starts; the broker's journal recognises a publication by its publisher and id and routes it
once. So each committed publication reaches every matching durable subscription exactly once,
and a rolled-back one never. Rows the broker refuses (conforming to none of the relay's
advertisements, say), and rows that hold no valid publication, stay in the table with the
reason (``refused``) and hold back no others. Rules (``historic.rules``) write rows too: a
table's changes, from database triggers.

One relay per outbox table: two relays under the same name cannot both connect to a broker,
and under different names they would publish the same rows twice. The broker recognises a
publication sent again for as long as its journal keeps it (``padres.broker.journal.RETENTION``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Final, NamedTuple

import orjson
from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Engine,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from historic.errors import OutboxError
from padres.client.connection import Client, ClientState
from padres.errors import PadresError
from padres.language.parser import parse_publication
from padres.model.codec import from_dict, to_dict
from padres.model.messages import Filter, Publication
from padres.model.protocol import Error
from padres.runtime.backoff import Backoff
from rete.operators import Value

__all__ = ["OUTBOX_TABLE", "OutboxRelay", "Refusal", "TransactionalOutbox"]

log = logging.getLogger("historic.outbox")

OUTBOX_TABLE: Final = "padres_outbox"
"""The outbox table's name unless another is given."""


class Refusal(NamedTuple):
    """A row of the outbox that was not published, and why."""

    id: str
    publication: Publication | None
    """None when the row holds no valid publication."""
    reason: str


class TransactionalOutbox:
    """An outbox table in the application's database (see the module docstring)."""

    def __init__(
        self, engine: Engine | str, *, table: str = OUTBOX_TABLE, schema: str | None = None
    ) -> None:
        """``engine``: the application's database (an engine or its URL); ``schema``: where the
        table is (the connection's default schema when None)."""
        self.engine = create_engine(engine) if isinstance(engine, str) else engine
        self.metadata = MetaData(schema=schema)
        self.table = Table(
            table,
            self.metadata,
            Column("seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
            Column("id", String(256), nullable=False, unique=True),
            Column("body", Text, nullable=False),
            Column("created", Float, nullable=False),
            Column("refused", Text, nullable=True),
        )

    def create(self) -> None:
        """Create the table if it is not there (the application may create it with its own
        tables instead: ``self.metadata``)."""
        with self._storage("create the outbox table"):
            self.metadata.create_all(self.engine)

    def add(
        self,
        transaction: Connection | Session,
        publication: Publication | Mapping[str, Value] | str,
        *,
        id: str | None = None,
    ) -> str:
        """Record ``publication`` (a ``Publication``, attributes, or PADRES text) in the
        application's open ``transaction``: it is published if and once that commits. Returns
        its id: ``id``, the publication's own, or a new unique one. An id must never be used
        twice (``OutboxError`` if it is in the outbox now)."""
        pub = _publication(publication, id)
        row = {
            "id": pub.id,
            "body": orjson.dumps(to_dict(pub)).decode(),
            "created": time.time(),
        }
        try:
            transaction.execute(insert(self.table).values(row))
        except IntegrityError as exc:
            raise OutboxError(f"publication id {pub.id!r} is in the outbox already") from exc
        except SQLAlchemyError as exc:
            raise OutboxError(f"cannot add to the outbox: {exc}") from exc
        return pub.id

    def pending(self, limit: int) -> list[tuple[int, Publication]]:
        """Up to ``limit`` committed rows to publish, oldest first, with their row numbers. A
        row that holds no valid publication (a rule's trigger, ``historic.rules``, wrote a
        string longer than a publication may hold, say) is marked refused, saying why, and
        holds back no other."""
        query = (
            select(self.table.c.seq, self.table.c.body)
            .where(self.table.c.refused.is_(None))
            .order_by(self.table.c.seq)
            .limit(limit)
        )
        while True:
            with self._storage("read the outbox"), self.engine.connect() as conn:
                rows = conn.execute(query).all()
            good: list[tuple[int, Publication]] = []
            bad: dict[int, str] = {}
            for seq, body in rows:
                try:
                    good.append((int(seq), _decoded(body)))
                except (ValueError, OutboxError) as exc:  # DecodeError, orjson's error
                    bad[int(seq)] = f"not a valid publication: {exc}"
            if not bad:
                return good
            log.error("%s: %d rows hold no valid publication", self.table.fullname, len(bad))
            self.mark((), bad)
            if good:
                return good

    def mark(self, published: Sequence[int], refused: Mapping[int, str]) -> None:
        """Delete the rows ``published`` (acknowledged by the broker); mark those ``refused``
        with the broker's reason. One transaction."""
        with self._storage("update the outbox"), self.engine.begin() as conn:
            if published:
                conn.execute(delete(self.table).where(self.table.c.seq.in_(published)))
            for seq, why in refused.items():
                conn.execute(update(self.table).where(self.table.c.seq == seq).values(refused=why))

    def refused(self) -> list[Refusal]:
        """The rows refused, by the broker or as no valid publication, with the reasons (they
        stay until removed)."""
        query = (
            select(self.table.c.id, self.table.c.body, self.table.c.refused)
            .where(self.table.c.refused.is_not(None))
            .order_by(self.table.c.seq)
        )
        with self._storage("read the outbox"), self.engine.connect() as conn:
            rows = conn.execute(query).all()
        out = []
        for ident, body, why in rows:
            try:
                publication: Publication | None = _decoded(body)
            except (ValueError, OutboxError):
                publication = None
            out.append(Refusal(str(ident), publication, str(why)))
        return out

    def count(self) -> int:
        """Rows waiting to be published (refused ones not counted)."""
        query = select(func.count()).where(self.table.c.refused.is_(None))
        with self._storage("read the outbox"), self.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    @contextlib.contextmanager
    def _storage(self, doing: str) -> Iterator[None]:
        try:
            yield
        except SQLAlchemyError as exc:
            raise OutboxError(f"cannot {doing} ({self.table.fullname}): {exc}") from exc


class OutboxRelay:
    """Publishes what an outbox holds, in the background and on demand (see the module
    docstring). Use it as an async context manager, or ``start`` and ``stop`` it."""

    def __init__(
        self,
        outbox: TransactionalOutbox,
        url: str,
        name: str,
        *,
        advertisements: Sequence[str | Filter] = (),
        interval: float = 1.0,
        batch: int = 500,
        timeout: float = 30.0,
        **client_options: Any,
    ) -> None:
        """``name``: the relay's client name, the same every time (its publications are
        recognised by it); ``advertisements``: what it publishes (advertised at the start and
        after every reconnection); ``interval``: seconds between two looks at the outbox in
        the background (``wake`` looks at once); ``batch``: rows published at a time;
        ``timeout``: seconds to wait for the broker's acknowledgements; ``client_options``: for
        its ``Client`` (credentials, ``tls_ca``)."""
        self.outbox = outbox
        self.url = url
        self.name = name
        self._options = client_options
        self.client = self._client()
        self.advertisements = list(advertisements)
        self.interval = interval
        self.batch = batch
        self.timeout = timeout
        self.published = 0
        """Publications acknowledged by the broker so far (counted again if sent again)."""
        self._refused: dict[str, str] = {}
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> OutboxRelay:
        """Connect, advertise, and relay in the background, starting with what an earlier
        run left. It may be called again after it failed (the broker may still hold the
        session of a relay of the same name that died a moment ago, say)."""
        if self.client.state is ClientState.CLOSED:
            self.client = self._client()
        await self.client.connect()
        try:
            for number, flt in enumerate(self.advertisements, 1):
                await self.client.advertise(flt, id=f"outbox-{number}")
        except BaseException:
            await self.client.close()
            raise
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.client.close()

    async def __aenter__(self) -> OutboxRelay:
        return await self.start()

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    def _client(self) -> Client:
        return Client(self.url, self.name, reconnect=True, on_error=self._refusal, **self._options)

    def wake(self) -> None:
        """Look at the outbox now (after a commit, say) rather than at the next interval."""
        self._wake.set()

    async def relay(self) -> int:
        """Publish every committed row now, until none is left; returns how many the broker
        acknowledged. Raises ``OutboxError``, ``TimeoutError`` (no acknowledgement in time:
        the rows stay and go again) or the client's errors."""
        total = 0
        async with self._lock:
            while True:
                rows = await asyncio.to_thread(self.outbox.pending, self.batch)
                if not rows:
                    return total
                self._refused.clear()
                await self.client.publish_many([pub for _, pub in rows], guaranteed=True)
                await self.client.flush(self.timeout)
                refused = {
                    seq: self._refused[pub.id] for seq, pub in rows if pub.id in self._refused
                }
                published = [seq for seq, _ in rows if seq not in refused]
                await asyncio.to_thread(self.outbox.mark, published, refused)
                total += len(published)
                self.published += len(published)

    async def _run(self) -> None:
        backoff = Backoff(first=min(1.0, self.interval), most=max(30.0, self.interval))
        while True:
            try:
                await self.relay()
            except (PadresError, TimeoutError) as exc:
                log.warning("%s: relaying failed, trying again: %s", self.name, exc)
                await backoff.wait()
                continue
            backoff.reset()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval)
            self._wake.clear()

    def _refusal(self, error: Error) -> None:
        log.error("%s: the broker refused %s: %s", self.name, error.ref, error.text)
        self._refused[error.ref] = error.text


def _publication(
    publication: Publication | Mapping[str, Value] | str, id: str | None
) -> Publication:
    ident = id or uuid.uuid4().hex
    now = datetime.now(UTC)
    if isinstance(publication, Publication):
        if id is None:
            return publication
        return Publication(id, publication.attributes, publication.timestamp, "")
    if isinstance(publication, str):
        return parse_publication(publication, id=ident, timestamp=now)
    return Publication(ident, dict(publication), now, "")


def _decoded(body: Any) -> Publication:
    message = from_dict(orjson.loads(body))
    if not isinstance(message, Publication):
        raise OutboxError("the outbox holds something other than a publication")
    return message
