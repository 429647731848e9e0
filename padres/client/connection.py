"""The Python client: ``Client`` (asyncio) and ``BlockingClient`` (for plain code).

::

    async with Client("ws://127.0.0.1:8001", name="manager") as c:
        await c.advertise("[class,eq,'Order'],[price,isPresent,0]")
        sub = await c.subscribe("[class,eq,'Order'],[price,>,100]")
        await c.publish("[class,'Order'],[price,120]")
        async for note in sub:          # or subscribe(..., callback=f)
            print(note.publication)

Requests (advertise, subscribe, unsubscribe, ...) wait for the broker's ``ok`` and raise
``RequestFailed`` with its reason otherwise. ``advertise`` returns once the advertisement has
reached every broker and the subscriptions overlapping it are back at this client's broker;
``subscribe`` once the subscription has reached the broker of every overlapping advertisement:
what is published afterwards finds its way (a link lost on the way is logged as a warning).
Publishing does not wait; a refused publication (one matching none of the client's
advertisements, say) reaches ``on_error``, and plain publications a broker dropped on a link
that failed (``Lost``) reach ``on_lost`` (a warning by default) and are counted in ``lost``. A
lost connection fails pending requests with ``ConnectionLost`` and ends every subscription's
iterator, unless the client was made with ``reconnect=True``: then it dials again and makes its
advertisements and subscriptions again, and the subscriptions go on (what was published while
it was away is not replayed, except to a historic or hybrid subscription, which asks for the
past again from its latest deliveries on and drops what it had: ``padres.client.resume``);
one the broker now refuses (a schema declared meanwhile, say) is
dropped: a warning is logged, its iterator raises the ``RequestFailed`` (a callback's client gets
it in ``on_error``), and the others go on. A subscription with a time window reaching into the past
(``[time,>=,now-1h]``) first delivers the past from the databases; ``await handle.replayed()``
returns the broker's ``ReplayDone`` when that is complete. A historic subscription (its window
ends in the past) then ends, and so does its iterator. ``transaction()`` groups publications
that subscribers see when they commit, or abort (``padres.client.transaction``). The client's life:
CONNECTING -> OPEN -> CLOSED, and with ``reconnect``, OPEN -> CONNECTING -> OPEN while it
re-connects.

Client-side queues: what the broker delivers waits in its subscription's queue until the
application takes it (``padres.client.pending``), at most ``max_pending`` deliveries and
``max_pending_bytes`` bytes (65,536 and 64 MiB by default; options of the client, and of each
subscription). The connection is read on regardless: when a plain subscription's queue is full,
what comes for it is dropped and counted, and its iterator (or ``get``) raises ``SlowConsumer``
once, where the first was dropped; the other subscriptions do not notice. A durable
subscription's queue never drops: the client acknowledges only what the application has taken,
and the broker sends at most its window (20,000 deliveries, 4 MiB) ahead of the
acknowledgements. Limits below that window would let its queue fill: the client then stops
reading from the broker, for every subscription, until the application has taken some (or a
request waits for its answer: the queue then goes past its limits, by the window at most).
``handle.statistics()`` says what is pending, delivered and dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from enum import Enum
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from msgspec.structs import replace

from padres.client.handling import Handler, Sequencer
from padres.client.outcomes import Outcomes
from padres.client.pending import (
    MAX_PENDING,
    MAX_PENDING_BYTES,
    Pending,
    PendingStatistics,
    check_limits,
)
from padres.client.resume import Seen, Standing, windowed
from padres.client.transaction import BlockingTransaction, Transaction
from padres.client.transport import Dialler, Transport, attached, dial
from padres.errors import (
    AuthenticationError,
    ConnectionLost,
    InvalidMessage,
    PadresError,
    RequestFailed,
    SlowConsumer,
)
from padres.language.parser import parse_composite, parse_filter, parse_publication
from padres.model.classes import AttributeSpec, parse_attributes
from padres.model.messages import (
    Advertisement,
    CompositeSubscription,
    Filter,
    Origin,
    Publication,
    Subscription,
    Unadvertise,
    Unsubscribe,
)
from padres.model.protocol import (
    DURABLE_WINDOW,
    DURABLE_WINDOW_BYTES,
    MAX_FRAME_MESSAGES,
    Ack,
    CompositeNotify,
    DeclareSchema,
    DropSchema,
    Durable,
    Envelope,
    Error,
    ExceptionAction,
    ExceptionEntry,
    ExceptionReport,
    Exceptions,
    Failed,
    GoingAway,
    Guaranteed,
    Lost,
    Notify,
    Ok,
    Outcome,
    Query,
    QueryResult,
    Rejected,
    ReplayBatch,
    ReplayDone,
    ReplayEnd,
    ReplayOffer,
    ReplayRequest,
    Retry,
    Scope,
    Span,
    Subscribe,
    TxEnded,
    TxNotify,
    TxVote,
    Visibility,
    Vote,
    Welcome,
    check_priority,
    decode_frame,
    encode_frame,
    websocket_url,
)
from padres.model.requests import reference
from padres.runtime.backoff import Backoff
from padres.security.accounts import Credentials
from padres.security.tls import client_context, secure

if TYPE_CHECKING:
    from padres.runtime.node import BrokerNode
    from padres.security.accounts import Account

__all__ = [
    "BlockingClient",
    "Client",
    "ClientState",
    "ConnectionLost",
    "Delivery",
    "PendingStatistics",
    "RequestFailed",
    "SlowConsumer",
    "SubscriptionHandle",
]

log = logging.getLogger("padres.client.connection")

Delivery = Notify | CompositeNotify
WhenFull = Literal["drop", "wait"]
"""What a plain subscription does when its queue in the client is full: drop what comes
(counted, and told by ``SlowConsumer``), or keep it as a durable subscription does, the client
then reading nothing more from the broker until the application has taken some."""
_T = TypeVar("_T")


class ClientState(Enum):
    CONNECTING = "connecting"
    OPEN = "open"
    CLOSED = "closed"


class SubscriptionHandle:
    """A live subscription: iterate it for deliveries (unless it has a callback).

    A durable one numbers its deliveries (``Notify.seq``): a delivery is acknowledged to the
    broker once the callback has returned or the iterator has handed it out, unless the
    subscription was made with ``auto_ack=False``: then ``ack(seq)`` says what is done, and
    what was not acknowledged when a connection is lost comes again after the reconnect.

    Deliveries wait in the subscription's queue (or its handler's, with ``retries``) until they
    are taken, ``max_pending`` and ``max_pending_bytes`` at most (see the module docstring).
    When a plain subscription's queue is full, what comes is dropped, and iterating or ``get``
    raises ``SlowConsumer`` once, after the deliveries queued before the first loss: raised
    there, like the errors that end a subscription, the loss cannot go unnoticed, and the
    application sees where its gap is; the subscription goes on (iterate it again). With a
    handler the loss is logged; a plain callback runs as deliveries are read, and has no
    queue."""

    def __init__(
        self,
        client: Client,
        ident: str,
        callback: Callable[[Delivery], Any] | None,
        *,
        durable: bool = False,
        auto_ack: bool = True,
        retries: int | None = None,
        backoff: float = 0.1,
        max_pending: int = MAX_PENDING,
        max_pending_bytes: int = MAX_PENDING_BYTES,
        when_full: WhenFull = "drop",
        sequencer: Sequencer | None = None,
    ):
        self.id = ident
        self.durable = durable
        self.auto_ack = auto_ack
        self.incomplete: tuple[str, ...] = ()
        """What the routing of the subscription could not reach when it was made (links lost
        on the way), as the broker said."""
        self.received = 0
        """The last delivery number received (durable subscriptions)."""
        self.done = 0
        """The last delivery number processed: what the broker is told with ``Ack``."""
        self.acked = 0
        """The last delivery number the broker has been told of."""
        self._client = client
        self._callback = callback
        self._keep = durable or when_full == "wait"
        flow = self._flow if self._keep else None
        self._queue: Pending[Delivery | ReplayDone] = Pending(
            ident, max_pending, max_pending_bytes, flow=flow
        )
        self._replayed: asyncio.Future[ReplayDone] = asyncio.get_running_loop().create_future()
        self.error: RequestFailed | None = None
        """Why the subscription ended, if the broker refused to make it again after a
        reconnect: iterating it or ``get`` raises this error once the deliveries are out."""
        self.standing: Standing | None = None
        """Where a durable one stands, so that it can move to another broker with its client
        (``padres.client.resume``)."""
        self.seen: Seen | None = None
        """The latest deliveries received, for one whose window reaches into the past
        (``padres.client.resume``), so that after a reconnect nothing comes twice."""
        self.handler: Handler | None = None
        """What runs the callback, with retries and an exception queue, if ``retries`` was
        given (``padres.client.handling``)."""
        self.members: tuple[str, ...] = ()
        """The subscriptions it stands for at the broker, if made by ``subscribe_many``."""
        if sequencer is not None and retries is None:
            raise ValueError("a sequencer orders the handlers of subscriptions with retries")
        if retries is not None:
            if callback is None or not auto_ack:
                raise ValueError("retries need a callback, and acknowledge by themselves")
            self.handler = Handler(
                client,
                ident,
                callback,
                retries=retries,
                backoff=backoff,
                processed=self.ack,
                max_pending=max_pending,
                max_pending_bytes=max_pending_bytes,
                flow=flow,
                sequencer=sequencer,
            )
        self._direct = callback if self.handler is None else None
        """The callback the read loop hands a plain delivery straight to (not numbered, and
        ``seen`` None), if nothing comes between (no handler with retries); any other delivery
        goes through ``_deliver``."""

    def ack(self, seq: int) -> None:
        """Deliveries up to ``seq`` are processed: the broker may forget them (sent shortly)."""
        self.done = max(self.done, min(seq, self.received))
        if self.standing is not None:
            self.standing.processed(self.done)
        self._client._ack_soon()

    @property
    def replay(self) -> ReplayDone | None:
        """The ``ReplayDone`` of a historic or hybrid subscription, once it has come."""
        return self._replayed.result() if self._replayed.done() else None

    async def replayed(self, timeout: float | None = None) -> ReplayDone:
        """The end of the past of a historic or hybrid subscription: how many deliveries it
        made, which databases answered and which did not finish."""
        return await asyncio.wait_for(asyncio.shield(self._replayed), timeout)

    def resume(self) -> int:
        """Before a durable subscription is made again after a reconnect: what was received
        and not processed is forgotten (the broker sends it again); returns what was."""
        self._queue.keep_only(lambda item: not _after(item, self.done))
        if self.handler is not None:
            self.handler.forget(self.done)
        self.received = self.done
        return self.done

    def again(self, request: Envelope, broker: str) -> Envelope:
        """``request``, which made the subscription, as it is made again after a reconnect to
        ``broker``: a durable one resumes after what was processed, or moves to ``broker``
        if it lives at another (what was received and not processed is forgotten then, and
        its delivery numbers start again); one whose window reaches into the past asks from
        its latest deliveries on (``padres.client.resume``)."""
        if isinstance(request, Durable):
            standing = self.standing
            if standing is None or standing.broker == broker:
                return replace(request, acked=self.resume())
            self.resume()
            self.received = self.done = self.acked = 0
            return replace(request, acked=0, roam=standing.moved(broker))
        if self.seen is not None and isinstance(request, Subscription | Subscribe):
            return self.seen.resumed(request)
        return request

    def statistics(self) -> PendingStatistics:
        """The subscription's queue (its handler's, with ``retries``): what is pending now,
        what was delivered and dropped since it was made, and its limits."""
        if self.handler is not None:
            return self.handler.statistics()
        return self._queue.statistics()

    def _deliver(self, delivery: Delivery, size: int) -> None:
        """A delivery of ``size`` bytes (its encoding) from the broker."""
        if delivery.seq:
            if delivery.seq <= self.received:
                return  # sent again after a reconnect: it was received already
            self.received = delivery.seq
            if self.standing is not None and isinstance(delivery, Notify):
                self.standing.received(delivery.seq, delivery.publication)
        if self.seen is not None and not self.seen.first(delivery):
            return  # asked for again after a reconnect: it was received already
        if self.handler is not None:
            if isinstance(delivery, Notify):
                self.handler.put(delivery, size, keep=self._keep)
            return
        if self._callback is not None:
            self._queue.delivered += 1
            try:
                self._callback(delivery)
            except Exception:
                log.exception("subscription %s: callback failed", self.id)
            if delivery.seq and self.auto_ack:  # as _handed_out
                self.ack(delivery.seq)
        else:
            self._queue.put(delivery, size, keep=self._keep)

    def _replay_done(self, done: ReplayDone) -> None:
        """The end of the past: ``replayed`` returns it, and ``events`` hands it out where it
        came among the deliveries."""
        if not self._replayed.done():
            self._replayed.set_result(done)
        if self._callback is None and self.handler is None:
            self._queue.note(done)

    def _end(self) -> None:
        """The subscription is over: its iterator ends once the queued deliveries are out."""
        if self.handler is not None:
            self.handler.stop()
        self._queue.close()

    def _fail(self, error: RequestFailed) -> None:
        self.error = error
        self._end()

    def _flow(self, room: bool) -> None:
        self._client._flow(self.id, room)

    def _handed_out(self, delivery: Delivery | ReplayDone) -> None:
        if self.auto_ack and not isinstance(delivery, ReplayDone) and delivery.seq:
            self.ack(delivery.seq)

    def __aiter__(self) -> AsyncIterator[Delivery]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Delivery]:
        async for item in self.events():
            if not isinstance(item, ReplayDone):
                yield item

    async def events(self) -> AsyncIterator[Delivery | ReplayDone]:
        """The deliveries, and the ``ReplayDone`` of a historic or hybrid subscription where
        it came among them (after the past, before what is live)."""
        while True:
            item = await self._queue.get()
            if item is None:
                if self.error is not None:
                    raise self.error
                return
            self._handed_out(item)
            yield item

    async def get(self, timeout: float | None = None) -> Delivery:
        """The next delivery: ``TimeoutError`` after ``timeout`` s, ``ConnectionLost`` at end,
        ``SlowConsumer`` once where deliveries were dropped (the next call goes on)."""
        async with asyncio.timeout(timeout):
            while True:
                item = await self._queue.get()
                if item is None:
                    raise self.error or ConnectionLost("the subscription ended")
                if not isinstance(item, ReplayDone):
                    self._handed_out(item)
                    return item

    async def cancel(self) -> None:
        await self._client.unsubscribe(self.id)


def _now() -> datetime:
    return datetime.now(UTC)


class Client:
    """An asyncio client of one broker (see the module docstring)."""

    def __init__(
        self,
        url: str | Sequence[str],
        name: str = "client",
        *,
        on_error: Callable[[Error], Any] | None = None,
        on_lost: Callable[[Lost], Any] | None = None,
        timeout: float = 10.0,
        reconnect: bool = False,
        on_replay: Callable[[ReplayRequest], Any] | None = None,
        max_unacked: int = 10_000,
        user: str = "",
        password: str = "",
        token: str = "",
        tls_ca: str | None = None,
        max_pending: int = MAX_PENDING,
        max_pending_bytes: int = MAX_PENDING_BYTES,
        transport: Dialler | None = None,
        compress: bool = False,
    ) -> None:
        """``on_error``: called with each ``error`` the broker sends that no request waits
        for (a refused publication, say); a warning is logged if None. ``on_lost``: called
        with each ``Lost`` report, plain publications of this client's that a broker dropped
        when its link to another ended (``docs/guarantees.md``); a warning is logged if None,
        and ``lost`` counts them either way.
        ``user`` and ``password``, or ``token``: the credentials a broker with accounts
        wants (``docs/security.md``); a refused hello raises ``AuthenticationError``.
        ``reconnect``: when the connection is lost, dial again (backing off from 0.1 s to
        5 s) and re-make every advertisement and subscription; subscriptions go on, durable
        ones from where they were, and guaranteed publications not yet acknowledged are sent
        again. ``on_replay``: for a database, called with each historic query routed to it.
        ``max_unacked``: guaranteed publications waiting for the broker's acknowledgement at
        most; publishing more waits. ``tls_ca``: for a ``wss://`` URL, the PEM file of the CA
        certificates the broker's certificate is checked against (the system's trusted
        authorities if None). ``max_pending``, ``max_pending_bytes``: a subscription's queue
        holds at most that many deliveries and bytes of them (by their encoding), unless the
        subscription says otherwise (see the module docstring: a plain subscription then
        drops, a durable one makes the client stop reading). ``transport``: how to reach the
        broker, if not by a WebSocket to ``url`` (which then only names the broker in messages;
        see ``attached``). ``compress``: offer the broker permessage-deflate, the WebSocket's
        compression: about ten times fewer bytes each way for a few microseconds of CPU per
        message on both sides; worth it over a WAN or a metered link, not on loopback
        (docs/protocol.md, "Compression").

        ``url``: a broker's endpoint, or several brokers' of one overlay, tried in turn when
        connecting and reconnecting (failing over from one that is lost to the next); the
        one connected to is ``url`` then."""
        check_limits(max_pending, max_pending_bytes)
        urls = [url] if isinstance(url, str) else list(url)
        if transport is None:
            urls = [websocket_url(u) for u in urls]
            tls = client_context(tls_ca) if any(map(secure, urls)) else None
            transport = dial(urls, timeout=timeout, tls=tls, compress=compress)
        self.url = urls[0]
        self.urls = tuple(urls)
        """The brokers it may connect to, in the order tried."""
        self._dial = transport
        self.name = name
        self.credentials = Credentials(user, password, token)
        self.timeout = timeout
        self.reconnect = reconnect
        self.state = ClientState.CONNECTING
        self.session = ""
        self.broker = ""
        self.on_error = on_error or (lambda e: log.warning("broker refused %s: %s", e.ref, e.text))
        self.on_lost = on_lost or self._warn_lost
        self.lost = 0
        """Publications of this client's the brokers have reported lost (``on_lost``)."""
        self._transport: Transport | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[str, asyncio.Future[Envelope]] = {}
        self._queries: dict[str, asyncio.Task[Envelope]] = {}
        """Table queries in flight, shared by the callers asking meanwhile (``query``)."""
        self._subs: dict[str, SubscriptionHandle] = {}
        self._groups: dict[str, SubscriptionHandle] = {}
        """The handles of ``subscribe_many``, also in ``_subs``: their members are not."""
        self._ids = {k: itertools.count(1) for k in ("p", "s", "a", "d", "t")}
        self._welcome: asyncio.Future[Welcome] | None = None
        self._made: dict[tuple[str, str], Envelope] = {}
        """What to make again after reconnecting: ("a" or "s", id) -> the request."""
        self._recovery: asyncio.Task[None] | None = None
        self._leaving: asyncio.Task[None] | None = None
        """Closing this side of a connection whose broker is going away."""
        self.on_replay = on_replay
        self.max_unacked = max_unacked
        self._instance = os.urandom(8).hex()
        """Makes the ids of publications differ from those of an earlier run."""
        self._producer = f"{name}.{self._instance}"
        """This run as the producer of guaranteed publications (``Publication.origin``)."""
        self._sequence = itertools.count(1)
        self._unacked: dict[str, Publication] = {}
        """Guaranteed publications sent and not yet acknowledged, in the order sent."""
        self._transactions: dict[str, Transaction] = {}
        """Transactions begun and not over, by id."""
        self._outcomes = Outcomes()
        """How the transactions delivered to it ended, for those of its own that depend on
        them (``padres.client.outcomes``)."""
        self._room = asyncio.Event()
        self._idle = asyncio.Event()
        self._acking = False
        self._refs = itertools.count(1)
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self._full: set[str] = set()
        """Durable subscriptions whose queue is full: the broker is not read (``_read_on``)."""
        self._reading = asyncio.Event()
        self._reading.set()

    @classmethod
    def attached(
        cls,
        node: BrokerNode,
        name: str = "client",
        *,
        account: Account | None = None,
        trusted: bool = False,
        queue_limit: int | None = None,
        **options: Any,
    ) -> Client:
        """A client of ``node``, a broker node in this process, connected without a socket
        (``padres.client.transport``). ``trusted``: the caller has authenticated whom the
        client acts for, ``account`` (or the broker itself, with no account); else the
        credentials in ``options`` are checked as over a socket. ``queue_limit``: the bytes
        the node may queue for it (by default, as for a socket's client)."""
        label = f"{node.broker.id} (in this process)"
        dialler = attached(node, account, trusted, queue_limit)
        return cls(label, name, transport=dialler, **options)

    def _id(self, kind: str) -> str:
        return f"{kind}{next(self._ids[kind])}"

    # -- lifecycle ---------------------------------------------------------------------------

    async def connect(self) -> Client:
        if self.state is not ClientState.CONNECTING or self._transport is not None:
            raise PadresError(f"client is {self.state.value}; connect() goes once")
        try:
            await self._open()
        except BaseException:
            await self._shut()
            raise
        self.state = ClientState.OPEN
        return self

    async def _open(self) -> None:
        """Dial, say hello, and wait for the welcome."""
        transport = self._transport = await self._dial()
        self.url = transport.url
        self._welcome = asyncio.get_running_loop().create_future()
        self._reader = asyncio.get_running_loop().create_task(self._read(transport))
        await transport.send(encode_frame([self.credentials.hello(self.name)]))
        welcome = await asyncio.wait_for(self._welcome, self.timeout)
        self.session, self.broker = welcome.session, welcome.broker

    async def _recover(self) -> None:
        """Dial again until it works, then make every advertisement and subscription again."""
        backoff = Backoff()
        while self.state is ClientState.CONNECTING:
            try:
                await self._open()
                for key, message in list(self._made.items()):
                    handle = self._subs.get(key[1]) if key[0] == "s" else None
                    if handle is not None:
                        message = handle.again(message, self.broker)
                    try:
                        await self._request(reference(message), message, recovering=True)
                    except RequestFailed as exc:
                        self._refused_again(key, exc)
                self.state = ClientState.OPEN
                self._read_on()
                if self._unacked:  # all of them: some may have been made while reconnecting
                    await self._send([Guaranteed(p) for p in self._unacked.values()])
                log.info("%s: reconnected to %s", self.name, self.url)
                return
            except (
                AuthenticationError,  # its old session may still hold its name for a moment
                ConnectionLost,
                TimeoutError,
            ) as exc:
                log.info("%s: reconnecting to %s: %s", self.name, self.url, exc)
                if self._transport is not None:
                    await self._transport.close()
            await backoff.wait()

    def _refused_again(self, key: tuple[str, str], exc: RequestFailed) -> None:
        """The broker refused to make an advertisement or subscription again after a reconnect
        (say a schema declared meanwhile refuses it): it is forgotten, and a subscription's
        handle ends with the error; the rest goes on."""
        self._made.pop(key, None)
        kind = "advertisement" if key[0] == "a" else "subscription"
        log.warning("%s: %s %s not made again: %s", self.name, kind, key[1], exc)
        handle = self._subs.pop(key[1], None) if key[0] == "s" else None
        if handle is not None:
            handle._fail(exc)
        if handle is None or handle._callback is not None or handle.handler is not None:
            self.on_error(Error(exc.text, key[1]))

    async def close(self) -> None:
        if self.state is not ClientState.CLOSED:
            await self._shut()

    async def _shut(self) -> None:
        try:
            acks = self._due_acks() if self.state is ClientState.OPEN else []
            if acks:  # what was processed is acknowledged, or it comes again when back
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._send(acks), self.timeout)
        finally:  # closed even when cancelled meanwhile
            await self._close_down()

    async def _close_down(self) -> None:
        self.state = ClientState.CLOSED
        self._read_on()  # the reader must see the connection close
        if self._recovery is not None:
            self._recovery.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._recovery
        if self._transport is not None:
            await self._transport.close()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        for handle in self._subs.values():
            handle._end()
        self._subs.clear()
        self._groups.clear()

    async def __aenter__(self) -> Client:
        return await self.connect()

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- requests ----------------------------------------------------------------------------

    async def advertise(self, flt: str | Filter, id: str | None = None) -> str:
        ident = id or self._id("a")
        adv = Advertisement(ident, _filter(flt))
        await self._request(ident, adv)
        self._made["a", ident] = adv
        return ident

    async def offer_replay(
        self, flt: str | Filter, id: str | None = None, period: Span | None = None
    ) -> str:
        """Offer to answer historic queries overlapping ``flt`` and, if ``period`` is given, the
        publication times it spans (``unadvertise`` withdraws)."""
        ident = id or self._id("a")
        offer = ReplayOffer(Advertisement(ident, _filter(flt)), period)
        await self._request(ident, offer)
        self._made["a", ident] = offer
        return ident

    async def answer(self, messages: list[ReplayBatch | ReplayEnd]) -> None:
        """Send a database's answers to historic queries."""
        await self._send(messages)

    async def unadvertise(self, ident: str) -> None:
        await self._request(ident, Unadvertise(ident))
        self._made.pop(("a", ident), None)

    async def subscribe(
        self,
        flt: str | Filter,
        callback: Callable[[Delivery], Any] | None = None,
        id: str | None = None,
        *,
        durable: str | None = None,
        auto_ack: bool = True,
        retries: int | None = None,
        backoff: float = 0.1,
        visibility: Visibility | str = Visibility.ON_COMMIT,
        max_pending: int | None = None,
        max_pending_bytes: int | None = None,
        when_full: WhenFull = "drop",
        after: int = 0,
        priority: int = 0,
        scope: Scope | str = Scope.GLOBAL,
        sequencer: Sequencer | None = None,
    ) -> SubscriptionHandle:
        """Subscribe; ``visibility``: which publications of transactions it sees, and when
        (``on_commit``, ``immediate`` or ``on_abort``: see ``padres.client.transaction``);
        ``priority``: a publication matching several of this client's subscriptions reaches
        them in priority order, higher first, ties in the order they were made once any
        subscription of the client has a priority other than 0 (see
        ``docs/padres.md``); ``scope``: ``local`` sees only the publications of clients of
        this client's broker, ``global`` (the default) every one;
        ``durable``: a durable subscription of that name, kept by the broker
        while this client is away and resumed when a client of the same name makes it again
        (see ``SubscriptionHandle`` for its acknowledgements). ``retries``: a callback that
        raises is called again up to that many times, waiting ``backoff`` seconds and then
        twice as long each time, before the publication goes to the subscription's exception
        queue at the broker (``padres.client.handling``; see ``exceptions``); ``sequencer``:
        the handlers (with ``retries``) of subscriptions given the same one take their
        deliveries one at a time, in the order they arrived, and so in priority order.
        ``max_pending``, ``max_pending_bytes``: the limits of the subscription's queue in the
        client (the client's if None; see ``SubscriptionHandle``). A durable subscription's
        should not be below the broker's window (20,000 deliveries, 4 MiB): when its queue is
        full, the client stops reading from the broker; ``when_full``: what a plain one does
        then (``WhenFull``). ``after``: a durable subscription resumes after that delivery
        number (what its application has already processed, when the client was made anew)."""
        visibility = Visibility(visibility)
        priority, scope = check_priority(priority), Scope(scope)
        limits = self._limits(max_pending, max_pending_bytes)
        if durable is None:
            ident = id or self._id("s")
            sub = Subscription(ident, _filter(flt))
            options = (
                Subscribe(sub, visibility, priority, scope)
                if (visibility, priority, scope) != (Visibility.ON_COMMIT, 0, Scope.GLOBAL)
                else None
            )
            return await self._subscribe(
                sub,
                callback,
                retries=retries,
                backoff=backoff,
                message=options,
                limits=limits,
                when_full=when_full,
                sequencer=sequencer,
            )
        if limits[0] < DURABLE_WINDOW or limits[1] < DURABLE_WINDOW_BYTES:
            log.warning(
                "%s: durable subscription %s may hold %d deliveries and %d bytes, less than "
                "the broker sends ahead of acknowledgements (%d, %d): when it is full, nothing "
                "is read from the broker until the application has taken some",
                self.name,
                durable,
                *limits,
                DURABLE_WINDOW,
                DURABLE_WINDOW_BYTES,
            )
        handle = SubscriptionHandle(
            self,
            durable,
            callback,
            durable=True,
            auto_ack=auto_ack,
            retries=retries,
            backoff=backoff,
            max_pending=limits[0],
            max_pending_bytes=limits[1],
            sequencer=sequencer,
        )
        handle.received = handle.done = handle.acked = after
        return await self._make(
            handle,
            Durable(
                Subscription(durable, _filter(flt)),
                after,
                visibility,
                priority=priority,
                scope=scope,
            ),
        )

    async def subscribe_many(
        self,
        filters: Sequence[str | Filter],
        callback: Callable[[Delivery], Any] | None = None,
        id: str | None = None,
        *,
        max_pending: int | None = None,
        max_pending_bytes: int | None = None,
        when_full: WhenFull = "drop",
    ) -> SubscriptionHandle:
        """Subscribe to ``filters`` as one subscription, ``id``: a publication that matches
        any of them is handed to ``callback`` (or the handle's iterator) once, as a ``Notify``
        naming ``id`` (not which of the filters matched). This is the way to hold many
        filters with one handler: a publication matching several of them costs one delivery,
        not one per filter, at the broker, on the wire and here.

        At the broker each filter is a subscription of its own, ``<id>.<n>`` for the n-th
        (from 0; the handle's ``members``), made in one request of as few frames as the frame
        limit allows, and covered, merged and routed as any other; ``unsubscribe(id)`` ends
        them all. If the broker refuses one, those made are withdrawn and ``RequestFailed`` is
        raised. A filter with a time window is subscribed on its own (``subscribe``); the
        queue options are ``subscribe``'s."""
        ident = id or self._id("s")
        parsed = [_filter(flt) for flt in filters]
        if not parsed:
            raise ValueError("subscribe_many needs at least one filter")
        if any(flt.window is not None for flt in parsed):
            raise ValueError("a filter with a time window is subscribed on its own (subscribe)")
        if ident in self._subs:
            raise RequestFailed(f"subscription {ident!r} already exists", ident)
        limits = self._limits(max_pending, max_pending_bytes)
        handle = SubscriptionHandle(
            self,
            ident,
            callback,
            max_pending=limits[0],
            max_pending_bytes=limits[1],
            when_full=when_full,
        )
        made = [
            Subscribe(Subscription(f"{ident}.{n}", flt), group=ident)
            for n, flt in enumerate(parsed)
        ]
        handle.members = tuple(request.subscription.id for request in made)
        self._subs[ident] = handle
        try:
            replies = await self._requests([(r.subscription.id, r) for r in made])
        except BaseException:
            self._subs.pop(ident, None)
            handle._end()
            with contextlib.suppress(PadresError, TimeoutError):
                await self._requests([(m, Unsubscribe(m)) for m in handle.members])
            raise
        handle.incomplete = tuple(why for reply in replies for why in _incomplete(reply))
        self._groups[ident] = handle
        for request in made:
            self._made["s", request.subscription.id] = request
        return handle

    async def subscribe_composite(
        self,
        expression: str | CompositeSubscription,
        callback: Callable[[Delivery], Any] | None = None,
        id: str | None = None,
        *,
        durable: str | None = None,
        auto_ack: bool = True,
        after: int = 0,
        max_pending: int | None = None,
        max_pending_bytes: int | None = None,
        when_full: WhenFull = "drop",
    ) -> SubscriptionHandle:
        """Subscribe to a composite subscription; ``max_pending``, ``max_pending_bytes``,
        ``when_full``: as for ``subscribe``. ``durable``: a durable composite subscription
        of that name (its id): the broker keeps its partial matches and its matches while
        this client is away, across its own restarts, and numbers its matches
        (``CompositeNotify.seq``), acknowledged as ``subscribe``'s deliveries are
        (``auto_ack``, ``after``)."""
        if isinstance(expression, CompositeSubscription):
            sub = expression if durable is None else replace(expression, id=durable)
        else:
            sub = parse_composite(expression, id=durable or id or self._id("s"))
        limits = self._limits(max_pending, max_pending_bytes)
        if durable is None:
            return await self._subscribe(sub, callback, limits=limits, when_full=when_full)
        handle = SubscriptionHandle(
            self,
            durable,
            callback,
            durable=True,
            auto_ack=auto_ack,
            max_pending=limits[0],
            max_pending_bytes=limits[1],
        )
        handle.received = handle.done = handle.acked = after
        return await self._make(handle, Durable(sub, after))

    def _limits(self, max_pending: int | None, max_pending_bytes: int | None) -> tuple[int, int]:
        """A subscription's queue limits: its own, or the client's."""
        limits = (
            self.max_pending if max_pending is None else max_pending,
            self.max_pending_bytes if max_pending_bytes is None else max_pending_bytes,
        )
        check_limits(*limits)
        return limits

    async def _subscribe(
        self,
        sub: Subscription | CompositeSubscription,
        callback: Callable[[Delivery], Any] | None,
        *,
        retries: int | None = None,
        backoff: float = 0.1,
        message: Subscribe | None = None,
        limits: tuple[int, int],
        when_full: WhenFull = "drop",
        sequencer: Sequencer | None = None,
    ) -> SubscriptionHandle:
        """Make ``sub`` (by ``message``, when it has options) with a queue of ``limits``
        (deliveries, bytes)."""
        handle = SubscriptionHandle(
            self,
            sub.id,
            callback,
            retries=retries,
            backoff=backoff,
            max_pending=limits[0],
            max_pending_bytes=limits[1],
            when_full=when_full,
            sequencer=sequencer,
        )
        return await self._make(handle, message or sub)

    async def _make(
        self,
        handle: SubscriptionHandle,
        request: Subscription | CompositeSubscription | Subscribe | Durable,
    ) -> SubscriptionHandle:
        """Ask the broker for ``handle``'s subscription by ``request``, which a reconnect makes
        again; the handle ends if the broker refuses it."""
        if handle.id in self._groups:
            raise RequestFailed(f"subscription {handle.id!r} already exists", handle.id)
        self._subs[handle.id] = handle
        if windowed(request):
            handle.seen = Seen()
        if isinstance(request, Durable) and handle.standing is None:
            handle.standing = Standing(self.broker)
        try:
            handle.incomplete = _incomplete(await self._request(handle.id, request))
        except BaseException:
            self._subs.pop(handle.id, None)
            handle._end()
            raise
        self._made["s", handle.id] = request
        return handle

    def ack(self, subscription: str, seq: int) -> None:
        """Deliveries of durable subscription ``subscription`` up to ``seq`` are processed (for
        one made with ``auto_ack=False``); the broker is told shortly."""
        handle = self._subs.get(subscription)
        if handle is not None:
            handle.ack(seq)

    async def unsubscribe(self, ident: str) -> None:
        group = self._groups.pop(ident, None)
        if group is not None:
            for member in group.members:
                self._made.pop(("s", member), None)
            self._subs.pop(ident, None)
            group._end()
            await self._requests([(m, Unsubscribe(m)) for m in group.members])
            return
        await self._request(ident, Unsubscribe(ident))
        self._made.pop(("s", ident), None)
        handle = self._subs.pop(ident, None)
        if handle is not None:
            handle._end()

    def transaction(
        self,
        id: str | None = None,
        *,
        vital: Sequence[str] = (),
        wait: float = 10.0,
        trigger: str | None = None,
        on: Outcome | str = Outcome.COMMITTED,
        join: str | None = None,
    ) -> Transaction:
        """A transaction of publications: ``async with client.transaction() as tx:`` (see
        ``padres.client.transaction``); ``id``: the client's id for it, unique among this client's
        transactions, made here if None. ``vital``: the consumers (client names) whose reactions
        its commit waits for, ``wait`` seconds at most (``docs/transactions.md``). ``trigger``:
        the transaction (``TxNotify.tx``) it reacts to: it commits only if that one ended with
        ``on`` (``committed`` or ``aborted``), waiting ``wait`` seconds at most to learn it
        (``padres.client.outcomes``). ``join``: the transaction (``TxNotify.tx``, one that
        reached this client while open) it is a part of: its publications are that one's, and
        end with it (a shared context); it names no vital consumers and no trigger."""
        if join is not None and (vital or trigger is not None):
            raise InvalidMessage("a part of a transaction names no vital consumers, nor a trigger")
        ident = id or f"{self._id('t')}.{self._instance}"
        depends = None if trigger is None else (trigger, Outcome(on))
        return Transaction(
            self, ident, vital=tuple(vital), wait=wait, trigger=depends, join=join or ""
        )

    async def vote(self, tx: str, vote: Vote | str, reason: str = "") -> None:
        """Vote on transaction ``tx`` (``TxNotify.tx``), which this client received publications
        of: ``ready`` or ``failed``, as a vital consumer of it, or ``rollback`` to mark it
        rollback-only; ``reason`` goes to its producer. ``RequestFailed`` if the broker has
        delivered no publication of an open transaction ``tx`` to its clients."""
        await self._request(tx, TxVote(tx, Vote(vote), reason))

    def _publication(
        self, publication: str | Publication | dict[str, Any], id: str | None
    ) -> Publication:
        """A publication from PADRES text, an attribute dict, or as it is; an id made here
        carries a token of this client's run, so that no other run of the same publisher
        makes it again (stores and durable subscriptions tell publications apart by it)."""
        if isinstance(publication, Publication):
            return publication
        if id is None:
            id = f"{self._id('p')}.{self._instance}"
        if isinstance(publication, str):
            return parse_publication(publication, id=id, timestamp=_now())
        return Publication(id, publication, _now(), "")

    async def publish(
        self,
        publication: str | Publication | dict[str, Any],
        id: str | None = None,
        *,
        guaranteed: bool = False,
    ) -> str:
        """Send a publication (PADRES text, a ``Publication`` or an attribute dict).

        ``guaranteed``: delivered exactly once, in this client's order, to every matching
        durable subscription, surviving broker crashes. The broker acknowledges it once it is
        on disk; until then it is kept here and sent again after a reconnect (``flush`` waits
        for the acknowledgements). An id must not be reused by this publisher: the ids made
        here carry a token of this client's run."""
        pub = self._publication(publication, id)
        await self.publish_many([pub], guaranteed=guaranteed)
        return pub.id

    async def publish_many(
        self, publications: list[Publication], *, guaranteed: bool = False
    ) -> None:
        """Send many publications in one frame."""
        if not guaranteed:
            await self._send(publications)
            return
        while len(self._unacked) >= self.max_unacked:
            self._room.clear()
            await self._room.wait()
        publications = [self._numbered(p) for p in publications]
        for pub in publications:
            self._unacked[pub.id] = pub
        self._idle.clear()
        if self.state is ClientState.CONNECTING and self.reconnect:
            return  # sent once the connection is back
        try:
            await self._send([Guaranteed(p) for p in publications])
        except ConnectionLost:
            if not self.reconnect:
                raise  # else kept, and sent again once the connection is back

    def _numbered(self, pub: Publication) -> Publication:
        """A guaranteed publication as this run's next (``Publication.origin``), unless it is
        numbered already: sent again, through whichever broker, it is still taken once."""
        if isinstance(pub.origin, Origin):
            return pub
        return replace(pub, origin=Origin(self._producer, next(self._sequence)))

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until every guaranteed publication sent has been acknowledged by the broker."""
        if self._unacked:
            await asyncio.wait_for(self._idle.wait(), timeout)

    def _acknowledged(self, ref: str) -> bool:
        """A guaranteed publication is on the broker's disk (or refused)."""
        if self._unacked.pop(ref, None) is None:
            return False
        if len(self._unacked) < self.max_unacked:
            self._room.set()
        if not self._unacked:
            self._idle.set()
        return True

    def _ack_soon(self) -> None:
        """Tell the broker, shortly and in one frame, what durable deliveries are processed."""
        if not self._acking:
            self._acking = True
            asyncio.get_running_loop().call_later(0.02, self._send_acks)

    def _send_acks(self) -> None:
        self._acking = False
        if self.state is ClientState.CONNECTING:
            self._ack_soon()  # once the connection is back (resuming tells the broker too)
            return
        acks = self._due_acks()
        if acks and self.state is ClientState.OPEN:
            task = asyncio.get_running_loop().create_task(self._send(acks))
            task.add_done_callback(_quiet)

    def _due_acks(self) -> list[Envelope]:
        """An ``Ack`` for each durable subscription with deliveries processed since its last."""
        acks: list[Envelope] = []
        for handle in self._subs.values():
            if handle.durable and handle.done > handle.acked:
                handle.acked = handle.done
                acks.append(Ack(handle.id, handle.done))
        return acks

    async def declare_schema(
        self, class_name: str, attributes: str | Mapping[str, str | AttributeSpec]
    ) -> None:
        """Declare the schema of ``class_name``, or widen it, overlay-wide: ``attributes`` is
        ``"NAME:TYPE NAME:TYPE? ..."`` or a mapping from names to ``"TYPE"``/``"TYPE?"``
        (docs/language.md, "Typed event classes"). Returns once every reachable broker has
        it; a declaration that does not widen the schema in force, or goes beyond the broker's
        limits, raises ``RequestFailed``."""
        ident = self._id("d")
        await self._request(ident, DeclareSchema(ident, class_name, parse_attributes(attributes)))

    async def drop_schema(self, class_name: str) -> None:
        """Drop the schema of ``class_name`` overlay-wide (an administrator's right): the class
        is untyped again. Returns once every reachable broker knows; nothing changes for a
        class without a schema."""
        ident = self._id("d")
        await self._request(ident, DropSchema(ident, class_name))

    # -- exception queues --------------------------------------------------------------------

    async def exceptions(
        self,
        subscription: str | SubscriptionHandle,
        entries: Sequence[int] = (),
        *,
        client: str | None = None,
    ) -> ExceptionReport:
        """The exception queue of ``subscription`` (of client ``client`` at this broker, this
        client's own by default): every entry, or only ``entries`` (``RequestFailed`` if one
        is not there), with the queue's length, bytes and how many entries it dropped."""
        sid = _sid(subscription)
        found: list[ExceptionEntry] = []
        after = 0
        while True:
            request = Exceptions(
                self._ref("x"), sid, entries=tuple(entries), client=client or "", after=after
            )
            report = await self.exception_page(request)
            found += report.entries
            if not report.more or not report.entries:
                return replace(report, entries=tuple(found), more=False)
            after = report.entries[-1].id

    async def replay_exceptions(
        self,
        subscription: str | SubscriptionHandle,
        entries: Sequence[int] = (),
        *,
        client: str | None = None,
    ) -> int:
        """Deliver entries of the exception queue (all, or ``entries``) again to the
        subscription, through its handler, now or when its client has it again: handled, an
        entry goes; failed again, it stays with its attempts added up. Returns how many."""
        action = ExceptionAction.REPLAY
        request = Exceptions(self._ref("x"), _sid(subscription), action, tuple(entries))
        return (await self.exception_page(replace(request, client=client or ""))).affected

    async def purge_exceptions(
        self,
        subscription: str | SubscriptionHandle,
        entries: Sequence[int] = (),
        *,
        client: str | None = None,
    ) -> int:
        """Remove entries of the exception queue (all, or ``entries``); returns how many."""
        action = ExceptionAction.PURGE
        request = Exceptions(self._ref("x"), _sid(subscription), action, tuple(entries))
        return (await self.exception_page(replace(request, client=client or ""))).affected

    async def exception_page(self, request: Exceptions) -> ExceptionReport:
        """One request on an exception queue as the wire protocol has it: a page of its
        entries (``after``, ``limit``), a replay or a purge."""
        reply = await self._request(request.ref, request)
        if not isinstance(reply, ExceptionReport):
            raise RequestFailed(f"unexpected answer: {type(reply).__name__}", request.ref)
        return reply

    def _ref(self, kind: str) -> str:
        """A request id of this client's run, for requests that name no id of their own."""
        return f"{kind}{next(self._refs)}.{self._instance}"

    def _retry(self, retry: Retry, size: int) -> None:
        """An entry of an exception queue delivered again: to the subscription's handler. A
        subscription without one sends it back as it came."""
        handle = self._subs.get(retry.subscription)
        if handle is None:
            return  # ended: the broker sends it again when the subscription is made again
        if handle.handler is not None:
            handle.handler.put_retry(retry, size)
            return
        why = f"subscription {retry.subscription!r} has no handler with retries to replay through"
        back = Failed(
            self._ref("f"),
            retry.subscription,
            retry.publication,
            why,
            max(1, retry.attempts),
            entry=retry.entry,
        )
        task = asyncio.get_running_loop().create_task(self._send([back]))
        task.add_done_callback(_quiet)

    async def request(self, message: Envelope) -> Ok:
        """Send one request of the wire protocol (``padres.model.protocol``) and return the
        broker's ``ok``: ``RequestFailed`` with its reason otherwise. The methods above are
        the way to make what the client should make again after a reconnect; this is for the
        requests they do not cover, or whose ids and options come from elsewhere (the web
        API's)."""
        ref = reference(message)
        reply = await self._request(ref, message)
        if not isinstance(reply, Ok):
            raise RequestFailed(f"unexpected answer: {type(reply).__name__}", ref)
        return reply

    @property
    def closed_reason(self) -> str:
        """Why the connection ended, once it has, "" while it is open (the broker's reason,
        if it gave one: an eviction for reading too slowly, say). Known as soon as the
        transport ends, even while the client has stopped reading."""
        return self._transport.reason if self._transport is not None else ""

    @property
    def transport(self) -> Transport | None:
        """The connection to the broker now (None before ``connect``)."""
        return self._transport

    async def query(self, what: str) -> tuple[str, ...]:
        """The rows of a broker's table: 'subscriptions', 'advertisements' or 'schemas'.

        Callers asking for a table while a query for it is in flight share its answer.
        """
        asking = self._queries.get(what)
        if asking is None:
            asking = asyncio.ensure_future(self._request(f"?{what}", Query(what)))
            self._queries[what] = asking
            asking.add_done_callback(lambda task: self._queried(what, task))
        result = await asyncio.shield(asking)
        return result.rows if isinstance(result, QueryResult) else ()

    def _queried(self, what: str, task: asyncio.Task[Envelope]) -> None:
        del self._queries[what]
        if not task.cancelled():
            task.exception()  # retrieved here too: every caller may have gone meanwhile

    async def _send(
        self,
        messages: Sequence[Envelope],
        recovering: bool = False,
    ) -> None:
        usable = self.state is ClientState.OPEN or (
            recovering and self.state is ClientState.CONNECTING
        )
        if not usable or self._transport is None:
            raise ConnectionLost(f"client is {self.state.value}")
        for start in range(0, len(messages), MAX_FRAME_MESSAGES):
            await self._transport.send(encode_frame(messages[start : start + MAX_FRAME_MESSAGES]))

    async def _request(
        self,
        ref: str,
        message: Envelope,
        recovering: bool = False,
        timeout: float | None = None,
    ) -> Envelope:
        """Send ``message`` and wait for its answer (``timeout`` seconds more than the
        client's own, if given)."""
        return (await self._requests([(ref, message)], recovering, timeout))[0]

    async def _requests(
        self,
        requests: Sequence[tuple[str, Envelope]],
        recovering: bool = False,
        timeout: float | None = None,
    ) -> list[Envelope]:
        """Send each message of ``requests`` (its reference, the message), in as few frames
        as the frame limit allows, and wait for every answer; the first that failed raises."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Envelope]] = []
        for ref, _ in requests:
            if ref in self._pending:
                raise RequestFailed(f"a request for {ref!r} is already waiting", ref)
        try:
            for ref, _ in requests:
                futures.append(loop.create_future())
                self._pending[ref] = futures[-1]
            self._read_on()
            await self._send([message for _, message in requests], recovering)
            async with asyncio.timeout(self.timeout + (timeout or 0.0)):
                answers = await asyncio.gather(*futures, return_exceptions=True)
        finally:
            for ref, _ in requests:
                self._pending.pop(ref, None)
            self._read_on()
        replies: list[Envelope] = []
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
            replies.append(answer)
        for (ref, _), reply in zip(requests, replies, strict=True):
            if isinstance(reply, Ok) and reply.incomplete:
                why = "; ".join(reply.incomplete)
                log.warning("%s: the routing of %s settled only in part: %s", self.name, ref, why)
        return replies

    # -- reading -----------------------------------------------------------------------------

    async def _read(self, transport: Transport) -> None:
        try:
            full, reading, subs = self._full, self._reading, self._subs
            async for data in transport.frames():
                items = decode_frame(data, checked=True)  # from the broker
                # What each message weighs in a queue: its share of the frame (a frame holds
                # messages of like sizes, mostly; splitting it exactly would cost a second pass).
                size = len(data) // len(items) if items else 0
                for item in items:
                    if full and not reading.is_set():  # a durable queue is full
                        await reading.wait()
                    if type(item) is Notify:  # most of what comes: handed over here, at once
                        for sid in item.subscriptions:
                            handle = subs.get(sid)
                            if handle is None:
                                continue
                            direct = handle._direct
                            if direct is None or item.seq or handle.seen is not None:
                                handle._deliver(item, size)
                                continue
                            handle._queue.delivered += 1  # as _deliver does, without its tests
                            try:
                                direct(item)
                            except Exception:
                                log.exception("subscription %s: callback failed", sid)
                    else:
                        self._on_message(item, size)
        finally:
            lost = ConnectionLost(f"connection to {self.url} closed")
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(lost)
            if self._welcome is not None and not self._welcome.done():
                self._welcome.set_exception(lost)
            if transport is self._transport and not self.reconnect:  # else the broker waits
                for transaction in list(self._transactions.values()):
                    transaction._lost()
            if transport is self._transport and self.state is ClientState.OPEN:
                if self.reconnect:
                    self.state = ClientState.CONNECTING
                    self._recovery = asyncio.get_running_loop().create_task(self._recover())
                else:
                    self.state = ClientState.CLOSED
                    for handle in self._subs.values():
                        handle._end()

    def _flow(self, subscription: str, room: bool) -> None:
        """Durable subscription ``subscription``'s queue is full (``room`` False), or has room
        again."""
        if room:
            self._full.discard(subscription)
        else:
            self._full.add(subscription)
        self._read_on()

    def _read_on(self) -> None:
        """Read from the broker, unless a durable subscription's queue is full while the client
        is open and no request waits for its answer (which would wait for the application)."""
        if self._full and not self._pending and self.state is ClientState.OPEN:
            self._reading.clear()
        else:
            self._reading.set()

    def _on_message(self, item: Envelope | Rejected, size: int) -> None:
        """A message from the broker, of ``size`` bytes in its frame."""
        match item:
            case Notify():
                if isinstance(item, TxNotify):
                    self._outcomes.learned(item)
                for sid in item.subscriptions:
                    handle = self._subs.get(sid)
                    if handle is not None:
                        handle._deliver(item, size)
            case TxEnded():
                self._tx_ended(item)
            case CompositeNotify():
                handle = self._subs.get(item.subscription)
                if handle is not None:
                    handle._deliver(item, size)
            case ReplayDone():
                self._replay_done(item)
            case GoingAway():
                self._going_away(item)
            case Retry():
                self._retry(item, size)
            case ExceptionReport():
                self._resolve(item.ref, item)
            case ReplayRequest():
                if self.on_replay is not None:
                    self.on_replay(item)
            case Ok():
                if not self._acknowledged(item.ref):
                    self._resolve(item.ref, item)
            case QueryResult():
                self._resolve(f"?{item.what}", item)
            case Welcome():
                if self._welcome is not None and not self._welcome.done():
                    self._welcome.set_result(item)
            case Error():
                if self._acknowledged(item.ref):
                    self.on_error(item)
                    return
                future = self._pending.get(item.ref)
                if future is not None and not future.done():
                    future.set_exception(RequestFailed(item.text, item.ref))
                elif self._welcome is not None and not self._welcome.done():
                    self._welcome.set_exception(AuthenticationError(item.text))
                else:
                    self.on_error(item)
            case Lost():
                self.lost += item.count
                try:
                    self.on_lost(item)
                except Exception:
                    log.exception("%s: on_lost failed", self.name)
            case Rejected():
                log.warning("undecodable message from the broker: %s", item.error)
            case _:
                log.debug("ignored %s from the broker", type(item).__name__)

    def _warn_lost(self, lost: Lost) -> None:
        """What ``on_lost`` does unless told otherwise."""
        if lost.count == 1:
            what = f"1 publication ({lost.first}) was"
        else:
            what = f"{lost.count:,} publications ({lost.first}..{lost.last}) were"
        log.warning(
            "%s: %s dropped at %s on its link to %s: %s",
            self.name,
            what,
            lost.broker,
            lost.neighbour,
            lost.reason,
        )

    def _going_away(self, notice: GoingAway) -> None:
        """The broker is shutting down: this side acknowledges what it processed and closes
        (the broker handles what was sent before); a client that reconnects goes on at
        another broker, as after any lost connection."""
        transport = self._transport
        if transport is None or self.state is not ClientState.OPEN or self._leaving is not None:
            return
        then = "moving to another broker" if self.reconnect else "closing"
        log.warning(
            "%s: broker %s is going away (%s): %s", self.name, notice.broker, notice.reason, then
        )
        self._leaving = asyncio.get_running_loop().create_task(self._leave(transport))

    async def _leave(self, transport: Transport) -> None:
        try:
            acks = self._due_acks()
            if acks:
                with contextlib.suppress(Exception):  # gone already: they come again, once
                    await transport.send(encode_frame(acks))
            await transport.close()
        finally:
            self._leaving = None

    def _tx_ended(self, ended: TxEnded) -> None:
        """A transaction's end from the broker: the answer to a request, or news (the broker
        aborted it)."""
        future = self._pending.get(ended.tx)
        if future is not None and not future.done():
            future.set_result(ended)
            return
        transaction = self._transactions.get(ended.tx)
        if transaction is None:
            return
        if ended.outcome is Outcome.COMMITTED:  # a part: the transaction it joined committed
            transaction._committed()
            return
        log.warning("%s: transaction %s aborted: %s", self.name, ended.tx, ended.reason)
        transaction._ended(ended.reason, ended.limit)

    def _replay_done(self, done: ReplayDone) -> None:
        handle = self._subs.get(done.subscription)
        if handle is None:
            return
        handle._replay_done(done)
        if not done.live:  # a historic subscription is over
            self._subs.pop(done.subscription, None)
            self._made.pop(("s", done.subscription), None)
            handle._end()

    def _resolve(self, key: str, value: Envelope) -> None:
        future = self._pending.get(key)
        if future is not None and not future.done():
            future.set_result(value)


def _incomplete(reply: Envelope) -> tuple[str, ...]:
    return reply.incomplete if isinstance(reply, Ok) else ()


def _after(item: Delivery | ReplayDone, seq: int) -> bool:
    return not isinstance(item, ReplayDone) and item.seq > seq


def _quiet(task: asyncio.Task[None]) -> None:
    """An acknowledgement that could not be sent is sent again after the reconnect."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("acknowledgement not sent: %s", task.exception())


