"""A client of the broker inside its own process: what the web API speaks to the core through.

A ``LocalSession`` is a connection of the node like a socket's (``BrokerNode.attach``): it says
``hello``, its requests get ``ok`` or ``error`` replies, and what the core sends it goes through
the node's bounded client queue. Its deliveries (notifications, replay ends, notices) wait for
a reader one frame at a time, so a reader too slow for them (an SSE stream, a WebSocket) fills
that queue and is evicted like any other client; a session made without a reader (a publisher)
lets its deliveries go.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from typing import Final

from padres.model.protocol import (
    Envelope,
    Error,
    ExceptionReport,
    Exceptions,
    Hello,
    Ok,
    Query,
    QueryResult,
    Rejected,
    Welcome,
    decode_frame,
)
from padres.runtime.node import BrokerNode
from padres.security.accounts import Account

__all__ = ["REPLY_TIMEOUT", "LocalSession", "Refused", "SessionClosed"]

REPLY_TIMEOUT: Final = 30.0
"""Seconds a request waits for the broker's reply."""
EVICTED: Final = "evicted:"
"""How the last words to an evicted client begin (docs/protocol.md)."""


class Refused(Exception):
    """The broker answered a request with an ``error``."""

    def __init__(self, text: str, ref: str = "") -> None:
        super().__init__(text)
        self.text = text
        self.ref = ref


class SessionClosed(Exception):
    """The session is over (ended, or evicted for reading too slowly)."""


class LocalSession:
    """One in-process client session of ``node`` (see the module docstring)."""

    def __init__(
        self, node: BrokerNode, name: str, *, reader: bool = True, account: Account | None = None
    ) -> None:
        self.node = node
        self.name = name
        self.reader = reader
        self.account = account
        """Whose requests these are, when the broker has accounts: its grants apply (the web
        API authenticated the caller); None for the broker's own sessions."""
        self.hop = ""
        self.session = ""
        """The session's name in the overlay (``<name>@<broker>``)."""
        self.closed: str | None = None
        """Why the session ended, once it has."""
        self._pending: deque[list[Envelope]] = deque()
        """Frames of deliveries not read yet: one, or more while a request waits for its
        reply (so that the reply is not stuck behind them)."""
        self._arrived = asyncio.Event()
        self._taken = asyncio.Event()
        self._waiting: dict[str, asyncio.Future[Envelope]] = {}
        self._over = asyncio.Event()

    async def open(self) -> LocalSession:
        """Connect and say hello; raises ``Refused`` if the broker will not have it."""
        self.hop = self.node.attach(self._receive, self._close)
        self.node.broker.admit(self.hop, self.account)
        welcome = await self._ask("", Hello(self.name))
        if not isinstance(welcome, Welcome):  # pragma: no cover - the core answers hello so
            raise Refused(f"unexpected answer to hello: {type(welcome).__name__}")
        self.session = welcome.session
        return self

    async def close(self) -> None:
        if self.closed is None:
            self.closed = "closed"
            self._over.set()
            self._taken.set()
            await self.node.detach(self.hop)

    def send(self, *messages: Envelope) -> None:
        """Messages that get no reply (publications, acknowledgements)."""
        self._check_open()
        self.node.submit(self.hop, messages)

    async def request(self, ref: str, message: Envelope) -> Ok:
        """A request answered by ``ok`` (returned) or ``error`` (raised as ``Refused``)."""
        reply = await self._ask(ref, message)
        if isinstance(reply, Ok):
            return reply
        raise Refused(f"unexpected answer: {type(reply).__name__}", ref)

    async def query(self, what: str) -> tuple[str, ...]:
        """A routing table of the broker, as its rows (``Query``)."""
        reply = await self._ask(f"query:{what}", Query(what))
        if not isinstance(reply, QueryResult):  # pragma: no cover - keyed by its type
            raise Refused(f"unexpected answer: {type(reply).__name__}")
        return reply.rows

    async def exceptions(self, request: Exceptions) -> ExceptionReport:
        """List, replay or purge an exception queue (``Exceptions``); ``Refused`` says why not."""
        reply = await self._ask(request.ref, request)
        if not isinstance(reply, ExceptionReport):  # pragma: no cover - keyed by its ref
            raise Refused(f"unexpected answer: {type(reply).__name__}", request.ref)
        return reply

    async def deliveries(self) -> AsyncIterator[Envelope]:
        """What the broker sends this session besides replies, until the session ends (then
        ``SessionClosed`` says why)."""
        while True:
            while self._pending:
                frame = self._pending.popleft()
                self._taken.set()
                for message in frame:
                    yield message
            if self._over.is_set():
                raise SessionClosed(self.closed or "closed")
            self._arrived.clear()
            arrived = asyncio.ensure_future(self._arrived.wait())
            over = asyncio.ensure_future(self._over.wait())
            try:
                await asyncio.wait([arrived, over], return_when=asyncio.FIRST_COMPLETED)
            finally:
                arrived.cancel()
                over.cancel()

    # -- internals ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed is not None:
            raise SessionClosed(self.closed)

    async def _ask(self, ref: str, message: Envelope) -> Envelope:
        self._check_open()
        waiting: asyncio.Future[Envelope] = asyncio.get_running_loop().create_future()
        self._waiting[ref] = waiting
        try:
            self.node.submit(self.hop, [message])
            async with asyncio.timeout(REPLY_TIMEOUT):
                reply = await waiting
        finally:
            self._waiting.pop(ref, None)
        if isinstance(reply, Error):
            raise Refused(reply.text, reply.ref)
        return reply

    def _reply_key(self, message: Envelope) -> str | None:
        match message:
            case Welcome():
                return ""
            case Ok() | Error() if message.ref in self._waiting:
                return message.ref
            case Error() if "" in self._waiting and not self.session:
                return ""  # the hello was refused
            case QueryResult():
                return f"query:{message.what}"
            case ExceptionReport():
                return message.ref
            case _:
                return None

    async def _receive(self, frame: bytes) -> None:
        """A frame from the node's queue: replies go to their requests, the rest to the
        reader (waiting for it: this is what bounds a slow reader)."""
        rest: list[Envelope] = []
        for item in decode_frame(frame):
            if isinstance(item, Rejected):  # pragma: no cover - the broker's own encoding
                continue
            if isinstance(item, Error) and item.text.startswith(EVICTED):
                self._ending(item.text)  # last words: nothing more will be taken from here
                return
            key = self._reply_key(item)
            waiting = self._waiting.get(key) if key is not None else None
            if waiting is not None and not waiting.done():
                waiting.set_result(item)
            elif self.reader:
                rest.append(item)
        if not rest:
            return
        self._pending.append(rest)
        self._arrived.set()
        while len(self._pending) > 1 and not self._waiting and not self._over.is_set():
            self._taken.clear()
            await self._taken.wait()

    async def _close(self, code: int, reason: str) -> None:
        """The node gave up on the session (eviction)."""
        self._ending(reason)

    def _ending(self, reason: str) -> None:
        """The session is over: readers and requests learn why."""
        if self.closed is None:
            self.closed = reason
        self._over.set()
        self._taken.set()
        for waiting in self._waiting.values():
            with contextlib.suppress(asyncio.InvalidStateError):
                waiting.set_exception(SessionClosed(reason))
