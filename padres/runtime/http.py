"""uvicorn's HTTP/1.1 protocol, with what a broker needs before a request is read.

A connection waiting for a request's headers (when it opens, and between its requests) is a
stranger (``Strangers``): one too many from its address, or in all, is closed at once, and one
whose headers have not all come ``within`` seconds after it began waiting is closed, so that a
client dribbling its headers (slowloris) holds nothing for long. A connection that upgrades to
a WebSocket is counted again by the node, until its ``hello`` is accepted.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec
from uvicorn.protocols.http.h11_impl import H11Protocol

from padres.runtime.strangers import Strangers

__all__ = ["HttpProtocol", "http_protocol"]

log = logging.getLogger("padres.broker")


class HttpProtocol(H11Protocol):
    """See the module docstring; ``http_protocol`` binds the class attributes."""

    strangers: Strangers
    within: float
    _due: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._wait()

    def connection_lost(self, exc: Exception | None) -> None:
        self._known()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        started = self.cycle
        super().handle_events()
        if self.cycle is not started:  # a request's headers are in
            self._known()

    def handle_websocket_upgrade(self, event: object) -> None:
        self._known()
        super().handle_websocket_upgrade(event)  # type: ignore[arg-type]

    def on_response_complete(self) -> None:
        if not self.transport.is_closing():
            self._wait()  # before the next request, which may be waiting already
        super().on_response_complete()

    def _wait(self) -> None:
        address = self.client[0] if self.client else "an unknown address"
        why = self.strangers.arrive(self, address)
        if why is not None:
            log.warning("refused an HTTP connection: %s", why)
            self.transport.write(_refusal(why))
            self.transport.close()
            return
        self._due = self.loop.call_later(self.within, self._late)

    def _known(self) -> None:
        self.strangers.leave(self)
        if self._due is not None:
            self._due.cancel()
            self._due = None

    def _late(self) -> None:
        self._due = None
        self.strangers.leave(self)
        self.transport.close()


def _refusal(why: str) -> bytes:
    """A ``503`` saying ``why``, as a problem document, to a connection about to be closed."""
    body = msgspec.json.encode(
        {"type": "about:blank", "title": "too many connections", "status": 503, "detail": why}
    )
    head = (
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/problem+json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\nretry-after: 1\r\n\r\n"
    )
    return head.encode() + body


def http_protocol(strangers: Strangers, within: float) -> type[HttpProtocol]:
    """``HttpProtocol`` counting its connections in ``strangers``, with ``within`` seconds for
    a request's headers."""
    return type("HttpProtocol", (HttpProtocol,), {"strangers": strangers, "within": within})
