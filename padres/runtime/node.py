"""A broker process: the broker core served over WebSocket (FastAPI on uvicorn), one port.

Clients and neighbour brokers connect alike, to ``ws://host:port/ws``; the first message says
which they are (``hello``). The node dials the neighbours it is given, re-dialling a lost link
with exponential backoff, forever. Every call into the core happens on the event loop's thread,
one message at a time; ``Broker.tick`` is called about once a second.

A frame that is not JSON, too large, or holds a message that does not decode gets an ``error``
reply naming what was wrong; the connection stays open and nothing else is affected.

Flow control (``Limits``, and docs/protocol.md, "Flow control and limits"): every connection
has an outgoing queue bounded in bytes (``Outbox``). A client that reads too slowly loses what
does not fit, is told, and is evicted if it does not catch up; a link to a neighbour never
loses anything: while a link queue is long, the node stops reading from its clients, so TCP
slows the publishers down, and a link queue that overflows all the same is closed and
resynchronised.

Liveness: both sides of every connection ping every ``heartbeat`` seconds, and a peer is
dropped once nothing at all (a pong or any other frame) has come from it for twice that while
this side was reading. A pong that waits behind frames this side has not read yet (a
publisher held back by flow control, a busy broker) does not count against the peer; socket
buffers are kept small so that such a wait stays short.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from itertools import count
from typing import Any, Final

import uvicorn
from fastapi import FastAPI, WebSocket
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from padres.backoff import Backoff
from padres.broker import Broker, Out
from padres.errors import DecodeError
from padres.protocol import (
    MAX_FRAME_BYTES,
    Envelope,
    Error,
    Hello,
    Rejected,
    Role,
    decode_frame,
    websocket_url,
)
from padres.runtime.outbox import Outbox, encode

__all__ = ["EXTENSIONS", "BrokerNode", "Limits", "Observer"]

log = logging.getLogger("padres.broker")

TICK: Final = 1.0
"""Seconds between calls of ``Broker.tick`` (and checks for clients to evict)."""
SOCKET_BUFFER: Final = 256 * 1024
"""Kernel send and receive buffer of every connection, in bytes: what can wait there ahead of
a pong (the kernel doubles it)."""
LINK_FRAMES: Final = 4
"""Frames a dialled link buffers before it stops reading from the socket."""
EXTENSIONS: Final = "padres.node"
"""Entry-point group of the packages that extend every broker node (the web API registers
``web:install`` there): each is called with the node before it serves."""

Observer = Callable[[str, Envelope, list[Out], float], None]
"""Called after the core handled a message: the hop it came from, the message, what the core
sent for it, and the seconds the core took."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What a node queues, and what it does beyond that."""

    client_queue: int = 8 << 20
    """Bytes queued for a client beyond which messages to it are dropped (and counted)."""
    link_queue: int = 64 << 20
    """Bytes queued for a neighbour broker beyond which the link is closed and resynchronised."""
    pause_at: int = 2 << 20
    """When a link queue holds more bytes than this, the node stops reading from clients
    until every link queue holds less than half of it."""
    evict_after: float = 5.0
    """Seconds a client may stay over its queue limit before it is disconnected."""


