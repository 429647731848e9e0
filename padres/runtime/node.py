"""A broker process: the broker core served over WebSocket (FastAPI on uvicorn), one port.

Clients and neighbour brokers connect alike, to ``ws://host:port/ws``; the first message says
which they are (``hello``). The node dials the neighbours it is given, re-dialling a lost link
with exponential backoff; WebSocket pings (every ``heartbeat`` seconds, both ways) detect a
dead peer. Every call into the core happens on the event loop's thread, one message at a time.

A frame that is not JSON, too large, or holds a message that does not decode gets an ``error``
reply naming what was wrong; the connection stays open and nothing else is affected.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import time
from collections.abc import Callable, Sequence
from itertools import count
from typing import Any, Final

import uvicorn
from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from padres.broker import Broker, Out
from padres.errors import DecodeError
from padres.protocol import (
    MAX_FRAME_BYTES,
    Envelope,
    Error,
    Rejected,
    decode_frame,
    envelope_to_dict,
    websocket_url,
)
from padres.runtime.outbox import Outbox

__all__ = ["BrokerNode"]

log = logging.getLogger("padres.broker")

CLIENT_QUEUE: Final = 100_000
BROKER_QUEUE: Final = 1_000_000
BACKOFF_FIRST: Final = 0.1
BACKOFF_MAX: Final = 5.0


class BrokerNode:
    """Serves one ``Broker`` (see the module docstring)."""

    def __init__(
        self,
        broker: Broker,
        *,
        neighbors: Sequence[str] = (),
        heartbeat: float = 5.0,
    ) -> None:
        self.broker = broker
        self.neighbors = [websocket_url(n) for n in neighbors]
        self.heartbeat = heartbeat
        self.started = time.time()
        self.received = 0
        self.rejected = 0
        self._boxes: dict[str, Outbox] = {}
        self._hops = count(1)
        self._dialers: list[asyncio.Task[None]] = []
        self._server: uvicorn.Server | None = None
        self.app = self._build_app()

    # -- serving -----------------------------------------------------------------------------

    def _build_app(self) -> FastAPI:
        app = FastAPI(title=f"padres broker {self.broker.id}")

        @app.websocket("/ws")
        async def session(ws: WebSocket) -> None:
            await ws.accept()
            hop = f"h{next(self._hops)}"
            box = Outbox(ws.send_bytes, limit=CLIENT_QUEUE, droppable=True)
            self._boxes[hop] = box
            try:
                while True:
                    event = await ws.receive()
                    if event["type"] == "websocket.disconnect":
                        break
                    data = event.get("bytes") or event.get("text") or b""
                    self.receive(hop, data)
                    if box.overflowed or box.task.done():
                        break
            except WebSocketDisconnect:
                pass
            finally:
                await self._hang_up(hop)
                with contextlib.suppress(Exception):
                    await ws.close()

        @app.get("/health")
        async def health() -> dict[str, Any]:
            return self.status()

        return app

    def status(self) -> dict[str, Any]:
        b = self.broker
        return {
            "broker": b.id,
            "uptime": round(time.time() - self.started, 3),
            "neighbors": sorted(b.peers.values()),
            "clients": sorted(s.name for s in b.sessions.values()),
            "advertisements": len(b.trees),
            "subscriptions": len(b.routes),
            "received": self.received,
            "rejected": self.rejected,
            "queued": sum(len(box) for box in self._boxes.values()),
            "sent": sum(box.sent for box in self._boxes.values()),
            "frames": sum(box.frames for box in self._boxes.values()),
            "dropped": sum(box.dropped for box in self._boxes.values()),
        }

    async def serve(
        self, host: str = "127.0.0.1", port: int = 0, ready: Callable[[int], None] | None = None
    ) -> None:
        """Serve until cancelled; ``ready`` gets the bound port once clients may connect."""
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            ws_max_size=4 * MAX_FRAME_BYTES,
            ws_ping_interval=self.heartbeat,
            ws_ping_timeout=2 * self.heartbeat,
            ws_per_message_deflate=False,  # compressing costs more CPU than it saves here
            lifespan="off",
        )
        self._server = uvicorn.Server(config)
        bound = sock.getsockname()[1]
        self._dialers = [
            asyncio.get_running_loop().create_task(self._dial(url)) for url in self.neighbors
        ]
        serving = asyncio.get_running_loop().create_task(self._server.serve(sockets=[sock]))
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
            for task in self._dialers:
                task.cancel()
            self._server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await serving

    # -- links to neighbours -----------------------------------------------------------------

    async def _dial(self, url: str) -> None:
        delay = BACKOFF_FIRST
        while True:
            hop = f"n{next(self._hops)}"
            try:
                async with connect(
                    url,
                    ping_interval=self.heartbeat,
                    ping_timeout=2 * self.heartbeat,
                    max_size=4 * MAX_FRAME_BYTES,
                    open_timeout=10,
                    compression=None,
                ) as ws:
                    log.info("%s: linked to %s", self.broker.id, url)
                    delay = BACKOFF_FIRST
                    box = Outbox(ws.send, limit=BROKER_QUEUE, droppable=False)
                    self._boxes[hop] = box
                    self._dispatch(self.broker.open_link(hop))
                    async for data in ws:
                        self.receive(hop, data)
                        if box.overflowed:
                            break
            except (OSError, TimeoutError, ConnectionClosed, InvalidHandshake) as exc:
                log.info("%s: link to %s: %s", self.broker.id, url, exc or type(exc).__name__)
            except InvalidURI as exc:
                log.error("%s: bad neighbour address %s: %s", self.broker.id, url, exc)
                return
            finally:
                await self._hang_up(hop)
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(2 * delay, BACKOFF_MAX)

    # -- messages ----------------------------------------------------------------------------

    def receive(self, hop: str, data: bytes | str) -> None:
        """One frame from ``hop``: decode, hand every message to the core, send the results."""
        now = time.time()
        try:
            items = decode_frame(data)
        except DecodeError as exc:
            self.rejected += 1
            self._dispatch([(hop, Error(f"frame refused: {exc}"))])
            return
        outs: list[Out] = []
        for item in items:
            if isinstance(item, Rejected):
                self.rejected += 1
                outs.append((hop, Error(f"message refused: {item.error}", item.ref)))
                continue
            self.received += 1
            try:
                outs += self.broker.handle(item, hop, now)
            except Exception as exc:  # a bug must cost one message, not the broker
                log.exception("%s: failed on a message from %s", self.broker.id, hop)
                outs.append((hop, Error(f"internal error: {type(exc).__name__}: {exc}")))
        self._dispatch(outs)

    def _dispatch(self, outs: list[tuple[str, Envelope]]) -> None:
        encoded: dict[int, dict[str, Any]] = {}
        for hop, message in outs:
            box = self._boxes.get(hop)
            if box is None:
                continue
            body = encoded.get(id(message))
            if body is None:
                body = encoded[id(message)] = envelope_to_dict(message)
            if not box.put(body) and box.droppable and box.dropped == 1:
                log.warning("%s: %s is too slow: dropping what it cannot take", self.broker.id, hop)

    async def _hang_up(self, hop: str) -> None:
        box = self._boxes.pop(hop, None)
        if box is not None:
            await box.close()
        self._dispatch(self.broker.close(hop))
