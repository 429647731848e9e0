"""A broker process: the broker core served over WebSocket (an ASGI app on uvicorn), one port.

Clients and neighbour brokers connect alike, to ``ws://host:port/ws``; the first message says
which they are (``hello``). ``/health`` answers liveness; every other path goes to the ASGI app
an extension mounts (the web API, with ``padres[web]``), else gets 404. The node dials the
neighbours it is given, re-dialling a lost link with exponential backoff, forever. Every call
into the core happens on the event loop's thread, one message at a time; ``Broker.tick`` is
called about once a second.

A frame that is not JSON, too large, or holds a message that does not decode gets an ``error``
reply naming what was wrong; the connection stays open and nothing else is affected.

Flow control (``Limits``, and docs/protocol.md, "Flow control and limits"): every connection
has an outgoing queue bounded in bytes (``SendQueue``). A client that reads too slowly loses what
does not fit, is told, and is evicted if it does not catch up; a link to a neighbour never
loses anything: while a link queue is long, the node stops reading from its clients, so TCP
slows the publishers down, and a link queue that overflows all the same is closed and
resynchronised. A link that ends with messages unsent (it overflowed, a write failed, the
neighbour stopped answering or died) loses them; the publishers of the plain publications
among them are told (``_report_unsent``, ``Broker.lost``).

Liveness: both sides of every connection ping every ``heartbeat`` seconds, and a peer is
dropped once nothing at all (a pong or any other frame) has come from it for twice that while
this side was reading. A pong that waits behind frames this side has not read yet (a
publisher held back by flow control, a busy broker) does not count against the peer; socket
buffers are kept small so that such a wait stays short.

Compression: a connection whose peer offers permessage-deflate gets it, at the node's level
(``padres.runtime.compression``); the node offers it to the neighbours it dials if told to.

Measures: besides, every link is measured several times a second by pings that take the
data's way, through the send queues (``padres.runtime.probe``); the node answers a
neighbour's as it reads them, and hands its own measures to the core
(``Broker.measured``), which moves trees away from a neighbour that stopped answering long
before the keepalive gives it up (``padres.broker.paths``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import math
import os
import signal
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, MutableMapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from itertools import count
from typing import Any, Final

import msgspec
import uvicorn
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.extensions.base import ServerExtensionFactory

from padres.broker import Broker, Out
from padres.errors import AuthenticationError, DecodeError, JournalError, missing
from padres.model.protocol import (
    MAX_FRAME_BYTES,
    MAX_FRAME_MESSAGES,
    CompositeNotify,
    Envelope,
    Error,
    GoingAway,
    Hello,
    LinkPing,
    LinkPong,
    Query,
    Rejected,
    ReplayBatch,
    ReplayEnd,
    Role,
    RoutePublish,
    decode_frame,
    websocket_url,
)
from padres.runtime.backoff import Backoff
from padres.runtime.compression import LEVEL, client_extensions, server_extensions
from padres.runtime.connection import Connection, Phase
from padres.runtime.http import http_protocol
from padres.runtime.probe import PROBE
from padres.runtime.pump import Handled, Pump
from padres.runtime.rate import Rate
from padres.runtime.send_queue import QueueStatistics, SendQueue, combined, encode
from padres.runtime.strangers import PER_ADDRESS, Strangers
from padres.runtime.unsent import summarise
from padres.security.tls import ServerTLS, client_context, secure

__all__ = ["EXTENSIONS", "BrokerNode", "Handled", "Limits", "Observer"]

log = logging.getLogger("padres.broker")

TICK: Final = 1.0
"""Seconds between calls of ``Broker.tick`` (and checks for clients to evict)."""
SOCKET_BUFFER: Final = 256 * 1024
"""Kernel send and receive buffer of every connection, in bytes: what can wait there ahead of
a pong (the kernel doubles it)."""
LINK_FRAMES: Final = 4
"""Frames a dialled link buffers before it stops reading from the socket."""
SLICE: Final = 0.02
"""Seconds of core time a frame takes before the node serves other connections."""
NAMESAKE: Final = 1.0
"""Seconds a client's hello waits for a connection of a client of the same name to end."""
EXTENSIONS: Final = "padres.node"
"""Entry-point group of the packages that extend every broker node (the web API registers
``web:install`` there): each is called with the node before it serves."""

Observer = Callable[[str, list[Handled]], None]
"""Called after the core handled some messages of one frame, with the hop they came from and
each of them as ``Handled``, in order."""

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
"""An ASGI 3 application, as uvicorn serves it (``scope``, ``receive``, ``send``)."""


