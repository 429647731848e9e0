"""Consuming into the application's own database transaction: atomic consumption.

A consumer that writes each delivery to its database and acknowledges it after its commit
processes a delivery twice when it dies between the two; one that acknowledges first loses it.
An ``AtomicConsumer`` does neither: the application's writes and the record of what it consumed
(its client, its durable subscription and the delivery's number there) commit in *one*
transaction of the application's database, and on a restart the consumer tells the broker the
number it finds there (``Durable.acked``), after which the broker resumes::

    inbox = TransactionalInbox(engine)            # the application's own database
    inbox.create()                                # the positions table, if not there yet

    def apply(conn: Connection, note: Notify) -> None:   # runs inside the transaction
        conn.execute(orders.insert().values(n=note.publication.attributes["n"]))

    async with Client(url, "warehouse", reconnect=True) as client:
        async with AtomicConsumer(client, inbox, "orders", "[class,eq,'Order']", apply):
            ...                                   # consumes in the background

In the transaction the consumer locks the subscription's row, skips a delivery whose number is
at or below the one recorded (sent again because its acknowledgement was lost), calls the
handler, and records the number; the broker is told once the transaction has committed. So a
crash anywhere leaves the database with the delivery applied and recorded, or neither, and the
broker never resumes past what is recorded: each delivery has exactly one effect, in order.

Deliveries replayed from the subscription's exception queue carry no number; those of guaranteed
publications are recognised by their producer and number (``Publication.origin``), kept per
producer as ranges in the same row (``padres.model.producers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final

import orjson
from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Engine,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    insert,
    inspect,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from historic.errors import InboxError
from padres.client.connection import Client, Delivery, SubscriptionHandle
from padres.client.handling import MOST_BACKOFF, Sequencer
from padres.model.messages import Filter, Origin
from padres.model.producers import Ranges, ranges_of, take
from padres.model.protocol import Notify, Scope, Visibility
from padres.runtime.backoff import Backoff

__all__ = ["INBOX_TABLE", "AtomicConsumer", "Position", "TransactionalInbox"]

log = logging.getLogger("padres.inbox")

INBOX_TABLE: Final = "padres_inbox"
"""The positions table's name unless another is given."""

Apply = Callable[[Any, Notify], None]
"""The application's handler: ``(transaction, delivery)``; the transaction is a ``Connection``,
or a ``Session`` for a consumer made with ``session=True``. It runs on a worker thread."""


@dataclass
class Position:
    """What a consumer has consumed of a durable subscription: the broker where it lives, the
    last delivery number applied there, and the guaranteed publications applied, by producer."""

    broker: str
    seq: int = 0
    taken: Ranges = field(default_factory=dict)


class TransactionalInbox:
    """The table of consumers' positions in the application's database (see the module)."""

    def __init__(
        self, engine: Engine | str, *, table: str = INBOX_TABLE, schema: str | None = None
    ) -> None:
        """``engine``: the application's database (an engine or its URL); ``schema``: where the
        table is (the connection's default schema when None)."""
        self.engine = create_engine(engine) if isinstance(engine, str) else engine
        self.metadata = MetaData(schema=schema)
        self.table = Table(
            table,
            self.metadata,
            Column("consumer", String(256), primary_key=True),
            Column("subscription", String(256), primary_key=True),
            Column("broker", String(256), nullable=False),
            Column("seq", BigInteger, nullable=False),
            Column("taken", Text, nullable=False),
        )

    def create(self) -> None:
        """Create the table if it is not there (or create it with the application's tables:
        ``self.metadata``)."""
        with self._storage("create the inbox table"):
            self.metadata.create_all(self.engine)

    def exists(self) -> bool:
        """Whether the table is there."""
        with self._storage("look for the inbox table"), self.engine.connect() as conn:
            return inspect(conn).has_table(self.table.name, self.metadata.schema)

    def position(self, consumer: str, subscription: str, broker: str) -> Position:
        """Where ``consumer`` stands in ``subscription``: the row, made now (at ``broker``)
        if there is none."""
        key = self._key(consumer, subscription)
        with self._storage("read the inbox"), self.engine.begin() as conn:
            row = conn.execute(select(self.table).where(key)).one_or_none()
            if row is not None:
                return _position(row)
        start = {"consumer": consumer, "subscription": subscription, "broker": broker}
        try:
            with self.engine.begin() as conn:
                conn.execute(insert(self.table).values(**start, seq=0, taken="{}"))
        except IntegrityError:  # made meanwhile by another process: read it
            return self.position(consumer, subscription, broker)
        except SQLAlchemyError as exc:
            raise InboxError(f"cannot write the inbox ({self.table.fullname}): {exc}") from exc
        return Position(broker)

    def consume(
        self, transaction: Connection | Session, consumer: str, subscription: str, note: Notify
    ) -> bool:
        """In the application's open ``transaction``: whether ``note`` is new to ``consumer``'s
        ``subscription`` (its row locked until the transaction ends); if it is, it is recorded
        as consumed, committed with the transaction."""
        key = self._key(consumer, subscription)
        with self._storage("update the inbox"):
            row = transaction.execute(select(self.table).where(key).with_for_update()).one()
            position = _position(row)
            origin = note.publication.origin
            if note.seq and note.seq <= position.seq:
                return False
            if isinstance(origin, Origin) and not take(position.taken, origin.producer, origin.seq):
                return False
            values: dict[str, object] = {"taken": orjson.dumps(position.taken).decode()}
            if note.seq:
                values["seq"] = note.seq
            transaction.execute(update(self.table).where(key).values(values))
            return True

    def subscriptions(self, consumer: str) -> list[str]:
        """The subscriptions ``consumer`` has a row for, by name."""
        query = select(self.table.c.subscription).where(self.table.c.consumer == consumer)
        with self._storage("read the inbox"), self.engine.begin() as conn:
            return sorted(str(name) for (name,) in conn.execute(query))

    def forget(self, consumer: str, subscription: str) -> None:
        """Drop ``consumer``'s row for ``subscription`` (it unsubscribed for good)."""
        with self._storage("update the inbox"), self.engine.begin() as conn:
            conn.execute(self.table.delete().where(self._key(consumer, subscription)))

    def _key(self, consumer: str, subscription: str) -> Any:
        c = self.table.c
        return (c.consumer == consumer) & (c.subscription == subscription)

    @contextlib.contextmanager
    def _storage(self, doing: str) -> Iterator[None]:
        try:
            yield
        except SQLAlchemyError as exc:
            raise InboxError(f"cannot {doing} ({self.table.fullname}): {exc}") from exc