class _Keepalive(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol, with a keepalive that takes any data from the peer as a
    sign of life and does not blame the peer while this side is not reading: uvicorn reads the
    next frame only once the broker has taken the last one, and the pong waits behind them."""

    heard = 0.0

    def data_received(self, data: bytes) -> None:
        self.heard = self.loop.time()
        super().data_received(data)

    def keepalive_timeout(self) -> None:
        timeout = self.ping_timeout or 0.0
        if self.read_paused or self.loop.time() - self.heard < timeout:
            self.pong_timer = self.loop.call_later(timeout, self.keepalive_timeout)
            return
        super().keepalive_timeout()


class BrokerNode:
    """Serves one ``Broker`` (see the module docstring)."""

    def __init__(
        self,
        broker: Broker,
        *,
        neighbors: Sequence[str] = (),
        heartbeat: float = 5.0,
        limits: Limits | None = None,
    ) -> None:
        self.broker = broker
        self.neighbors = [websocket_url(n) for n in neighbors]
        self.heartbeat = heartbeat
        self.limits = limits or Limits()
        self.started = time.time()
        self.received = 0
        self.rejected = 0
        self.evicted = 0
        self.paused = 0
        """How many times reading from clients was paused (flow control)."""
        self._boxes: dict[str, Outbox] = {}
        self._links: set[str] = set()
        """Hops of neighbour brokers (their outboxes are link queues)."""
        self._heard: dict[str, float] = {}
        """When a frame last came from each dialled link (``time.monotonic()``)."""
        self._departed: Counter[str] = Counter()
        """Counts of the outboxes of connections that are gone."""
        self._reading = asyncio.Event()
        self._reading.set()
        self._hops = count(1)
        self._leaving: set[asyncio.Task[None]] = set()
        self._server: uvicorn.Server | None = None
        self.address: tuple[str, int] | None = None
        """Where the node serves, once it does: host and port."""
        self.observers: list[Observer] = []
        self.services: list[Callable[[], Coroutine[Any, Any, None]]] = []
        """Tasks that run while the node serves (started with it, cancelled with it)."""
        self._extended = False
        self.app = self._build_app()

    # -- serving -----------------------------------------------------------------------------

    def _build_app(self) -> FastAPI:
        app = FastAPI(title=f"padres broker {self.broker.id}")

        @app.websocket("/ws")
        async def session(ws: WebSocket) -> None:
            await ws.accept()
            hop = f"h{next(self._hops)}"
            self._open(hop, ws.send_bytes, ws.close)
            await self._converse(hop, self._read_session(ws, hop))

        @app.get("/health")
        async def health() -> dict[str, Any]:
            return self.status()

        return app

    def status(self) -> dict[str, Any]:
        b = self.broker
        totals = Counter(self._departed)
        for box in self._boxes.values():
            totals.update(box.counts())
        return {
            "broker": b.id,
            "pid": os.getpid(),
            "uptime": round(time.time() - self.started, 3),
            "neighbors": sorted(b.peers.values()),
            "clients": sorted(s.name for s in b.sessions.values()),
            "advertisements": len(b.trees),
            "subscriptions": len(b.routes),
            "received": self.received,
            "rejected": self.rejected,
            "queued": sum(len(box) for box in self._boxes.values()),
            "queued_bytes": sum(box.size for box in self._boxes.values()),
            "sent": totals["sent"],
            "frames": totals["frames"],
            "dropped": totals["dropped"],
            "dropped_bytes": totals["dropped_bytes"],
            "evicted": self.evicted,
            "paused": self.paused,
            "durables": b.durables.statistics(),
        }

    async def serve(
        self, host: str = "127.0.0.1", port: int = 0, ready: Callable[[int], None] | None = None
    ) -> None:
        """Serve until cancelled; ``ready`` gets the bound port once clients may connect."""
        self._extend()
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        _small_buffers(sock)  # accepted connections inherit them
        sock.bind((host, port))
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            ws=_Keepalive,
            ws_max_size=4 * MAX_FRAME_BYTES,
            ws_ping_interval=self.heartbeat,
            ws_ping_timeout=2 * self.heartbeat,
            ws_per_message_deflate=False,  # compressing costs more CPU than it saves here
            lifespan="off",
        )
        self._server = uvicorn.Server(config)
        bound = sock.getsockname()[1]
        self.address = (host, bound)
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(self._dial(url)) for url in self.neighbors]
        tasks.append(loop.create_task(self._tick()))
        tasks += [loop.create_task(service()) for service in self.services]
        serving = loop.create_task(self._server.serve(sockets=[sock]))
        try:
            while not self._server.started:
                if serving.done():
                    await serving  # it failed: raise why
                    return
                await asyncio.sleep(0.01)
            if ready is not None:
                ready(bound)
            await serving
        finally:
            for task in tasks:
                task.cancel()
            self._server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await serving

    def _extend(self) -> None:
        """Let the installed extensions (``EXTENSIONS``) add to this node, once."""
        if self._extended:
            return
        self._extended = True
        for extension in entry_points(group=EXTENSIONS):
            extension.load()(self)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            try:
                self._dispatch(self.broker.tick(time.time()))
                self._evict_laggards()
            except Exception:
                log.exception("%s: failed on a tick", self.broker.id)

    # -- connections -------------------------------------------------------------------------

    def _open(
        self,
        hop: str,
        send: Callable[[bytes], Awaitable[None]],
        close: Callable[[int, str], Awaitable[None]],
    ) -> None:
        """A new connection: a client queue until its ``hello`` says it is a broker."""
        self._boxes[hop] = Outbox(send, close, limit=self.limits.client_queue)

    def attach(
        self,
        send: Callable[[bytes], Awaitable[None]],
        close: Callable[[int, str], Awaitable[None]],
    ) -> str:
        """An in-process client connection (the web API's sessions): returns its hop. What
        the core sends it goes to ``send`` in frames, through a bounded client queue as for a
        socket (a reader too slow for it is evicted: ``close`` is called); ``submit`` hands
        the core its messages, ``detach`` ends it."""
        hop = f"l{next(self._hops)}"
        self._open(hop, send, close)
        self._boxes[hop].gone.add_done_callback(lambda _: self._ended(hop))
        return hop

    def _ended(self, hop: str) -> None:
        """An attached connection's queue gave up on it (eviction): the session is over."""
        if hop in self._boxes:
            task = asyncio.get_running_loop().create_task(self._hang_up(hop))
            self._leaving.add(task)
            task.add_done_callback(self._leaving.discard)

    async def detach(self, hop: str) -> None:
        """End an attached connection: the core closes its session."""
        await self._hang_up(hop)

    def queues(self) -> dict[str, dict[str, Any]]:
        """Every connection's queue now: hop -> its counts, bytes and messages queued, and
        whether it is a link to a neighbour."""
        return {
            hop: {
                **box.counts(),
                "queued": len(box),
                "queued_bytes": box.size,
                "link": hop in self._links,
            }
            for hop, box in self._boxes.items()
        }

    def _link(self, hop: str) -> None:
        """``hop`` is a neighbour broker: its queue becomes a link queue, never thinned."""
        self._links.add(hop)
        self._boxes[hop].make_link(self.limits.link_queue, self._check_flow)

    async def _converse(self, hop: str, reading: Coroutine[Any, Any, None]) -> None:
        """Run ``reading`` (the frames of ``hop``, to the core) until the peer goes or its
        outbox gives up on it; then the connection is over."""
        box = self._boxes[hop]
        reader = asyncio.get_running_loop().create_task(reading)
        try:
            await asyncio.wait([reader, box.gone], return_when=asyncio.FIRST_COMPLETED)
            if box.failing:
                log.warning("%s: closing %s: %s", self.broker.id, hop, box.reason)
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader  # raises what ended the reading, if anything did
        finally:
            reader.cancel()
            await self._hang_up(hop)

    async def _read_session(self, ws: WebSocket, hop: str) -> None:
        """Frames of an accepted connection; a publisher's wait while the links are congested."""
        while True:
            if hop not in self._links and self.broker.publishes(hop):
                await self._reading.wait()
            event = await ws.receive()
            if event["type"] == "websocket.disconnect":
                return
            self.receive(hop, event.get("bytes") or event.get("text") or b"")

    async def _hang_up(self, hop: str) -> None:
        box = self._boxes.pop(hop, None)
        self._links.discard(hop)
        self._heard.pop(hop, None)
        self._dispatch(self.broker.close(hop))
        if box is not None:
            self._departed.update(box.counts())
            await box.close()

    def _evict_laggards(self) -> None:
        """Clients that have stayed over their queue limit too long are disconnected."""
        for box in list(self._boxes.values()):
            if box.droppable and not box.failing and box.over_for() >= self.limits.evict_after:
                self._evict(box)

    def _evict(self, box: Outbox) -> None:
        self.evicted += 1
        box.discard()
        text = (
            f"evicted: you read too slowly; {box.dropped:,} messages ({box.dropped_bytes:,} "
            f"bytes) to you were dropped, and your queue stayed over its limit of "
            f"{box.limit:,} bytes for {self.limits.evict_after:g} s"
        )
        box.fail(1008, "too slow: evicted for not keeping up with its messages", Error(text))

    # -- flow control ------------------------------------------------------------------------

    def _check_flow(self) -> None:
        """Stop reading from publishers while a link queue holds more than ``pause_at``
        bytes, until every one holds less than half of it. Links are always read: holding them
        back could deadlock a cycle of brokers; so are clients that have not advertised, whose
        acknowledgements free what durable subscriptions hold."""
        backlog = max((self._boxes[hop].size for hop in self._links), default=0)
        if self._reading.is_set() and backlog > self.limits.pause_at:
            self._reading.clear()
            self.paused += 1
        elif not self._reading.is_set() and backlog < self.limits.pause_at // 2:
            self._reading.set()

    # -- links to neighbours -----------------------------------------------------------------

    async def _dial(self, url: str) -> None:
        """Keep a link to ``url``: dial, serve it, and dial again when it is lost."""
        backoff = Backoff()
        while True:
            try:
                async with connect(
                    url,
                    ping_interval=None,  # the node's own keepalive (see _keepalive)
                    max_queue=LINK_FRAMES,
                    max_size=4 * MAX_FRAME_BYTES,
                    open_timeout=10,
                    close_timeout=self.heartbeat,
                    compression=None,
                ) as ws:
                    log.info("%s: linked to %s", self.broker.id, url)
                    backoff.reset()
                    await self._serve_link(ws)
            except (OSError, TimeoutError, ConnectionClosed, InvalidHandshake) as exc:
                log.info("%s: link to %s: %s", self.broker.id, url, exc or type(exc).__name__)
            except InvalidURI as exc:
                log.error("%s: bad neighbour address %s: %s", self.broker.id, url, exc)
                return
            except Exception:  # whatever went wrong, the link is dialled again
                log.exception("%s: link to %s failed", self.broker.id, url)
            await backoff.wait()

    async def _serve_link(self, ws: ClientConnection) -> None:
        _small_buffers(ws.transport.get_extra_info("socket"))
        hop = f"n{next(self._hops)}"
        self._open(hop, ws.send, ws.close)
        self._link(hop)
        self._dispatch(self.broker.open_link(hop))
        keepalive = asyncio.get_running_loop().create_task(self._keepalive(ws, hop))
        try:
            await self._converse(hop, self._read_link(ws, hop))
        finally:
            keepalive.cancel()

    async def _read_link(self, ws: ClientConnection, hop: str) -> None:
        async for data in ws:
            self._heard[hop] = time.monotonic()
            self.receive(hop, data)

    async def _keepalive(self, ws: ClientConnection, hop: str) -> None:
        """Ping the neighbour every heartbeat; close the link once neither the pong nor any
        other frame has come for twice that."""
        timeout = 2 * self.heartbeat
        pong: asyncio.Future[float] | None = None
        pinged = 0.0
        with contextlib.suppress(ConnectionClosed):  # the link is going anyway
            while True:
                await asyncio.sleep(self.heartbeat)
                now = time.monotonic()
                if pong is None or pong.done():
                    pong, pinged = asyncio.ensure_future(await ws.ping()), now
                elif now - max(pinged, self._heard.get(hop, 0.0)) >= timeout:
                    log.warning("%s: %s stopped answering", self.broker.id, hop)
                    await ws.close(1011, "keepalive ping timeout")
                    return

    # -- messages ----------------------------------------------------------------------------

    def receive(self, hop: str, data: bytes | str) -> None:
        """One frame from ``hop``: decode, hand every message to the core, send the results.

        Whatever goes wrong costs this frame at most: it is logged, and the connection goes on.
        """
        try:
            self._receive(hop, data)
        except Exception:
            log.exception("%s: failed on a frame from %s", self.broker.id, hop)

    def _receive(self, hop: str, data: bytes | str) -> None:
        try:
            items = decode_frame(data)
        except DecodeError as exc:
            self.rejected += 1
            self._dispatch([(hop, Error(f"frame refused: {exc}"))])
            return
        self.submit(hop, items)

    def submit(self, hop: str, items: Sequence[Envelope | Rejected]) -> None:
        """Hand the core the messages of one frame from ``hop``, in order, and send what it
        answers."""
        now = time.time()
        outs: list[Out] = []
        for item in items:
            if isinstance(item, Rejected):
                self.rejected += 1
                outs.append((hop, Error(f"message refused: {item.error}", item.ref)))
                continue
            self.received += 1
            try:
                started = time.perf_counter()
                handled = self.broker.handle(item, hop, now)
                took = time.perf_counter() - started
                outs += handled
                for observe in self.observers:
                    observe(hop, item, handled, took)
            except Exception as exc:  # a bug must cost one message, not the broker
                log.exception("%s: failed on a message from %s", self.broker.id, hop)
                outs.append((hop, Error(f"internal error: {type(exc).__name__}: {exc}")))
            if isinstance(item, Hello) and item.role is Role.BROKER:
                self._promote(hop)
        self._dispatch(outs)

    def _promote(self, hop: str) -> None:
        """A broker's ``hello`` on an accepted connection: once the core has taken it as a
        neighbour, its queue is a link queue like the dialling side's."""
        if hop not in self._links and hop in self.broker.peers:
            self._link(hop)

    def _dispatch(self, outs: list[Out]) -> None:
        """Queue each message, encoded once however many hops it goes to. The journal is
        committed first: nothing is sent ahead of what the broker promised on disk."""
        self.broker.journal.commit()
        encoded: dict[int, bytes] = {}
        for hop, message in outs:
            box = self._boxes.get(hop)
            if box is None:
                continue
            data = encoded.get(id(message))
            if data is None:
                data = encoded[id(message)] = encode(message)
            if not box.put(data) and box.droppable and box.dropped == 1:
                log.warning("%s: %s is too slow: dropping what it cannot take", self.broker.id, hop)
        self._check_flow()


def _small_buffers(sock: socket.socket) -> None:
    """Bound the kernel's socket buffers (see ``SOCKET_BUFFER``)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