PENALISED: Final = 10_000
"""Addresses remembered for a connection disconnected for refused messages, at most."""
REFUSED_TOO_OFTEN: Final = "too many refused requests"
"""The reason given when a client connection is closed for ``Limits.refusals_slowed``."""
_ANSWERS: Final = (b'[{"type":"replay_batch",', '[{"type":"replay_batch",')
"""How a replay node's frame of answers begins (``Client.answer``), as bytes and as text.

The publications of such a frame, from a client with a replay offer standing, are decoded
without checking the rules of the language again (``checked_before``), as a dialled
neighbour's are: the node read them from its store, which took them from a broker that had
checked them. Their types are checked all the same, its replay grants too (``Guard``), and a
frame that turns out to hold anything but answers is decoded again with every check."""
_ANSWER_TYPES: Final = frozenset({ReplayBatch, ReplayEnd})


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
    frame_bytes: int = MAX_FRAME_BYTES
    """Bytes of a frame beyond which it is refused, unread (four times more closes the
    connection: the WebSocket layer does not take it in)."""
    frame_messages: int = MAX_FRAME_MESSAGES
    """Messages of a client's frame beyond which it is refused (a neighbour's frames are
    bounded in bytes only: a link loses nothing)."""
    queries_per_second: float = 10.0
    """Queries of its tables a connection may make a second (each costs time in proportion to
    the tables); more are refused."""
    refusals_per_second: float = 100.0
    """Messages of a client connection the broker may refuse a second, on average (with a
    burst of ``refusals_burst``); past that, the connection's next frame is read only once it
    is back within the rate: a client whose requests are refused is slowed, not the others."""
    refusals_burst: int = 1_000
    """Refused messages a client connection may cause at once before it is slowed (a client
    whose subscriptions a new schema refuses when it reconnects, say): ten times
    ``refusals_per_second`` by default."""
    refusals_slowed: float = 30.0
    """Seconds a client connection may stay slowed for refused messages on end, or owe at
    once; past that, it is disconnected (1008) with an ``error`` saying why."""
    hello_within: float = 5.0
    """Seconds a connection may stay open before the broker has accepted its ``hello`` (or,
    over HTTP, before a request's headers are in); then it is closed, so that connections that
    never say who they are hold nothing for long."""
    strangers_per_address: int = PER_ADDRESS
    """Connections from one address that have not said who they are, at most (``Strangers``)."""
    strangers: int | None = None
    """Such connections in all, at most (None: ``strangers.default_total()``, a quarter of
    the file descriptors the process may open, 4,096 at most)."""
    rest_idle: float = 600.0
    """Seconds a plain subscription made over the web API may go unread (no stream reading it)
    before it is removed: a REST client that went away does not hold one for ever."""
    drain_within: float = 10.0
    """Seconds a broker told to stop (SIGTERM) waits for its clients to leave and its queues
    to empty before it closes what is left."""


