"""The web API's clients of the broker: publishers and the subscriptions made over REST.

A *publisher* is a named session (``?client=NAME``, default ``web``) kept while the broker
runs; its advertisements and publications are its own, as a WebSocket client's are.

A REST *subscription* is a session of its own (``web-<id>``), so that its deliveries queue and
are bounded like any client's: read by one stream at a time (SSE or WebSocket), and evicted if
the reader falls too far behind. A *durable* REST subscription lives at the broker: its session
is open only while a stream reads it, and a stream that comes back resumes after the last
delivery it took (``Last-Event-ID``). Durable REST subscriptions outlast a restart of a broker
that keeps its journal on disk (``--data``): they are listed again, and read as before.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Final, Literal

from padres.errors import InvalidMessage, SchemaViolation
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
from padres.model.protocol import Ack, Durable, Envelope, Guaranteed, Notify, Ok
from padres.runtime.node import BrokerNode
from web.auth import Caller
from web.problems import Problem
from web.session import LocalSession, Refused, SessionClosed

__all__ = ["Clients", "RestAdvertisement", "RestSubscription", "ask", "open_session"]

_ANYONE: Final = Caller()
"""The caller when the broker has no accounts (and the broker's own requests)."""
ENDED_REMEMBERED: Final = 1000
"""How many ended subscriptions are remembered, to say why they ended."""


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
    session: LocalSession | None = None
    reading: bool = False
    """Whether a stream reads it now (one at a time)."""
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
        self.publishers: dict[str, LocalSession] = {}
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
                sub = RestSubscription(record.name, "subscription", record.subscription, True)
                self.subscriptions[record.name] = replace(sub, owner=owner)

    def new_id(self, prefix: str) -> str:
        return f"{prefix}{self._run}.{next(self._ids)}"

    # -- publishers --------------------------------------------------------------------------

    async def publisher(self, name: str, caller: Caller = _ANYONE) -> LocalSession:
        """The session of publisher ``name``, opened the first time it is asked for, as the
        caller's account (whose grants then apply to it)."""
        try:
            check_id(name, "client name")
        except InvalidMessage as exc:
            raise Problem(400, "invalid client name", str(exc)) from None
        async with self._opening:
            session = self.publishers.get(name)
            if session is None or session.closed is not None:
                session = await open_session(self.node, name, reader=False, caller=caller)
                self.publishers[name] = session
            elif (session.account and session.account.name) != (caller.account and caller.name):
                raise Problem(409, "in use", f"publisher {name!r} is in use by another user")
            return session

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
        session = await self.publisher(client, caller)
        publications = [
            Publication(p.id, p.attributes, p.timestamp, session.session) for p in publications
        ]
        strays = [
            {"where": f"publications[{i}]", "reason": f"publication {p.id} conforms to none"}
            for i, p in enumerate(publications)
            if not self.node.broker.conforming(session.hop, p)
        ]
        if strays:
            raise Problem(
                409,
                "not advertised",
                f"{len(strays)} of the publications match none of the advertisements of "
                f"{session.session}: advertise what you publish first "
                "(POST /api/v1/advertisements); nothing was published",
                errors=strays,
            )
        if not guaranteed:
            session.send(*publications)
            return session.session
        await asyncio.gather(*(ask(session, p.id, Guaranteed(p)) for p in publications))
        return session.session

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
        session = await self.publisher(client, caller)
        for pub in publications:
            await ask(session, pub.id, pub)
        return session.session

    async def advertise(
        self, client: str, adv: Advertisement, caller: Caller = _ANYONE
    ) -> tuple[str, ...]:
        self.allowed(caller, adv)
        session = await self.publisher(client, caller)
        incomplete = (await ask(session, adv.id, adv)).incomplete
        self.advertisements[adv.id] = RestAdvertisement(adv.id, client, adv)
        return incomplete

    async def unadvertise(self, aid: str, caller: Caller = _ANYONE) -> None:
        found = self.advertisements.get(aid)
        if found is None:
            raise Problem(404, "no such advertisement", f"no advertisement {aid!r} here")
        await ask(await self.publisher(found.client, caller), aid, Unadvertise(aid))
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
            async with self._durable_session(sub, caller, acked=0) as session:
                ok = await ask(session, sub.id, Durable(_atomic(sub)))
        else:
            session = await open_session(self.node, sub.session_name, reader=True, caller=caller)
            sub.session = session
            try:
                ok = await ask(session, sub.id, sub.message)
            except Problem:
                await session.close()
                raise
        self.subscriptions[sub.id] = sub
        self._ended.pop(sub.id, None)
        return ok.incomplete

    def get(self, sid: str, caller: Caller = _ANYONE) -> RestSubscription:
        sub = self.subscriptions.get(sid)
        if sub is not None and not caller.owns(sub.owner):
            sub = None  # another user's: as if there were none
        elif sub is not None and sub.session is not None and sub.session.closed is not None:
            self._end(sid, sub.session.closed)  # evicted while its reader was stuck
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
            async with self._durable_session(sub, caller, acked=0, attach=False) as session:
                await ask(session, sid, Unsubscribe(sid))
        elif sub.session is not None:
            await sub.session.close()
        self._end(sid, "unsubscribed")

    @asynccontextmanager
    async def stream(
        self, sid: str, last_id: int | None, caller: Caller = _ANYONE
    ) -> AsyncIterator[AsyncIterator[Envelope]]:
        """The deliveries of subscription ``sid`` for one reader (a 409 if another reads it).
        A durable subscription resumes after ``last_id`` and is acknowledged as it is read."""
        sub = self.get(sid, caller)
        if sub.reading:
            raise Problem(409, "already read", f"another stream reads subscription {sid!r}")
        sub.reading = True
        try:
            if sub.durable:
                async with self._durable_session(sub, caller, acked=last_id or 0) as session:
                    yield self._read(sub, session)
            else:
                if sub.session is None:  # pragma: no cover - set when it was made
                    raise Problem(404, "no such subscription", f"{sid!r} has no session")
                yield self._read(sub, sub.session)
        finally:
            sub.reading = False

    async def _read(self, sub: RestSubscription, session: LocalSession) -> AsyncIterator[Envelope]:
        try:
            async for message in session.deliveries():
                sub.delivered += 1
                yield message
                if isinstance(message, Notify) and message.seq:
                    session.send(Ack(sub.id, message.seq))
        except SessionClosed as exc:
            if not sub.durable:
                self._end(sub.id, str(exc))
            raise

    @asynccontextmanager
    async def _durable_session(
        self, sub: RestSubscription, caller: Caller, *, acked: int, attach: bool = True
    ) -> AsyncIterator[LocalSession]:
        """A session as the durable subscription's owner, attached to it (resuming after
        ``acked``) unless ``attach`` is false; closed afterwards."""
        try:
            session = await open_session(self.node, sub.session_name, reader=True, caller=caller)
        except Problem as exc:
            raise Problem(409, "in use", f"durable subscription {sub.id!r}: {exc.detail}") from None
        try:
            if attach and sub.id in self.subscriptions:
                await ask(session, sub.id, Durable(_atomic(sub), acked))
            yield session
        finally:
            await session.close()

    def _end(self, sid: str, why: str) -> None:
        sub = self.subscriptions.pop(sid, None)
        self._ended[sid] = ("" if sub is None else sub.owner, why)
        while len(self._ended) > ENDED_REMEMBERED:
            self._ended.popitem(last=False)


def _atomic(sub: RestSubscription) -> Subscription:
    if not isinstance(sub.message, Subscription):  # refused when it was made
        raise Problem(400, "not durable", "a composite subscription cannot be durable")
    return sub.message


async def open_session(
    node: BrokerNode, name: str, *, reader: bool, caller: Caller = _ANYONE
) -> LocalSession:
    """A session of the broker as ``caller``'s account (the broker's own when it has none)."""
    try:
        return await LocalSession(node, name, reader=reader, account=caller.account).open()
    except Refused as exc:
        raise Problem(409, "session refused", exc.text) from None


async def ask(session: LocalSession, ref: str, message: Envelope) -> Ok:
    """``session.request``, its failures as problems."""
    try:
        return await session.request(ref, message)
    except Refused as exc:
        raise Problem(409, "refused by the broker", exc.text) from None
    except SessionClosed as exc:
        raise Problem(409, "session ended", f"{session.session}: {exc}") from None
    except TimeoutError:
        raise Problem(504, "no answer", f"the broker did not answer {ref!r} in time") from None
