"""What the tests with real processes share: waiting for a condition, a broker's status."""

from __future__ import annotations

import base64
import time
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from padres.backoff import Backoff

__all__ = ["eventually", "health"]


async def eventually(check: Callable[[], bool | Awaitable[bool]], timeout: float = 15.0) -> None:
    """Wait until ``check`` holds; ``AssertionError`` after ``timeout`` seconds.

    The checks come quickly at first and then a few times a second, which stays under a
    broker's limit on queries when ``check`` asks one."""
    deadline = time.monotonic() + timeout
    backoff = Backoff(first=0.02, most=0.25)
    while True:
        result = check()
        if result if isinstance(result, bool) else await result:
            return
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await backoff.wait()


def health(url: str, admin: tuple[str, str] | None = None) -> dict[str, Any]:
    """``/health`` of the broker at ``url`` (its ``ws://`` address); of a broker with accounts,
    the same figures from ``/api/v1/broker`` as the administrator ``admin`` (user, password)."""
    base = url.replace("ws://", "http://").replace("/ws", "")
    if admin is None:
        with urllib.request.urlopen(f"{base}/health") as r:
            return orjson.loads(r.read())  # type: ignore[no-any-return]
    request = urllib.request.Request(f"{base}/api/v1/broker")
    login = base64.b64encode(":".join(admin).encode()).decode()
    request.add_header("Authorization", f"Basic {login}")
    with urllib.request.urlopen(request) as r:
        return orjson.loads(r.read())["status"]  # type: ignore[no-any-return]
