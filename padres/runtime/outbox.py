"""A connection's outgoing queue: messages wait here and leave in batches, one frame each."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Final

import orjson

__all__ = ["MAX_BATCH", "Outbox"]

MAX_BATCH: Final = 512
"""At most this many messages go in one frame."""


class Outbox:
    """Bounded queue of encoded-ready messages with a writer task that sends them in frames.

    A client that cannot keep up loses what overflows its queue: the loss is counted and the
    client is told once, and the broker goes on serving everyone else. A broker link is never
    cut short this way: when its queue overflows, the link is closed (and re-established, with
    a full resynchronisation, by the side that dialled it).
    """

    def __init__(
        self,
        send: Callable[[bytes], Awaitable[None]],
        *,
        limit: int,
        droppable: bool,
    ) -> None:
        self._send = send
        self._queue: deque[dict[str, Any]] = deque()
        self._wake = asyncio.Event()
        self.limit = limit
        self.droppable = droppable
        self.dropped = 0
        self.sent = 0
        self.frames = 0
        self.overflowed = False
        self.closed = False
        self._task = asyncio.get_running_loop().create_task(self._write())

    def __len__(self) -> int:
        return len(self._queue)

    def put(self, message: dict[str, Any]) -> bool:
        """Queue a message; False if it was dropped (queue full)."""
        if self.closed:
            return False
        if len(self._queue) >= self.limit:
            if not self.droppable:
                self.overflowed = True
                self._wake.set()
            self.dropped += 1
            return False
        self._queue.append(message)
        self._wake.set()
        return True

    async def _write(self) -> None:
        queue = self._queue
        while not self.closed:
            await self._wake.wait()
            self._wake.clear()
            if self.overflowed:
                break
            while queue:
                batch = [queue.popleft() for _ in range(min(len(queue), MAX_BATCH))]
                await self._send(orjson.dumps(batch))
                self.sent += len(batch)
                self.frames += 1

    async def close(self) -> None:
        self.closed = True
        self._wake.set()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):  # going away anyway
            await self._task

    @property
    def task(self) -> asyncio.Task[None]:
        return self._task
