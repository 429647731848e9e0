"""The web API's clients of the broker: publishers and the subscriptions made over REST.

Each is a ``Client`` attached to the broker node in this process (``Client.attached``), as the
caller's account: the API goes through the client and the broker's checks as any program does.

A *publisher* is a named client (``?client=NAME``, default ``web``) kept while the broker
runs; its advertisements and publications are its own, as a WebSocket client's are.

A REST *subscription* is a client of its own (``web-<id>``), so that its deliveries queue and
are bounded like any client's: read by one stream at a time (SSE or WebSocket). Its client
holds ``READ_AHEAD`` deliveries at most and then reads nothing more from the broker, so a
reader that falls too far behind fills its queue at the broker and is evicted. A *durable*
REST subscription lives at the broker: its client is open only while a stream reads it, and a
stream that comes back resumes after the last delivery it took (``Last-Event-ID``). Durable
REST subscriptions outlast a restart of a broker that keeps its journal on disk (``--data``):
they are listed again, and read as before.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Final, Literal

from padres.client.connection import Client, ClientState, SubscriptionHandle
from padres.client.transport import AttachedTransport
from padres.errors import (
    AuthenticationError,
    ConnectionLost,
    InvalidMessage,
    RequestFailed,
    SchemaViolation,
)
from padres.model.classes import SCHEMA_CLASS, check_publication
from padres.model.messages import (
    Advertisement,
    CompositeSubscription,
    Publication,
    Subscription,
    Unadvertise,
    Unsubscribe,
    check_id,
)
from padres.model.protocol import (
    DURABLE_WINDOW,
    DURABLE_WINDOW_BYTES,
    CompositeNotify,
    Durable,
    Envelope,
    Guaranteed,
    Notify,
    Ok,
    ReplayDone,
    Scope,
)
from padres.model.requests import reference
from padres.runtime.node import BrokerNode
from web.auth import Caller
from web.problems import Problem

__all__ = [
    "READ_AHEAD",
    "Clients",
    "RestAdvertisement",
    "RestSubscription",
    "SubscriptionEnded",
    "ask",
    "connect",
]

_ANYONE: Final = Caller()
"""The caller when the broker has no accounts (and the broker's own requests)."""
ENDED_REMEMBERED: Final = 1000
"""How many ended subscriptions are remembered, to say why they ended."""
REPLY_TIMEOUT: Final = 30.0
"""Seconds a request waits for the broker's reply."""
READ_AHEAD: Final = (256, 256 << 10)
"""Deliveries, and bytes of them, a REST subscription's client holds for its reader."""
LIVE_QUEUE: Final = 1 << 20
"""Bytes of deliveries a plain REST subscription may queue at the broker (a durable one's
are bounded by its window, ``DURABLE_WINDOW_BYTES``)."""
OPEN_PER_ACCOUNT: Final = 64
"""REST subscriptions one account (or, without accounts, the API) may have open at once:
plain ones, and durable ones while a stream reads them. With ``LIVE_QUEUE`` and
``READ_AHEAD``, this bounds the memory one account's REST subscriptions hold."""
IDLE_CHECK: Final = 1.0
"""Seconds between two looks for REST subscriptions left unread (``Clients.expire``)."""
PUBLISHERS_PER_ACCOUNT: Final = 64
"""Named publishers (``?client=``) one account (or the API) may keep at once."""


class SubscriptionEnded(Exception):
    """A REST subscription's client is gone (unsubscribed, or evicted for reading too
    slowly): what its stream says last."""


@dataclass
class RestAdvertisement:
    id: str
    client: str
    advertisement: Advertisement


@dataclass
class RestSubscription:
    id: str
    kind: Literal["subscription", "composite"]
    message: Subscription | CompositeSubscription
    durable: bool
    priority: int = 0
    scope: Scope = Scope.GLOBAL
    client: Client | None = None
    """Its client, while it has one (a plain subscription's always, a durable one's while a
    stream reads it)."""
    handle: SubscriptionHandle | None = None
    reading: bool = False
    """Whether a stream reads it now (one at a time)."""
    read: float = field(default_factory=time.monotonic)
    """When it was made, or a stream last stopped reading it (``time.monotonic()``)."""
    delivered: int = field(default=0)
    """Deliveries handed to streams so far."""
    owner: str = ""
    """The account that made it, when the broker has accounts: only it may use it."""

    @property
    def session_name(self) -> str:
        """Its session's name: ``web-<id>``, after the owner's name and a dot if it has one."""
        return f"{self.owner}.web-{self.id}" if self.owner else f"web-{self.id}"


class Clients:
    """Publishers and REST subscriptions of one broker node (see the module docstring)."""

    def __init__(self, node: BrokerNode) -> None:
        self.node = node
        self.publishers: dict[str, tuple[Client, str]] = {}
        """Publisher name -> its client, and the account it was opened as ("" for none)."""
        self.advertisements: dict[str, RestAdvertisement] = {}
        self.subscriptions: dict[str, RestSubscription] = {}
        self._ended: OrderedDict[str, tuple[str, str]] = OrderedDict()
        """Subscriptions that ended: id -> the account that made it, and why it ended."""
        self._run = secrets.token_hex(3)
        self._ids = itertools.count(1)
        self._opening = asyncio.Lock()
        self._restore()

    def _restore(self) -> None:
        """Take up the durable REST subscriptions the broker's journal kept across a restart
        (their owner is ``web-<id>@<broker>``)."""
        suffix = f"@{self.node.broker.id}"
        for record in self.node.broker.durables.records():
            session = record.owner.removesuffix(suffix)
            if session == f"web-{record.name}" or session.endswith(f".web-{record.name}"):
                owner = session.removesuffix(f"web-{record.name}").removesuffix(".")
                message = record.subscription
                kind: Literal["subscription", "composite"] = (
                    "subscription" if isinstance(message, Subscription) else "composite"
                )
                sub = RestSubscription(
                    record.name, kind, message, True, record.priority, record.scope, owner=owner
                )
                self.subscriptions[record.name] = sub

    def new_id(self, prefix: str) -> str:
        return f"{prefix}{self._run}.{next(self._ids)}"

    # -- publishers --------------------------------------------------------------------------

    async def publisher(self, name: str, caller: Caller = _ANYONE) -> Client:
        """The client of publisher ``name``, opened the first time it is asked for, as the
        caller's account (whose grants then apply to it)."""
        try:
            check_id(name, "client name")
        except InvalidMessage as exc:
            raise Problem(400, "invalid client name", str(exc)) from None
        owner = caller.name if caller.account is not None else ""
        async with self._opening:
            client, opened_as = self.publishers.get(name, (None, ""))
            if client is None or client.state is ClientState.CLOSED:
                kept = [c for c, o in self.publishers.values() if o == owner]
                if sum(c.state is not ClientState.CLOSED for c in kept) >= PUBLISHERS_PER_ACCOUNT:
                    whose = f"user {owner!r} keeps" if owner else "the API keeps"
                    why = f"{whose} {PUBLISHERS_PER_ACCOUNT} publishers, the limit: reuse a name"
                    raise Problem(409, "too many publishers", why)
                client = await connect(self.node, name, caller)
                self.publishers[name] = client, owner
            elif opened_as != owner:
                raise Problem(409, "in use", f"publisher {name!r} is in use by another user")
            return client

    def allowed(self, caller: Caller, *messages: Envelope) -> None:
        """A 403 naming the missing grant unless the caller's account may send ``messages``
        (the broker checks again; checked here first so that nothing is sent half-way)."""
        guard = self.node.broker.guard
        if guard is None or caller.account is None:
            return
        for message in messages:
            why = guard.refusal(message, caller.account, time.time())
            if why is not None:
                raise Problem(403, "forbidden", why)

    async def publish(
        self,
        client: str,
        publications: Sequence[Publication],
        guaranteed: bool,
        caller: Caller = _ANYONE,
    ) -> str:
        """Publish them all, or refuse them all: 422 if one breaks the schema of its class,
        409 if one conforms to none of the publisher's advertisements. Guaranteed ones return
        once on the broker's disk. ``SCHEMA`` publications declare schemas (see
        ``_declare``)."""
        self.allowed(caller, *publications)
        if any(p.class_name == SCHEMA_CLASS for p in publications):
            return await self._declare(client, publications, caller)
        self._typed(publications)
        was, _ = self.publishers.get(client, (None, ""))
        kept = was is not None and was.state is not ClientState.CLOSED
        publisher = await self.publisher(client, caller)
        publications = [
            Publication(p.id, p.attributes, p.timestamp, publisher.session) for p in publications
        ]
        hop = _hop(publisher)
        strays = [
            {"where": f"publications[{i}]", "reason": f"publication {p.id} conforms to none"}
            for i, p in enumerate(publications)
            if not self.node.broker.conforming(hop, p)
        ]
        if strays:
            if not kept:  # opened for this request alone: nothing of it is kept
                del self.publishers[client]
                await publisher.close()
            raise Problem(
                409,
                "not advertised",
                f"{len(strays)} of the publications match none of the advertisements of "
                f"{publisher.session}: advertise what you publish first "
                "(POST /api/v1/advertisements); nothing was published",
                errors=strays,
            )
        if not guaranteed:
            try:
                await publisher.publish_many(publications)
            except ConnectionLost as exc:
                raise Problem(409, "session ended", f"{publisher.session}: {exc}") from None
            return publisher.session
        await asyncio.gather(*(ask(publisher, Guaranteed(p)) for p in publications))
        return publisher.session

    def _typed(self, publications: Sequence[Publication]) -> None:
        """A 422 listing every publication that breaks the schema of its class (the broker
        checks again; checked here first so that nothing is sent half-way)."""
        schemas = self.node.broker.schemas
        offenders = []
        for i, pub in enumerate(publications):
            schema = schemas.get(pub.class_name)
            try:
                if schema is not None:
                    check_publication(schema, pub, f"publication {pub.id!r}")
            except SchemaViolation as exc:
                offenders.append({"where": f"publications[{i}]", "reason": str(exc)})
        if offenders:
            raise Problem(
                422,
                "schema violation",
                f"{len(offenders)} of the publications break the schema of their class; "
                "nothing was published",
                errors=offenders,
            )

    async def _declare(
        self, client: str, publications: Sequence[Publication], caller: Caller
    ) -> str:
        """``SCHEMA`` publications: schema declarations, made one after the other, each
        answered once every reachable broker has it (they need no advertisement). A batch
        holds them alone: a 400 if it mixes them with other publications."""
        mixed = [
            {
                "where": f"publications[{i}]",
                "reason": f"publication {p.id} is of class {p.class_name!r}",
            }
            for i, p in enumerate(publications)
            if p.class_name != SCHEMA_CLASS
        ]
        if mixed:
            raise Problem(
                400,
                "declarations mixed with publications",
                f"{SCHEMA_CLASS} publications declare schemas: send them in a request of their "
                "own; nothing was published",
                errors=mixed,
            )
        publisher = await self.publisher(client, caller)
        for pub in publications:
            await ask(publisher, pub)
        return publisher.session

    async def advertise(
        self, client: str, adv: Advertisement, caller: Caller = _ANYONE
    ) -> tuple[str, ...]:
        self.allowed(caller, adv)
        publisher = await self.publisher(client, caller)
        incomplete = (await ask(publisher, adv)).incomplete
        self.advertisements[adv.id] = RestAdvertisement(adv.id, client, adv)
        return incomplete

    async def unadvertise(self, aid: str, caller: Caller = _ANYONE) -> None:
        found = self.advertisements.get(aid)
        if found is None:
            raise Problem(404, "no such advertisement", f"no advertisement {aid!r} here")
        await ask(await self.publisher(found.client, caller), Unadvertise(aid))
        del self.advertisements[aid]

    # -- subscriptions -----------------------------------------------------------------------

    async def subscribe(self, sub: RestSubscription, caller: Caller = _ANYONE) -> tuple[str, ...]:
        """Make the subscription at the broker, as the caller's; returns what its routing could
        not reach."""
        self.allowed(caller, sub.message)
        held = sum(1 for s in self.subscriptions.values() if s.owner == caller.name)
        most = self.node.broker.quotas.subscriptions
        if held >= most:
            whose = f"user {caller.name!r} holds" if caller.name else "the API holds"
            raise Problem(409, "too many subscriptions", f"{whose} {held:,}; the limit is {most:,}")
        sub.owner = caller.name
        if sub.durable:
            async with self._durable_client(sub, caller) as client:
                made = Durable(sub.message, priority=sub.priority, scope=sub.scope)
                incomplete = (await ask(client, made)).incomplete
        else:
            self._room(caller)
            client = await connect(self.node, sub.session_name, caller, LIVE_QUEUE)
            try:
                sub.handle = await _made(client, sub)
            except BaseException:
                await client.close()
                raise
            sub.client = client
            incomplete = sub.handle.incomplete
        self.subscriptions[sub.id] = sub
        self._ended.pop(sub.id, None)
        return incomplete

    def _room(self, caller: Caller) -> None:
        """A 409 unless the caller's account may open one more REST subscription's client
        (``OPEN_PER_ACCOUNT``)."""
        held = self.subscriptions.values()
        open_ = sum(1 for s in held if s.owner == caller.name and (s.reading or not s.durable))
        if open_ >= OPEN_PER_ACCOUNT:
            whose = f"user {caller.name!r} has" if caller.name else "the API has"
            why = (
                f"{whose} {open_} REST subscriptions open (plain ones, and durable ones being "
                f"read), the limit: remove some, or read durable ones one after the other"
            )
            raise Problem(409, "too many open subscriptions", why)

    def get(self, sid: str, caller: Caller = _ANYONE) -> RestSubscription:
        sub = self.subscriptions.get(sid)
        if sub is not None and not caller.owns(sub.owner):
            sub = None  # another user's: as if there were none
        elif sub is not None and sub.client is not None and sub.client.closed_reason:
            self._end(sid, sub.client.closed_reason)  # evicted while its reader was stuck
        elif sub is not None:
            return sub
        owner, why = self._ended.get(sid, ("", ""))
        if sid in self.subscriptions or not caller.owns(owner):
            why = ""  # nothing of another user's subscription
        detail = f"no subscription {sid!r} here" + (f": it ended ({why})" if why else "")
        raise Problem(404, "no such subscription", detail)

    async def unsubscribe(self, sid: str, caller: Caller = _ANYONE) -> None:
        sub = self.get(sid, caller)
        if sub.durable:
            async with self._durable_client(sub, caller) as client:
                await ask(client, Unsubscribe(sid))
        elif sub.client is not None:
            await sub.client.close()
        self._end(sid, "unsubscribed")

    @asynccontextmanager
    async def stream(
        self, sid: str, last_id: int | None, caller: Caller = _ANYONE
    ) -> AsyncIterator[AsyncIterator[Envelope]]:
        """The deliveries of subscription ``sid`` for one reader (a 409 if another reads it),
        with the ``replay_done`` of a hybrid one where it comes. A durable subscription resumes
        after ``last_id`` and is acknowledged as it is read."""
        sub = self.get(sid, caller)
        if sub.reading:
            raise Problem(409, "already read", f"another stream reads subscription {sid!r}")
        if sub.durable:
            self._room(caller)
        sub.reading = True
        try:
            if sub.durable:
                async with self._durable_client(sub, caller) as client:
                    handle = await _resumed(client, sub, last_id or 0)
                    yield self._read(sub, client, handle)
            else:
                if sub.client is None or sub.handle is None:  # pragma: no cover - set when made
                    raise Problem(404, "no such subscription", f"{sid!r} has no client")
                yield self._read(sub, sub.client, sub.handle)
        finally:
            sub.reading = False
            sub.read = time.monotonic()

    async def expire(self) -> None:
        """Remove, every ``IDLE_CHECK`` seconds, the plain subscriptions no stream has read
        for ``Limits.rest_idle`` seconds (a durable one waits at the broker, as for any
        client)."""
        while True:
            await asyncio.sleep(IDLE_CHECK)
            idle = self.node.limits.rest_idle
            now = time.monotonic()
            for sub in list(self.subscriptions.values()):
                if sub.durable or sub.reading or now - sub.read < idle:
                    continue
                if sub.client is not None:
                    await sub.client.close()
                self._end(sub.id, f"no stream read it for {idle:g} s")

    async def _read(
        self, sub: RestSubscription, client: Client, handle: SubscriptionHandle
    ) -> AsyncIterator[Notify | CompositeNotify | ReplayDone]:
        async for message in handle.events():
            sub.delivered += 1
            yield message
            if isinstance(message, Notify | CompositeNotify) and message.seq:
                handle.ack(message.seq)
        why = client.closed_reason or "the subscription ended"
        if not sub.durable:
            self._end(sub.id, why)
        raise SubscriptionEnded(why)

    @asynccontextmanager
    async def _durable_client(self, sub: RestSubscription, caller: Caller) -> AsyncIterator[Client]:
        """A client as the durable subscription's owner, closed afterwards."""
        try:
            client = await connect(self.node, sub.session_name, caller)
        except Problem as exc:
            raise Problem(409, "in use", f"durable subscription {sub.id!r}: {exc.detail}") from None
        try:
            yield client
        finally:
            await client.close()

    def _end(self, sid: str, why: str) -> None:
        sub = self.subscriptions.pop(sid, None)
        self._ended[sid] = ("" if sub is None else sub.owner, why)
        while len(self._ended) > ENDED_REMEMBERED:
            self._ended.popitem(last=False)


async def _made(client: Client, sub: RestSubscription) -> SubscriptionHandle:
    """Make a plain REST subscription with ``client``; its failures as problems."""
    try:
        if isinstance(sub.message, Subscription):
            return await client.subscribe(
                sub.message.filter,
                id=sub.id,
                when_full="wait",
                priority=sub.priority,
                scope=sub.scope,
            )
        return await client.subscribe_composite(sub.message, when_full="wait")
    except (RequestFailed, ConnectionLost, TimeoutError) as exc:
        raise _problem(client, sub.id, exc) from None


async def _resumed(client: Client, sub: RestSubscription, acked: int) -> SubscriptionHandle:
    """Resume durable subscription ``sub`` after delivery ``acked``; failures as problems."""
    try:
        if isinstance(sub.message, CompositeSubscription):
            return await client.subscribe_composite(
                sub.message,
                durable=sub.id,
                after=acked,
                auto_ack=False,
                max_pending=DURABLE_WINDOW,
                max_pending_bytes=DURABLE_WINDOW_BYTES,
            )
        return await client.subscribe(
            sub.message.filter,
            durable=sub.id,
            after=acked,
            auto_ack=False,
            max_pending=DURABLE_WINDOW,
            max_pending_bytes=DURABLE_WINDOW_BYTES,
            priority=sub.priority,
            scope=sub.scope,
        )
    except (RequestFailed, ConnectionLost, TimeoutError) as exc:
        raise _problem(client, sub.id, exc) from None


async def connect(
    node: BrokerNode, name: str, caller: Caller = _ANYONE, queue_limit: int | None = None
) -> Client:
    """A client of the broker as ``caller``'s account (the broker's own when it has none),
    for which the broker queues ``queue_limit`` bytes (by default, as for any client)."""
    client = Client.attached(
        node,
        name,
        account=caller.account,
        trusted=True,
        queue_limit=queue_limit,
        timeout=REPLY_TIMEOUT,
        max_pending=READ_AHEAD[0],
        max_pending_bytes=READ_AHEAD[1],
    )
    try:
        return await client.connect()
    except (AuthenticationError, ConnectionLost) as exc:
        raise Problem(409, "session refused", str(exc)) from None


def _hop(client: Client) -> str:
    """The node's name for an attached client's connection."""
    transport = client.transport
    assert isinstance(transport, AttachedTransport), "the web API's clients are attached"
    return transport.hop


async def ask(client: Client, message: Envelope) -> Ok:
    """``client.request``, its failures as problems."""
    try:
        return await client.request(message)
    except (RequestFailed, ConnectionLost, TimeoutError) as exc:
        raise _problem(client, reference(message), exc) from None


def _problem(client: Client, ref: str, exc: Exception) -> Problem:
    """A request's failure, as the API says it."""
    if isinstance(exc, RequestFailed):
        return Problem(409, "refused by the broker", exc.text)
    if isinstance(exc, ConnectionLost):
        return Problem(409, "session ended", f"{client.session}: {exc}")
    return Problem(504, "no answer", f"the broker did not answer {ref!r} in time")