class AtomicConsumer:
    """Consumes a durable subscription into the application's database, each delivery in one
    transaction with the record of it (see the module). Use it as an async context manager, or
    ``start`` and ``stop`` it."""

    def __init__(
        self,
        client: Client,
        inbox: TransactionalInbox,
        subscription: str,
        flt: str | Filter,
        handler: Apply,
        *,
        session: bool = False,
        visibility: Visibility | str = Visibility.ON_COMMIT,
        retries: int = 3,
        backoff: float = 0.1,
        priority: int = 0,
        scope: Scope | str = Scope.GLOBAL,
        transient: Callable[[Exception], bool] | None = None,
        sequencer: Sequencer | None = None,
    ) -> None:
        """``client``: connected, made with ``reconnect=True`` to survive its broker's
        restarts, one broker URL (the subscription lives there); ``subscription``: the durable
        subscription's name, with ``flt``, ``visibility``, ``priority`` and ``scope``;
        ``handler``: the application's writes for one delivery, given the transaction (a
        ``Session`` if ``session``, else a ``Connection``). A handler or transaction that
        fails is tried again ``retries`` times after ``backoff`` seconds, doubling, then the
        delivery goes to the subscription's exception queue (``padres.client.handling``).
        ``transient``: which failures are not the delivery's (the database is unreachable,
        say): the delivery is tried again after a backoff for as long as they last, without
        counting them. ``sequencer``: consumers given the same one apply one delivery at a
        time, in the order the deliveries arrived (``padres.client.handling``: a delivery
        waiting out a transient failure holds back the others)."""
        self.client = client
        self.inbox = inbox
        self.subscription = subscription
        self.filter = flt
        self.handler = handler
        self.session = session
        self.visibility = Visibility(visibility)
        self.retries = retries
        self.backoff = backoff
        self.priority = priority
        self.scope = Scope(scope)
        self.transient = transient
        self.sequencer = sequencer
        self.waited = 0
        """Transient failures waited out so far."""
        self.applied = 0
        """Deliveries applied by this consumer (not counting those found applied already)."""
        self.skipped = 0
        """Deliveries found applied already (sent again after a lost acknowledgement)."""
        self.handle: SubscriptionHandle | None = None

    async def start(self) -> AtomicConsumer:
        """Read where the consumer stands and make (or resume) the subscription after it;
        ``InboxError`` if the subscription lives at another broker than the client's, or if
        the client may fail over to other brokers."""
        client = self.client
        if len(client.urls) > 1:  # a move would number its deliveries anew
            raise InboxError(
                f"an atomic consumer resumes its subscription at one broker: give client "
                f"{client.name} one broker's URL, not {len(client.urls)}"
            )
        position = await asyncio.to_thread(
            self.inbox.position, client.name, self.subscription, client.broker
        )
        if position.broker != client.broker:
            raise InboxError(
                f"subscription {self.subscription!r} of {client.name} lives at broker "
                f"{position.broker}, not at {client.broker}: connect to it there"
            )
        self.handle = await client.subscribe(
            self.filter,
            self._consume,
            durable=self.subscription,
            retries=self.retries,
            backoff=self.backoff,
            visibility=self.visibility,
            after=position.seq,
            priority=self.priority,
            scope=self.scope,
            sequencer=self.sequencer,
        )
        return self

    async def stop(self) -> None:
        """Stop consuming (the subscription stays at the broker, to resume)."""
        if self.handle is not None:
            if self.handle.handler is not None:
                self.handle.handler.stop()
            self.handle = None

    async def __aenter__(self) -> AtomicConsumer:
        return await self.start()

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def _consume(self, note: Delivery) -> None:
        if not isinstance(note, Notify):
            raise TypeError(f"a durable subscription delivers publications, not {note!r}")
        backoff = Backoff(self.backoff, max(self.backoff, MOST_BACKOFF))
        while True:
            try:
                applied = await asyncio.to_thread(self._apply, note)
                break
            except Exception as exc:
                if self.transient is None or not self.transient(exc):
                    raise
                self.waited += 1
                delay = backoff.next()
                log.warning(
                    "%s: subscription %s: %s; trying again in %.1f s",
                    self.client.name,
                    self.subscription,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)
        if applied:
            self.applied += 1
        else:
            self.skipped += 1

    def _apply(self, note: Notify) -> bool:
        """One delivery in one transaction: whether it was applied (else it was already)."""
        name, sub = self.client.name, self.subscription
        engine = self.inbox.engine
        if self.session:
            with Session(engine) as session, session.begin():
                if not self.inbox.consume(session, name, sub, note):
                    return False
                self.handler(session, note)
                return True
        with engine.begin() as conn:
            if not self.inbox.consume(conn, name, sub, note):
                return False
            self.handler(conn, note)
            return True


def _position(row: Any) -> Position:
    taken = orjson.loads(row.taken)
    return Position(str(row.broker), int(row.seq), ranges_of(taken))