class _Keepalive(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol, with a keepalive that takes any data from the peer as a
    sign of life and does not blame the peer while this side is not reading: uvicorn reads the
    next frame only once the broker has taken the last one, and the pong waits behind them.
    It negotiates ``extensions`` (permessage-deflate at the node's level, or nothing), which
    ``_websocket_protocol`` binds."""

    heard = 0.0
    extensions: Sequence[ServerExtensionFactory] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn.available_extensions = list(self.extensions)

    def data_received(self, data: bytes) -> None:
        self.heard = self.loop.time()
        super().data_received(data)

    def keepalive_timeout(self) -> None:
        timeout = self.ping_timeout or 0.0
        if self.read_paused or self.loop.time() - self.heard < timeout:
            self.pong_timer = self.loop.call_later(timeout, self.keepalive_timeout)
            return
        super().keepalive_timeout()
        self.transport.abort()  # a peer that stopped reading would hold a close behind its data


def _websocket_protocol(extensions: Sequence[ServerExtensionFactory]) -> type[_Keepalive]:
    """``_Keepalive`` negotiating ``extensions``."""
    return type("Keepalive", (_Keepalive,), {"extensions": extensions})


class BrokerNode:
    """Serves one ``Broker`` (see the module docstring)."""

    def __init__(
        self,
        broker: Broker,
        *,
        neighbours: Sequence[str] = (),
        heartbeat: float = 5.0,
        limits: Limits | None = None,
        tls: ServerTLS | None = None,
        tls_ca: str | None = None,
        compression: int | None = LEVEL,
        compress_links: bool = False,
    ) -> None:
        """``tls``: serve ``wss://`` (and the web API ``https://``) with this certificate;
        ``tls_ca``: the CA file that ``wss://`` neighbours' certificates are checked against
        (the system's trusted authorities if None). ``compression``: the zlib level (1 to 9)
        at which the node compresses what it sends on a connection whose peer offered
        permessage-deflate (None: it accepts no compression); ``compress_links``: the node
        offers it to the neighbours it dials (``padres.runtime.compression``)."""
        self.broker = broker
        self.neighbours = [websocket_url(n) for n in neighbours]
        self.heartbeat = heartbeat
        self.limits = limits or Limits()
        self.tls = tls
        self._server_extensions = server_extensions(compression)  # refuses a bad level now
        self._link_extensions = client_extensions(compression if compress_links else None)
        if tls is not None:
            tls.context()  # refuses unusable files now, not once serving
        self._dial_tls = (
            client_context(tls_ca) if tls_ca or any(map(secure, self.neighbours)) else None
        )
        self.started = time.time()
        self.strangers = Strangers(self.limits.strangers_per_address, self.limits.strangers)
        """Connections that have not said who they are (``padres.runtime.strangers``)."""
        self._penalised: dict[str, float] = {}
        """Addresses whose connection was disconnected for refused messages -> until when
        (``time.monotonic()``) a new connection from them starts without a burst."""
        self._pump = Pump(broker, self._queue, screen=self._screen)
        """Walks the frames of every connection through the core (``receive``)."""
        self._refused = 0
        """Frames refused whole (``_decode``); the pump counts the messages it refuses."""
        self.evicted = 0
        self.paused = 0
        """How many times reading from clients was paused (flow control)."""
        self._connections: dict[str, Connection] = {}
        """Every open connection by its hop."""
        self._departed = QueueStatistics()
        """What the queues of connections gone since the start sent and dropped."""
        self._departed_links = QueueStatistics()
        """The same, of the links to neighbours among them."""
        self._reading = asyncio.Event()
        self._reading.set()
        self._congested = False
        """Whether one of this node's link queues is over ``Limits.pause_at`` (until it is
        under half of it)."""
        self._hops = count(1)
        self._leaving: set[asyncio.Task[None]] = set()
        self._server: uvicorn.Server | None = None
        self.address: tuple[str, int] | None = None
        """Where the node serves, once it does: host and port."""
        self.serving = False
        """Whether ``serve`` runs and has started: clients may connect."""
        self.draining = False
        """Whether the node was told to stop and is draining (``drain``)."""
        self._links: dict[str, str] = {}
        """The neighbours this node dials: URL -> the hop of its latest link."""
        self.failure: JournalError | None = None
        """Why the node stopped serving on its own: its journal failed (``_dispatch``)."""
        self.observers: list[Observer] = []
        self.services: list[Callable[[], Coroutine[Any, Any, None]]] = []
        """Tasks that run while the node serves (started with it, cancelled with it)."""
        self._extended = False
        self._mounted: ASGIApp | None = None

    # -- serving -----------------------------------------------------------------------------

    def mount(self, app: ASGIApp) -> None:
        """Serve every path but ``/ws`` and ``/health`` with ``app`` (an extension's)."""
        self._mounted = app

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The node's ASGI app: the WebSocket endpoint, liveness, then what is mounted."""
        path = scope.get("path")
        if scope["type"] == "websocket" and path == "/ws":
            await self._accept(scope, receive, send)
        elif scope["type"] == "http" and path == "/health":
            await _respond(send, 200, msgspec.json.encode(self.health()))
        elif scope["type"] == "http" and path == "/ready":
            readiness = self.readiness()
            await _respond(send, 200 if readiness["ready"] else 503, msgspec.json.encode(readiness))
        elif self._mounted is not None:
            await self._mounted(scope, receive, send)
        elif scope["type"] == "http":
            await _respond(send, 404, b'{"detail":"Not Found"}')
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1000, "reason": ""})

    async def _accept(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        hop = f"h{next(self._hops)}"
        client = scope.get("client")
        why = self.strangers.arrive(hop, client[0] if client else "an unknown address")
        if why is not None:
            log.warning("%s: refused a connection: %s", self.broker.id, why)
            await send({"type": "websocket.close", "code": 1013, "reason": why[:120]})
            return
        await send({"type": "websocket.accept"})

        async def send_bytes(data: bytes) -> None:
            await send({"type": "websocket.send", "bytes": data})

        async def close(code: int, reason: str) -> None:
            await send({"type": "websocket.close", "code": code, "reason": reason})

        self._open(hop, send_bytes, close, address=client[0] if client else "")
        await self._converse(hop, self._read_session(receive, hop))

    def health(self) -> dict[str, Any]:
        """Liveness and the node's figures; a broker with accounts answers liveness only (its
        id and uptime): the figures name its clients and neighbours, and the web API's
        /api/v1/broker gives them to administrators."""
        if self.broker.guard is not None:
            return {"broker": self.broker.id, "uptime": round(time.time() - self.started, 3)}
        return self.status()

    def durables(self) -> list[dict[str, Any]]:
        """The durable subscriptions kept here (``Durables.statistics``), each with the time
        of its oldest delivery not yet acknowledged (None when nothing waits)."""
        durables = self.broker.durables
        out = durables.statistics()
        for row in out:
            oldest = durables.delivery(row["owner"], row["name"], row["acked"] + 1)
            if isinstance(oldest, CompositeNotify):  # a match: as old as its last publication
                oldest = max(oldest.publications, key=lambda pub: pub.timestamp)
            row["oldest"] = None if oldest is None else oldest.timestamp.isoformat()
        return out

    def drop_durable(self, owner: str, name: str) -> bool:
        """Delete durable subscription ``name`` of client ``owner`` (an administrator's act):
        whether there was one."""
        outs = self.broker.drop_durable(owner, name)
        if outs is None:
            return False
        log.warning("%s: durable subscription %r of %s deleted", self.broker.id, name, owner)
        self._dispatch(outs)
        return True

    def disconnect(self, name: str, why: str) -> bool:
        """Close the connection of client ``name`` (an administrator's act), telling it
        ``why``: whether it was connected."""
        for hop, session in self.broker.sessions.items():
            connection = self._connections.get(hop)
            if session.name == name and connection is not None:
                log.warning("%s: closing client %s: %s", self.broker.id, name, why)
                connection.queue.fail(1008, why[:120], Error(why))
                return True
        return False

    def readiness(self) -> dict[str, Any]:
        """Whether the broker is ready for clients: it listens, its journal works, it is not
        shutting down, and it is linked to every neighbour it was told to dial (those it is
        not are ``missing``; a broker with accounts says only whether it is ready)."""
        missing = sorted(
            url for url in self.neighbours if self._links.get(url) not in self.broker.peers
        )
        ready = self.serving and not self.draining and self.failure is None and not missing
        if self.broker.guard is not None:
            return {"broker": self.broker.id, "ready": ready}
        return {
            "broker": self.broker.id,
            "ready": ready,
            "listening": self.serving,
            "draining": self.draining,
            "journal": "failed" if self.failure is not None else "ok",
            "missing": missing,
        }

    def status(self) -> dict[str, Any]:
        b = self.broker
        queues = [(c.link, c.queue.statistics()) for c in self._connections.values()]
        totals = combined([self._departed, *(q for _, q in queues)])
        links = combined([self._departed_links, *(q for link, q in queues if link)])
        return {
            "broker": b.id,
            "pid": os.getpid(),
            "uptime": round(time.time() - self.started, 3),
            "neighbours": sorted(b.peers.values()),
            "clients": sorted(s.name for s in b.sessions.values()),
            "advertisements": len(b.trees),
            "subscriptions": len(b.routes),
            "forwarded": b.routes.forwarded(),
            "merged": b.routes.mergers.statistics()._asdict(),
            "unwanted": b.routes.unwanted,
            "trusted": b.routes.trusted,
            "received": self._pump.received,
            "rejected": self._pump.rejected + self._refused,
            **totals._asdict(),
            "to_neighbours": {k: getattr(links, k) for k in ("sent", "frames", "sent_bytes")},
            "evicted": self.evicted,
            "paused": self.paused,
            "congested": self._congested,
            "congested_elsewhere": b.congestion.origins(time.time()),
            "durables": b.durables.statistics(),
            "exceptions": b.dead_letters.queues(),
            "transactions": b.transactions.statistics(),
            "votes": b.votes.statistics(),
            "paths": b.paths.statistics(b.peers),
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
        self._announce_security(host)
        config = uvicorn.Config(
            self.app,
            interface="asgi3",
            log_level="warning",
            ws=_websocket_protocol(self._server_extensions),
            http=http_protocol(self.strangers, self.limits.hello_within),
            ws_max_size=4 * self.limits.frame_bytes,
            ws_ping_interval=self.heartbeat,
            ws_ping_timeout=2 * self.heartbeat,
            ws_per_message_deflate=False,  # negotiated by the protocol's own extensions
            lifespan="off",
            ssl_certfile=self.tls.cert if self.tls else None,
            ssl_keyfile=self.tls.key if self.tls else None,
        )
        self._server = _Server(config, self.drain)
        bound = sock.getsockname()[1]
        self.address = (host, bound)
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(self._dial(url)) for url in self.neighbours]
        tasks.append(loop.create_task(self._tick()))
        tasks.append(loop.create_task(self._measure()))
        tasks += [loop.create_task(service()) for service in self.services]
        serving = loop.create_task(self._server.serve(sockets=[sock]))
        try:
            while not self._server.started:
                if serving.done():
                    await serving  # it failed: raise why
                    return
                await asyncio.sleep(0.01)
            self.serving = True
            if ready is not None:
                ready(bound)
            await serving
            if self.failure is not None:
                raise self.failure
        finally:
            self.serving = False
            for task in tasks:
                task.cancel()
            self._server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await serving
            sock.close()

    async def drain(self) -> None:
        """Told to stop: no connection is accepted any more (the server closed its socket);
        each client is asked to go (``GoingAway``), and what it sent until it closes its
        side is still handled; then the queues are given until ``Limits.drain_within`` to
        empty, to clients and to neighbours, before the server closes what is left. A node
        whose journal failed does not drain: it stops with what the journal holds."""
        if self.failure is not None:
            return
        self.draining = True
        started = time.monotonic()
        deadline = started + self.limits.drain_within
        notice = encode(GoingAway(self.broker.id, "the broker is shutting down"))
        told: list[str] = []
        for hop, connection in self._connections.items():
            # Clients over the network; those in this process (the web API's) stay to the end.
            if hop in self.broker.sessions and connection.address and connection.queue.put(notice):
                told.append(hop)
        log.info("%s: shutting down: %d clients asked to go elsewhere", self.broker.id, len(told))
        while time.monotonic() < deadline and any(hop in self._connections for hop in told):
            await asyncio.sleep(0.02)
        while time.monotonic() < deadline and any(c.queue.size for c in self._connections.values()):
            await asyncio.sleep(0.02)
        stayed = sum(hop in self._connections for hop in told)
        left = combined(c.queue.statistics() for c in self._connections.values())
        log.info(
            "%s: drained in %.1f s: %d of %d clients left, %d messages (%d bytes) not sent",
            self.broker.id,
            time.monotonic() - started,
            len(told) - stayed,
            len(told),
            left.queued,
            left.queued_bytes,
        )

    def _announce_security(self, host: str) -> None:
        """Say in the log who may use this broker: loudly, if anyone who reaches it may."""
        guard = self.broker.guard
        if guard is not None:
            log.info(
                "%s: %d accounts from %s: clients and neighbours must authenticate",
                self.broker.id,
                len(guard.accounts),
                guard.accounts.path,
            )
        elif _loopback(host):
            log.info(
                "%s: no accounts file: every client may do anything (listening on loopback "
                "only; see docs/security.md)",
                self.broker.id,
            )
        else:
            log.warning(
                "%s: SECURITY WARNING: listening on %s without an accounts file: anyone who "
                "can reach this port may read, publish and control everything, and join the "
                "overlay as a broker; give --accounts (docs/security.md)",
                self.broker.id,
                host,
            )

    def _extend(self) -> None:
        """Let the installed extensions (``EXTENSIONS``) add to this node, once."""
        if self._extended:
            return
        self._extended = True
        for extension in entry_points(group=EXTENSIONS):
            try:
                install = extension.load()
            except ModuleNotFoundError as exc:  # its extra is not installed: serve without it
                log.info("%s: %s not served: %s", self.broker.id, extension.name, missing(exc))
                continue
            install(self)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            try:
                if self.broker.guard is not None:
                    self.broker.guard.accounts.refresh()
                self._dispatch(self.broker.tick(time.time()))
                self._check_flow()  # a congestion elsewhere may be over, or due to be told
                self._evict_laggards()
                self._close_strangers()
            except Exception:
                log.exception("%s: failed on a tick", self.broker.id)

    async def _measure(self) -> None:
        """Ping every link when due, and hand the core the links' measures."""
        while True:
            await asyncio.sleep(PROBE / 2)
            try:
                self._dispatch(self.measured())
            except Exception:
                log.exception("%s: failed measuring the links", self.broker.id)

    def measured(self) -> list[Out]:
        """Send the pings due, and what the core answers the links' measures now."""
        now = time.monotonic()
        peers = self.broker.peers
        states = {}
        for hop, connection in self._connections.items():
            if not connection.link or hop not in peers:
                continue
            ping = connection.probe.ping(now)
            if ping is not None:
                connection.queue.put(encode(ping))
            states[hop] = connection.probe.state(now)
        return self.broker.measured(states, time.time())

    # -- connections -------------------------------------------------------------------------

    def _open(
        self,
        hop: str,
        send: Callable[[bytes], Awaitable[None]],
        close: Callable[[int, str], Awaitable[None]],
        dialled: bool = False,
        queue_limit: int | None = None,
        address: str = "",
    ) -> Connection:
        """A new connection (from ``address``, if it came in over the network): a client
        queue (of ``queue_limit`` bytes, or ``Limits.client_queue``) until its ``hello`` says
        it is a broker. One from an address whose connection was disconnected for its
        refused messages less than ``Limits.refusals_slowed`` seconds ago starts without its
        burst of refusals: dialling again does not buy another."""
        limits = self.limits
        queue = SendQueue(send, close, limit=queue_limit or limits.client_queue)
        queries = Rate(limits.queries_per_second)
        refusals = Rate(limits.refusals_per_second, limits.refusals_burst)
        if self._penalised.get(address, 0.0) > time.monotonic():
            refusals.charge(limits.refusals_burst)
        connection = self._connections[hop] = Connection(
            hop, queue, queries, refusals, address=address, dialled=dialled
        )
        if dialled:
            self._link(connection)
        return connection

    def attach(
        self,
        send: Callable[[bytes], Awaitable[None]],
        ended: Callable[[str], None],
        queue_limit: int | None = None,
    ) -> str:
        """An in-process client connection (``padres.client.transport``): returns its hop.
        What the core sends it goes to ``send`` in frames, through a bounded client queue as
        for a socket (of ``queue_limit`` bytes, or ``Limits.client_queue``); ``read`` hands
        the core its frames, ``detach`` ends it. If the node gives up on it first (a reader
        too slow for its queue is evicted; a refused hello), ``ended`` is called with the
        reason, once the last words have been sent or their grace period is over."""
        hop = f"l{next(self._hops)}"
        queue = self._open(hop, send, _nothing_to_close, queue_limit=queue_limit).queue

        def gone(_: object) -> None:
            if hop in self._connections:  # not detached: the node gave up on it
                ended(queue.reason or "the broker ended the connection")
                task = asyncio.get_running_loop().create_task(self._hang_up(hop))
                self._leaving.add(task)
                task.add_done_callback(self._leaving.discard)

        queue.gone.add_done_callback(gone)
        return hop

    async def detach(self, hop: str) -> None:
        """End an attached connection: the core closes its session."""
        await self._hang_up(hop)

    def queues(self) -> dict[str, dict[str, Any]]:
        """Every connection's queue now: hop -> its counts, bytes and messages queued,
        whether it is a link to a neighbour, the address it came from ("" for one dialled or
        attached in this process) and since when (``time.time()``)."""
        now, wall = time.monotonic(), time.time()
        return {
            hop: {
                **c.queue.statistics()._asdict(),
                "link": c.link,
                "address": c.address,
                "since": round(wall - (now - c.opened), 3),
            }
            for hop, c in self._connections.items()
        }

    def _link(self, connection: Connection) -> None:
        """``connection`` joins a neighbour broker: its queue becomes a link queue, never
        thinned."""
        connection.move(Phase.LINK)
        connection.queue.make_link(self.limits.link_queue, self._check_flow)

    async def _converse(self, hop: str, reading: Coroutine[Any, Any, None]) -> None:
        """Run ``reading`` (the frames of ``hop``, to the core) until the peer goes or its
        outbox gives up on it; then the connection is over."""
        box = self._connections[hop].queue
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

    async def _read_session(self, receive: Receive, hop: str) -> None:
        """Frames of an accepted connection; a publisher's wait while the links are congested."""
        while True:
            event = await receive()
            if event["type"] == "websocket.disconnect":
                return
            await self.read(hop, event.get("bytes") or event.get("text") or b"")

    async def read(self, hop: str, data: bytes | str) -> None:
        """A frame from client connection ``hop`` (a socket's, or an attached one's): once
        the links are not congested if ``hop`` publishes, its hello's password checked off
        the event loop, handed to the core (``receive``); then, if it is refused too often,
        a wait (``_slow``). Nothing, if ``hop`` is over."""
        connection = self._connections.get(hop)
        if connection is None:
            return
        if not connection.link and self.broker.publishes(hop):
            await self._reading.wait()
        await self._authenticate(hop, data)
        await self.receive(hop, data)
        await self._slow(connection)

    async def _slow(self, connection: Connection) -> None:
        """Wait, before the next frame of ``connection`` is read, until it is back within its
        rate of refused messages; disconnect it once it has been slowed for too long."""
        owed = connection.refusals.charge()
        if not owed:
            connection.slowed = None
            return
        now = time.monotonic()
        if connection.slowed is None:
            connection.slowed = now
        if now - connection.slowed + owed > self.limits.refusals_slowed:
            self._disconnect_refused(connection)
        elif not connection.queue.failing:
            await asyncio.sleep(owed)

    async def _hang_up(self, hop: str) -> None:
        self.strangers.leave(hop)
        connection = self._connections.pop(hop, None)
        neighbour = self.broker.peers.get(hop)
        self._dispatch(self.broker.close(hop))
        if connection is not None:
            link = connection.link
            if link and neighbour is not None:
                self._report_unsent(connection, neighbour)
            self._log_leaving(connection)
            connection.move(Phase.CLOSED)
            gone = connection.queue.statistics()._replace(queued=0, queued_bytes=0)
            self._departed = combined([self._departed, gone])
            if link:
                self._departed_links = combined([self._departed_links, gone])
            await connection.queue.close()

    def _log_leaving(self, connection: Connection) -> None:
        if not connection.name:
            return
        lasted = time.monotonic() - connection.opened
        why = connection.queue.reason or "it closed"
        if connection.link:
            log.info(
                "%s: link with %s down after %.0f s: %s",
                self.broker.id,
                connection.name,
                lasted,
                why,
            )
        else:
            where = connection.address or "this process"
            log.info(
                "%s: client %s (%s) left after %.0f s: %s",
                self.broker.id,
                connection.name,
                where,
                lasted,
                why,
            )

    def _report_unsent(self, connection: Connection, neighbour: str) -> None:
        """The link to ``neighbour`` is over: the publishers of the plain publications it did
        not send (what its queue gave up or still held, then what it refused meanwhile) are
        told, once a task has read them (``padres.runtime.unsent``) between other work."""
        box, hop = connection.queue, connection.hop
        unsent, refused = box.unsent(), connection.refused
        if not unsent and not refused.total:
            return
        reason = box.reason if box.failing else "the link was lost"

        async def report() -> None:
            try:
                tally = await summarise(unsent)
                tally.extend(refused)
                if tally.total:
                    self._dispatch(self.broker.lost(neighbour, tally, reason))
            except Exception:  # a report is news: nothing else depends on it
                log.exception("%s: failed to report what %s did not send", self.broker.id, hop)

        task = asyncio.get_running_loop().create_task(report())
        self._leaving.add(task)
        task.add_done_callback(self._leaving.discard)

    def _evict_laggards(self) -> None:
        """Clients that have stayed over their queue limit too long are disconnected."""
        for box in [c.queue for c in self._connections.values()]:
            if box.droppable and not box.failing and box.over_for() >= self.limits.evict_after:
                self._evict(box)

    def _close_strangers(self) -> None:
        """Connections that have not been accepted ``hello_within`` seconds after they came
        are closed."""
        limit = self.limits.hello_within
        now = time.monotonic()
        why = f"closed: no hello accepted within {limit:g} s of connecting"
        for hop, connection in list(self._connections.items()):
            known = connection.dialled or self.broker.greeted(hop) or connection.queue.failing
            if not known and now - connection.opened >= limit:
                connection.queue.fail(1008, "no hello in time", Error(why))

    def _evict(self, box: SendQueue) -> None:
        self.evicted += 1
        box.discard()
        text = (
            f"evicted: you read too slowly; {box.dropped:,} messages ({box.dropped_bytes:,} "
            f"bytes) to you were dropped, and your queue stayed over its limit of "
            f"{box.limit:,} bytes for {self.limits.evict_after:g} s"
        )
        box.fail(1008, "too slow: evicted for reading its messages too slowly", Error(text))

    # -- flow control ------------------------------------------------------------------------

    def _check_flow(self) -> None:
        """Stop reading from publishers while a link queue holds more than ``pause_at``
        bytes, until every one holds less than half of it, and while another broker of the
        overlay says one of its links does (``Broker.congestion``, which this one's is
        flooded to). Links are always read: holding them back could deadlock a cycle of
        brokers; so are clients that have not advertised, whose acknowledgements free what
        durable subscriptions hold."""
        backlog = max((c.queue.size for c in self._connections.values() if c.link), default=0)
        if backlog > self.limits.pause_at:
            self._congested = True
        elif backlog < self.limits.pause_at // 2:
            self._congested = False
        now = time.time()
        congestion = self.broker.congestion
        told = congestion.local(self._congested, now)
        if told:
            self._queue(told)
        paused = self._congested or congestion.elsewhere(now)
        if self._reading.is_set() and paused:
            self._reading.clear()
            self.paused += 1
        elif not self._reading.is_set() and not paused:
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
                    max_size=4 * self.limits.frame_bytes,
                    open_timeout=10,
                    close_timeout=self.heartbeat,
                    compression=None,
                    extensions=self._link_extensions,
                    ssl=self._dial_tls if secure(url) else None,
                ) as ws:
                    log.info("%s: linked to %s", self.broker.id, url)
                    backoff.reset()
                    await self._serve_link(ws, url)
            except ssl.SSLError as exc:  # a certificate that does not verify, say
                log.warning("%s: link to %s refused: %s", self.broker.id, url, exc)
            except (OSError, TimeoutError, ConnectionClosed, InvalidHandshake) as exc:
                log.info("%s: link to %s: %s", self.broker.id, url, exc or type(exc).__name__)
            except InvalidURI as exc:
                log.error("%s: bad neighbour address %s: %s", self.broker.id, url, exc)
                return
            except Exception:  # whatever went wrong, the link is dialled again
                log.exception("%s: link to %s failed", self.broker.id, url)
            await backoff.wait()

    async def _serve_link(self, ws: ClientConnection, url: str) -> None:
        _small_buffers(ws.transport.get_extra_info("socket"))
        hop = self._links[url] = f"n{next(self._hops)}"
        self._open(hop, ws.send, ws.close, dialled=True)
        self._dispatch(self.broker.open_link(hop))
        keepalive = asyncio.get_running_loop().create_task(self._keepalive(ws, hop))
        try:
            await self._converse(hop, self._read_link(ws, hop))
        finally:
            keepalive.cancel()

    async def _read_link(self, ws: ClientConnection, hop: str) -> None:
        connection = self._connections[hop]
        async for data in ws:
            connection.heard = time.monotonic()
            await self._authenticate(hop, data)
            await self.receive(hop, data)

    async def _keepalive(self, ws: ClientConnection, hop: str) -> None:
        """Ping the neighbour every heartbeat; close the link once neither the pong nor any
        other frame has come for twice that."""
        timeout = 2 * self.heartbeat
        connection = self._connections[hop]
        ping: asyncio.Future[None] | None = None
        pinged = 0.0
        try:
            while True:
                await asyncio.sleep(self.heartbeat)
                now = time.monotonic()
                if ping is None or ping.done():
                    ping, pinged = asyncio.ensure_future(_pinged(ws)), now
                elif now - max(pinged, connection.heard) >= timeout:
                    log.warning("%s: %s stopped answering", self.broker.id, hop)
                    # Not ws.close(): its close frame would wait behind a full write buffer,
                    # as the ping does, for a peer that reads nothing.
                    connection.queue.fail(1011, "keepalive ping timeout")
                    ws.transport.abort()
                    return
        finally:
            if ping is not None:
                ping.cancel()

    # -- messages ----------------------------------------------------------------------------

    async def receive(self, hop: str, data: bytes | str) -> None:
        """One frame from ``hop``: decode, hand every message to the core, send the results.

        A frame whose messages take the core long is handled in slices of about ``SLICE``
        seconds, other connections served in between (the next frame of ``hop`` waits), and
        they are served after every frame too: reading the next frame from a busy peer's
        buffer would not let them. Whatever goes wrong costs this frame at most: it is logged,
        and the connection goes on.
        """
        try:
            items = self._decode(hop, data)
            done = 0
            while done < len(items) and hop in self._connections:
                done = self._submit(hop, items, done, SLICE)
                if done < len(items):
                    await asyncio.sleep(0)
        except Exception:
            log.exception("%s: failed on a frame from %s", self.broker.id, hop)
        await asyncio.sleep(0)

    def _decode(self, hop: str, data: bytes | str) -> Sequence[Envelope | Rejected]:
        """The messages of a frame; none, and an ``error`` to ``hop``, if it is refused."""
        connection = self._connections.get(hop)
        dialled = connection is not None and connection.dialled
        answers = not dialled and data[: len(_ANSWERS[0])] in _ANSWERS and self.broker.replays(hop)
        try:
            items = decode_frame(
                data, max_bytes=self.limits.frame_bytes, checked=dialled or answers
            )
            if answers and not all(type(item) in _ANSWER_TYPES for item in items):
                items = decode_frame(data, max_bytes=self.limits.frame_bytes)
        except DecodeError as exc:
            self._refuse_frame(hop, f"frame refused: {exc}")
            return []
        if len(items) > self.limits.frame_messages and not (connection and connection.link):
            why = (
                f"frame refused: it holds {len(items):,} messages; the limit is "
                f"{self.limits.frame_messages:,} (send them in several frames)"
            )
            self._refuse_frame(hop, why)
            return []
        hellos = sum(isinstance(item, Hello) for item in items)
        if hellos > 1:
            why = f"frame refused: it holds {hellos} hellos; a connection says hello once"
            self._refuse_frame(hop, why)
            return []
        if connection is not None and connection.link:
            return self._probed(connection, items)
        return items

    def _probed(
        self, connection: Connection, items: Sequence[Envelope | Rejected]
    ) -> Sequence[Envelope | Rejected]:
        """A link's frame without its pings and pongs: a ping is answered at once, a pong
        measures the link (``padres.runtime.probe``)."""
        if not any(isinstance(item, LinkPing | LinkPong) for item in items):
            return items
        rest: list[Envelope | Rejected] = []
        for item in items:
            if isinstance(item, LinkPing):
                connection.queue.put(encode(LinkPong(item.sent)))
            elif isinstance(item, LinkPong):
                connection.probe.pong(item.sent, time.monotonic())
            else:
                rest.append(item)
        return rest

    def _refuse_frame(self, hop: str, why: str) -> None:
        self._refused += 1
        self._dispatch([(hop, Error(why))])
        self._charge(hop, 1)

    def _charge(self, hop: str, refused: int) -> None:
        """Count ``refused`` messages of ``hop`` against its rate
        (``Limits.refusals_per_second``); a client connection that owes more than
        ``Limits.refusals_slowed`` seconds for them is disconnected."""
        connection = self._connections.get(hop)
        if not refused or connection is None or connection.link:
            return
        if connection.refusals.charge(refused) > self.limits.refusals_slowed:
            self._disconnect_refused(connection)

    def _disconnect_refused(self, connection: Connection) -> None:
        limits = self.limits
        if connection.address:
            penalised = self._penalised
            penalised.pop(connection.address, None)
            penalised[connection.address] = time.monotonic() + limits.refusals_slowed
            while len(penalised) > PENALISED:
                del penalised[next(iter(penalised))]
        why = (
            f"disconnected: too many refused requests (more than {limits.refusals_burst:,} at "
            f"once and {limits.refusals_per_second:g} a second after that, for "
            f"{limits.refusals_slowed:g} s); read the errors your requests get"
        )
        connection.queue.fail(1008, REFUSED_TOO_OFTEN, Error(why))

    def submit(self, hop: str, items: Sequence[Envelope | Rejected]) -> None:
        """Hand the core the messages of one frame from ``hop``, in order, and send what it
        answers."""
        self._submit(hop, items, 0, math.inf)

    def _submit(
        self, hop: str, items: Sequence[Envelope | Rejected], first: int, budget: float
    ) -> int:
        """Walk ``items[first:]`` through the core (``Pump.walk``, at one reading of the
        clock) until ``budget`` seconds have passed, one message at least; send what it
        answers, and return the index of the first message left."""
        now = time.time()
        left, outs, handled = self._pump.walk(hop, items, lambda: now, first, budget)
        if self.broker.greeted(hop):
            self.strangers.leave(hop)
            self._named(hop)
        self._promote(hop)
        for observe in self.observers:
            try:
                observe(hop, handled)
            except Exception:  # counting must not cost what was handled
                log.exception("%s: an observer failed", self.broker.id)
        self._dispatch(outs)
        self._charge(hop, left - first - len(handled))  # the messages it did not take
        connection = self._connections.get(hop)
        if self.broker.guard is not None and not self.broker.greeted(hop) and connection:
            # A broker with accounts talks to nobody it does not know: it says why, and hangs up.
            refusal = next((m for h, m in outs if h == hop and isinstance(m, Error)), None)
            if refusal is not None:
                where = connection.address or "this process"
                log.warning("%s: refused %s from %s: %s", self.broker.id, hop, where, refusal.text)
            connection.queue.fail(1008, "not authenticated", refusal)
        return left

    def _screen(self, hop: str, item: Envelope) -> Error | None:
        """The pump's look at a message before the core gets it: a query beyond the
        connection's rate is refused; a neighbour's refusal of this broker is logged."""
        if isinstance(item, Query):
            connection = self._connections.get(hop)
            if connection is not None and not connection.queries.allow():
                why = (
                    f"query refused: at most {self.limits.queries_per_second:g} queries a second "
                    "per connection"
                )
                return Error(why, f"?{item.what}")
        elif isinstance(item, Error) and not self.broker.greeted(hop):
            log.warning("%s: %s refused the connection: %s", self.broker.id, hop, item.text)
        return None

    async def _authenticate(self, hop: str, data: bytes | str) -> None:
        """Before a frame of a connection not yet accepted goes to the core: its ``hello``'s
        password checked off the event loop (``verify``); a client's name, if a connection
        of a client of that name is still here, let go of first (``_namesake_gone``)."""
        if self.broker.greeted(hop):
            return
        try:
            items = decode_frame(data)
        except DecodeError:
            return
        hello = next((item for item in items if isinstance(item, Hello)), None)
        if hello is None:  # a frame with more is refused (``_decode``)
            return
        if self.broker.guard is not None:
            await self.verify(hello)
        if hello.role is Role.CLIENT:
            await self._namesake_gone(hello.name)

    async def _namesake_gone(self, name: str) -> None:
        """Wait up to ``NAMESAKE`` seconds while a client named ``name`` is connected: one
        that closed and comes straight back may greet before the end of its old connection
        has been handled here. A name still taken after that is refused (the core says so)."""
        deadline = time.monotonic() + NAMESAKE
        while self.broker.connected(name) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def verify(self, hello: Hello) -> None:
        """Check the password of ``hello`` on a worker thread, so that the core, which checks
        it again when it gets the ``hello``, finds the verdict remembered (see ``Accounts``):
        argon2 takes tens of milliseconds, which the event loop must not wait. An attached
        connection (``attach``) calls this before it submits its ``hello``."""
        guard = self.broker.guard
        if guard is not None and hello.user:
            with contextlib.suppress(AuthenticationError):
                await asyncio.to_thread(guard.accounts.authenticate, hello.user, hello.password)

    def _named(self, hop: str) -> None:
        """The core took the ``hello`` of ``hop``: who it is, once, and in the log."""
        connection = self._connections.get(hop)
        if connection is None or connection.name:
            return
        session = self.broker.sessions.get(hop)
        connection.name = session.name if session is not None else self.broker.peers.get(hop, hop)
        where = connection.address or "this process"
        if session is not None:
            log.info("%s: client %s connected from %s", self.broker.id, connection.name, where)
        elif not connection.dialled:
            log.info("%s: linked from %s at %s", self.broker.id, connection.name, where)

    def _promote(self, hop: str) -> None:
        """An accepted connection the core has taken as a neighbour (its ``hello`` said it is a
        broker): its queue becomes a link queue like the dialling side's, before anything more
        is queued on it."""
        connection = self._connections.get(hop)
        if connection is not None and not connection.link and hop in self.broker.peers:
            self._link(connection)

    def _dispatch(self, outs: list[Out]) -> None:
        """Commit the journal and send ``outs`` (``Pump.dispatch``). A journal that cannot
        commit stops the node: what the core has done since the last commit is neither kept
        nor sent, and a broker started again takes up from what the journal holds."""
        try:
            self._pump.dispatch(outs)
        except JournalError as exc:
            if self.failure is None:
                log.critical("%s: stopping: %s", self.broker.id, exc)
                self.failure = exc
            if self._server is not None:
                self._server.should_exit = True

    def _queue(self, outs: list[Out]) -> None:
        """The pump's ``send``: each message into the send queue of its hop, encoded once
        however many hops it goes to."""
        encoded: dict[int, bytes] = {}
        connections = self._connections
        for hop, message in outs:
            connection = connections.get(hop)
            if connection is None:
                continue
            box = connection.queue
            data = encoded.get(id(message))
            if data is None:
                data = encoded[id(message)] = encode(message)
            if box.put(data):
                continue
            if box.droppable and box.dropped == 1:
                log.warning("%s: %s is too slow: dropping what it cannot take", self.broker.id, hop)
            elif not box.droppable and isinstance(message, RoutePublish) and not message.position:
                pub = message.publication  # a plain one, lost with the link: its publisher is told
                connection.refused.add(message.tree, pub.publisher, pub.id)
        self._check_flow()


class _Server(uvicorn.Server):
    """uvicorn's server, which drains the node before it closes the connections, and ends a
    process told to stop by SIGTERM normally (exit status 0) once it has."""

    def __init__(self, config: uvicorn.Config, drain: Callable[[], Awaitable[None]]) -> None:
        super().__init__(config)
        self._drain = drain

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()  # no new connection while draining
        if not self.force_exit:
            await self._drain()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            yield
            # Drained: not raised again once the server is done, which would end the process
            # by the signal.
            self._captured_signals = [s for s in self._captured_signals if s != signal.SIGTERM]


async def _pinged(ws: ClientConnection) -> None:
    """Ping ``ws`` and wait for the pong; the ping's write itself waits while the socket's
    buffer is full (a peer reading nothing), so this runs beside the keepalive's clock."""
    with contextlib.suppress(ConnectionClosed):  # the link is going anyway
        await (await ws.ping())


async def _nothing_to_close(code: int, reason: str) -> None:
    """An attached connection has no socket to close: ``attach``'s ``ended`` tells its end."""


async def _respond(send: Send, status: int, body: bytes) -> None:
    """A whole JSON response to an HTTP request."""
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _small_buffers(sock: socket.socket) -> None:
    """Bound the kernel's socket buffers (see ``SOCKET_BUFFER``)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
