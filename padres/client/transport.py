"""How a client reaches its broker: a transport carries encoded frames both ways.

Two transports exist: ``WebSocketTransport`` dials a broker's ``ws://`` or ``wss://`` endpoint,
and ``AttachedTransport`` is a connection of a ``BrokerNode`` in the client's own process (the
web API's sessions, tests that run a cluster in one process). Both go through the same walk at
the broker as a socket's frames (decoding limits, authentication, the bounded client queue and
its eviction), so that a client behaves alike on either.

A transport is made by a *dialler* (``Dialler``): the client calls it to connect, and again to
reconnect. A dialler of several brokers' endpoints (``dial``) fails over between them.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Final, Protocol

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from padres.errors import ConnectError, ConnectionLost
from padres.model.protocol import MAX_FRAME_BYTES
from padres.runtime.compression import LEVEL, client_extensions

if TYPE_CHECKING:
    from padres.runtime.node import BrokerNode
    from padres.security.accounts import Account

__all__ = ["AttachedTransport", "Dialler", "Transport", "WebSocketTransport", "attached", "dial"]

ATTACHED_FRAMES: Final = 4
"""Frames an attached transport holds for its client before the node's queue for it waits."""


class Transport(Protocol):
    """One connection to a broker."""

    url: str
    """What it is connected to."""
    reason: str
    """Why the connection ended, once it has (the broker's last word, if it said one)."""

    async def send(self, frame: bytes) -> None:
        """Send an encoded frame; ``ConnectionLost`` if the connection is over."""

    def frames(self) -> AsyncIterator[bytes]:
        """The frames from the broker, until the connection ends."""

    async def close(self) -> None:
        """End the connection (nothing happens if it is over)."""


Dialler = Callable[[], Awaitable[Transport]]
"""Connects to a broker: called once to connect, and again for each reconnect."""


class WebSocketTransport:
    """A WebSocket connection to a broker's endpoint."""

    def __init__(self, url: str, ws: ClientConnection) -> None:
        self.url = url
        self.reason = ""
        self._ws = ws

    @property
    def compressed(self) -> bool:
        """Whether the broker accepted compression (permessage-deflate) on this connection."""
        return any(e.name == "permessage-deflate" for e in self._ws.protocol.extensions)

    async def send(self, frame: bytes) -> None:
        try:
            await self._ws.send(frame)
        except ConnectionClosed as exc:
            raise ConnectionLost(f"connection to {self.url} closed: {exc}") from None

    async def frames(self) -> AsyncIterator[bytes]:
        try:
            async for data in self._ws:
                yield data if isinstance(data, bytes) else data.encode()
        except ConnectionClosed:
            pass
        finally:
            closing = self._ws.close_reason
            self.reason = closing or f"connection to {self.url} closed"

    async def close(self) -> None:
        await self._ws.close()


def dial(
    urls: Sequence[str], *, timeout: float, tls: ssl.SSLContext | None, compress: bool = False
) -> Dialler:
    """A dialler of the WebSocket endpoints ``urls`` (of brokers of one overlay): it tries
    each in turn, starting with the last that answered; ``ConnectError`` if none does.
    ``compress``: offer permessage-deflate (``padres.runtime.compression``); a broker that
    accepts it compresses what it sends, and so does the client."""
    if not urls:
        raise ValueError("no broker URL to dial")
    order = list(urls)
    extensions = client_extensions(LEVEL if compress else None)

    async def connected() -> Transport:
        failures = []
        for url in list(order):
            try:
                ws = await connect(
                    url,
                    max_size=4 * MAX_FRAME_BYTES,
                    open_timeout=timeout,
                    compression=None,
                    extensions=extensions,
                    ssl=tls,
                )
            except (OSError, TimeoutError, InvalidHandshake) as exc:
                failures.append(f"{url}: {exc}")
                continue
            order.remove(url)
            order.insert(0, url)
            return WebSocketTransport(url, ws)
        raise ConnectError(f"cannot connect to {'; '.join(failures)}")

    return connected


class AttachedTransport:
    """A connection of ``node`` in this process (``BrokerNode.attach``).

    Frames to the broker take the walk of a socket's frames (``BrokerNode.read``). Frames
    from it come from the node's bounded client queue: a client that does not keep up holds
    up that queue, and is evicted as a socket's client would be; the broker's last words and
    the reason it gave end the frames."""

    def __init__(
        self,
        node: BrokerNode,
        account: Account | None = None,
        trusted: bool = False,
        queue_limit: int | None = None,
    ) -> None:
        self.node = node
        self.url = f"{node.broker.id} (in this process)"
        self.reason = ""
        self._frames: deque[bytes] = deque()
        self._changed = asyncio.Event()
        """Set when a frame arrives, one is taken, or the connection ends."""
        self._open = True
        self.hop = node.attach(self._arrived, self._end, queue_limit)
        if trusted:
            node.broker.admit(self.hop, account)

    async def send(self, frame: bytes) -> None:
        if not self._open:
            raise ConnectionLost(f"connection to {self.node.broker.id} closed: {self.reason}")
        await self.node.read(self.hop, frame)

    async def frames(self) -> AsyncIterator[bytes]:
        while self._frames or self._open:
            if self._frames:
                frame = self._frames.popleft()
                self._changed.set()
                yield frame
            else:
                self._changed.clear()
                await self._changed.wait()

    async def close(self) -> None:
        if self._open:
            self._end("closed")
            await self.node.detach(self.hop)

    async def _arrived(self, frame: bytes) -> None:
        """A frame from the node's queue for this connection: waits while the client holds
        ``ATTACHED_FRAMES`` it has not read."""
        while self._open and len(self._frames) >= ATTACHED_FRAMES:
            self._changed.clear()
            await self._changed.wait()
        if self._open:
            self._frames.append(frame)
            self._changed.set()

    def _end(self, reason: str) -> None:
        """The connection is over: closed here, or the node gave up on it (evicted, or its
        hello refused)."""
        if self._open:
            self._open = False
            self.reason = reason
            self._changed.set()


def attached(
    node: BrokerNode,
    account: Account | None = None,
    trusted: bool = False,
    queue_limit: int | None = None,
) -> Dialler:
    """A dialler of ``node`` in this process. ``trusted``: the caller has authenticated whom
    the connection acts for (the web API its users): ``account``'s grants apply, or with no
    account the broker's own rights (its monitor, the API's own requests); else the client's
    hello is checked as a socket's is. ``queue_limit``: the bytes the node may queue for it
    (``BrokerNode.attach``)."""

    async def connected() -> Transport:
        if not node.serving:
            raise ConnectError(f"cannot connect to {node.broker.id}: it is not serving")
        return AttachedTransport(node, account, trusted, queue_limit)

    return connected
