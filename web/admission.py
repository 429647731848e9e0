"""What a request must show before its body is read: a size within its route's bound, and, on a
broker with accounts, valid credentials.

An ASGI middleware in front of the whole API. A request whose ``Content-Length`` is over the
bound of its route is answered ``413`` unread; one that names no length (chunked) is read up to
the bound, and answered ``413`` past it. On a broker with accounts, a request carrying a body
is authenticated from its headers first (the verdict is kept, so the route's own check costs
nothing more), and refused ``401`` or ``403`` unread. Publications may take ``PUBLICATIONS``
bytes, every other body ``OTHER`` bytes.
"""

from __future__ import annotations

from typing import Final

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from web.auth import Authenticator
from web.problems import Problem

__all__ = ["OTHER", "PUBLICATIONS", "Admission"]

PUBLICATIONS: Final = 4 << 20
"""Bytes of a request body that publishes (``POST /api/v1/publications``), at most."""
OTHER: Final = 64 << 10
"""Bytes of any other request body, at most."""
_PUBLISHING: Final = frozenset({"/api/v1/publications"})


class Admission:
    """See the module docstring."""

    def __init__(self, app: ASGIApp, auth: Authenticator) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        length = headers.get(b"content-length")
        chunked = b"chunked" in headers.get(b"transfer-encoding", b"").lower()
        if length in (None, b"0") and not chunked:
            await self.app(scope, receive, send)
            return
        limit = bound(scope["path"])
        try:
            await self._admit(scope, length, limit)
            body = await _body(receive, limit)
        except Problem as problem:
            await problem.response()(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _admit(self, scope: Scope, length: bytes | None, limit: int) -> None:
        await self.auth.caller(HTTPConnection(scope))
        if length is not None:
            if not length.isdigit():
                raise Problem(400, "bad request", "the Content-Length header is not a number")
            if int(length) > limit:
                raise _too_large(int(length), limit)


def bound(path: str) -> int:
    """Bytes a request body to ``path`` may hold."""
    return PUBLICATIONS if path in _PUBLISHING else OTHER


def _too_large(size: int, limit: int) -> Problem:
    return Problem(413, "too large", f"the body holds {size:,} bytes or more; at most {limit:,}")


async def _body(receive: Receive, limit: int) -> bytes:
    """The request's body, read up to ``limit`` bytes (a ``413`` past them)."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Problem(400, "bad request", "the client left before its body was read")
        part = message.get("body", b"")
        size += len(part)
        if size > limit:
            raise _too_large(size, limit)
        parts.append(part)
        if not message.get("more_body", False):
            return b"".join(parts)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` whole, then what the connection gives."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