def _sid(subscription: str | SubscriptionHandle) -> str:
    return subscription if isinstance(subscription, str) else subscription.id


def _filter(flt: str | Filter) -> Filter:
    return flt if isinstance(flt, Filter) else parse_filter(flt)


class BlockingClient:
    """``Client`` for code without asyncio: its loop runs in a background thread.

    Callbacks run on that thread; ``deliveries`` iterates a subscription from the caller's.
    """

    def __init__(self, url: str, name: str = "client", **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._client = Client(url, name, **options)
        self._call(self._client.connect())

    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def client(self) -> Client:
        return self._client

    def advertise(self, flt: str | Filter, id: str | None = None) -> str:
        return self._call(self._client.advertise(flt, id))

    def unadvertise(self, ident: str) -> None:
        self._call(self._client.unadvertise(ident))

    def subscribe(
        self,
        flt: str | Filter,
        callback: Callable[[Delivery], Any] | None = None,
        id: str | None = None,
        *,
        durable: str | None = None,
        auto_ack: bool = True,
        visibility: Visibility | str = Visibility.ON_COMMIT,
        retries: int | None = None,
        backoff: float = 0.1,
        max_pending: int | None = None,
        max_pending_bytes: int | None = None,
        priority: int = 0,
        scope: Scope | str = Scope.GLOBAL,
    ) -> SubscriptionHandle:
        return self._call(
            self._client.subscribe(
                flt,
                callback,
                id,
                durable=durable,
                auto_ack=auto_ack,
                visibility=visibility,
                retries=retries,
                backoff=backoff,
                max_pending=max_pending,
                max_pending_bytes=max_pending_bytes,
                priority=priority,
                scope=scope,
            )
        )

    def subscribe_many(
        self,
        filters: Sequence[str | Filter],
        callback: Callable[[Delivery], Any] | None = None,
        id: str | None = None,
        *,
        max_pending: int | None = None,
        max_pending_bytes: int | None = None,
    ) -> SubscriptionHandle:
        return self._call(
            self._client.subscribe_many(
                filters,
                callback,
                id,
                max_pending=max_pending,
                max_pending_bytes=max_pending_bytes,
            )
        )

    def exceptions(
        self, subscription: str, entries: Sequence[int] = (), *, client: str | None = None
    ) -> ExceptionReport:
        return self._call(self._client.exceptions(subscription, entries, client=client))

    def replay_exceptions(
        self, subscription: str, entries: Sequence[int] = (), *, client: str | None = None
    ) -> int:
        return self._call(self._client.replay_exceptions(subscription, entries, client=client))

    def purge_exceptions(
        self, subscription: str, entries: Sequence[int] = (), *, client: str | None = None
    ) -> int:
        return self._call(self._client.purge_exceptions(subscription, entries, client=client))

    def subscribe_composite(
        self,
        expression: str,
        callback: Callable[[Delivery], Any] | None = None,
        id: str | None = None,
        *,
        durable: str | None = None,
        max_pending: int | None = None,
        max_pending_bytes: int | None = None,
    ) -> SubscriptionHandle:
        return self._call(
            self._client.subscribe_composite(
                expression,
                callback,
                id,
                durable=durable,
                max_pending=max_pending,
                max_pending_bytes=max_pending_bytes,
            )
        )

    def unsubscribe(self, ident: str) -> None:
        self._call(self._client.unsubscribe(ident))

    def publish(
        self,
        publication: str | Publication | dict[str, Any],
        id: str | None = None,
        *,
        guaranteed: bool = False,
    ) -> str:
        return self._call(self._client.publish(publication, id, guaranteed=guaranteed))

    def flush(self, timeout: float | None = None) -> None:
        self._call(self._client.flush(timeout))

    def transaction(
        self,
        id: str | None = None,
        *,
        vital: Sequence[str] = (),
        wait: float = 10.0,
        trigger: str | None = None,
        on: Outcome | str = Outcome.COMMITTED,
        join: str | None = None,
    ) -> BlockingTransaction:
        """A transaction of publications: ``with client.transaction() as tx:``."""
        made = self._client.transaction(
            id, vital=vital, wait=wait, trigger=trigger, on=on, join=join
        )
        return BlockingTransaction(self, made)

    def declare_schema(
        self, class_name: str, attributes: str | Mapping[str, str | AttributeSpec]
    ) -> None:
        self._call(self._client.declare_schema(class_name, attributes))

    def drop_schema(self, class_name: str) -> None:
        self._call(self._client.drop_schema(class_name))

    def query(self, what: str) -> tuple[str, ...]:
        return self._call(self._client.query(what))

    def deliveries(
        self, handle: SubscriptionHandle, timeout: float | None = None
    ) -> Iterator[Delivery]:
        """Deliveries of ``handle`` as they come; stops after ``timeout`` s without one. Where
        deliveries were dropped, ``SlowConsumer`` (call again to go on)."""
        while True:
            try:
                yield self._call(handle.get(timeout))
            except (TimeoutError, ConnectionLost):
                return

    def close(self) -> None:
        self._call(self._client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
