"""A connection's outgoing queue: encoded messages wait here and leave in frames.

Each message is encoded once, when it is queued (``encode``); a frame joins encoded messages
into a JSON array, up to ``FRAME_BYTES``, so the queue always knows its size in bytes.

Two kinds of queue, with a byte limit each:

- a **client** queue that is full drops what does not fit and counts it; the client is told
  once per episode of losses (an ``error`` naming how many messages and bytes it has lost,
  ahead of everything still queued), and ``over_for`` tells the node how long the episode
  has lasted, so that a client that never catches up can be evicted (``fail``). An episode
  ends when the queue has drained below half its limit.
- a **link** queue (to a neighbour broker) never thins: when it overflows, the connection is
  closed (``fail``), and the link is established again with a full resynchronisation. What it
  gives up unsent is kept for the node (``unsent``), which tells the publishers of the plain
  publications among it (``padres.runtime.unsent``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Final, NamedTuple

from padres.model.codec import encode
from padres.model.protocol import Envelope, Error

__all__ = ["FRAME_BYTES", "GRACE", "QueueStatistics", "SendQueue", "combined", "encode"]

FRAME_BYTES: Final = 256 * 1024
"""A frame holds messages up to this many bytes (a larger message goes alone)."""
GRACE: Final = 10.0
"""Seconds a connection given up on has to take its last message and close frame."""


class QueueStatistics(NamedTuple):
    """A queue's figures, or the sum of several (``combined``): what waits in it now, and what
    was sent or dropped since it opened."""

    queued: int = 0
    queued_bytes: int = 0
    sent: int = 0
    frames: int = 0
    dropped: int = 0
    dropped_bytes: int = 0
    sent_bytes: int = 0


def combined(statistics: Iterable[QueueStatistics]) -> QueueStatistics:
    """The sum of ``statistics``."""
    columns = zip(QueueStatistics(), *statistics, strict=True)
    return QueueStatistics(*(sum(column) for column in columns))


class SendQueue:
    """A bounded queue of encoded messages and the task that writes them in frames."""

    def __init__(
        self,
        send: Callable[[bytes], Awaitable[None]],
        close: Callable[[int, str], Awaitable[None]],
        *,
        limit: int,
    ) -> None:
        """A client queue of ``limit`` bytes: ``send`` writes one frame, ``close`` closes the
        connection with a code and a reason."""
        self._send = send
        self._close = close
        self._on_sent: Callable[[], None] | None = None
        self._queue: deque[bytes] = deque()
        self._unsent: deque[bytes] = deque()
        """What a link queue discarded, until the node takes it (``unsent``)."""
        self._wake = asyncio.Event()
        self._notice_due = False
        self.limit = limit
        self.droppable = True
        self.size = 0
        """Bytes queued, the frame being written included."""
        self.sent = 0
        self.frames = 0
        self.sent_bytes = 0
        """Bytes of the frames written (without the transport's own framing)."""
        self.dropped = 0
        self.dropped_bytes = 0
        self._over_since: float | None = None
        """When (``time.monotonic()``) the current episode of losses began."""
        self.failing = False
        self.reason = ""
        """Why the queue gave up on its connection."""
        self.gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        """Done once the queue can send no more: it was given up on, or a write failed."""
        self._task = asyncio.get_running_loop().create_task(self._write())

    def __len__(self) -> int:
        return len(self._queue)

    def make_link(self, limit: int, on_sent: Callable[[], None]) -> None:
        """From now on this is a link queue: it never drops, holds up to ``limit`` bytes, and
        calls ``on_sent`` after each frame (the node watches its links drain)."""
        self.droppable = False
        self.limit = limit
        self._on_sent = on_sent
        self._over_since = None
        self._notice_due = False

    def put(self, data: bytes) -> bool:
        """Queue an encoded message; False if it was not (dropped, or the link overflowed)."""
        if self.failing or self.gone.done():
            return False
        if self.size >= self.limit:
            if not self.droppable:
                self.fail(1013, "link queue overflow: the link will be resynchronised")
                return False
            self.dropped += 1
            self.dropped_bytes += len(data)
            if self._over_since is None:
                self._over_since = time.monotonic()
                self._notice_due = True
                self._wake.set()
            return False
        self._queue.append(data)
        self.size += len(data)
        self._wake.set()
        return True

    def over_for(self) -> float:
        """Seconds the current episode of losses has lasted (0 when there is none)."""
        return 0.0 if self._over_since is None else time.monotonic() - self._over_since

    def statistics(self) -> QueueStatistics:
        return QueueStatistics(
            len(self._queue),
            self.size,
            self.sent,
            self.frames,
            self.dropped,
            self.dropped_bytes,
            self.sent_bytes,
        )

    def discard(self) -> None:
        """Drop everything queued (it is counted as dropped); a link queue keeps it for
        ``unsent``."""
        self.dropped += len(self._queue)
        self.dropped_bytes += sum(len(data) for data in self._queue)
        if not self.droppable:
            self._unsent.extend(self._queue)
        self._queue.clear()
        self.size = 0

    def unsent(self) -> deque[bytes]:
        """What a link queue was given and did not send, in order, for a node hanging up its
        connection: what it discarded when it gave up, then what it still holds (dropped
        now, and counted). The queue forgets them."""
        self.discard()
        unsent, self._unsent = self._unsent, deque()
        return unsent

    def fail(self, code: int, reason: str, last_words: Envelope | None = None) -> None:
        """Give up on the connection: what is queued is dropped (and counted), then
        ``last_words`` and a close frame with ``code`` and ``reason`` are sent, if the peer
        takes them within ``GRACE`` seconds."""
        if self.failing or self.gone.done():
            return
        self.failing = True
        self.reason = reason
        self.discard()
        self._task.cancel()
        farewell = self._farewell(code, reason, last_words)
        self._task = asyncio.get_running_loop().create_task(farewell)

    async def close(self) -> None:
        """Stop: a farewell under way is given its grace period, anything else ends now."""
        if not self.failing:
            self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):  # going away anyway
            await self._task

    async def _write(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._queue or self._notice_due:
                    await self._send_frame()
        finally:
            self._done()

    async def _send_frame(self) -> None:
        parts: list[bytes] = []
        if self._notice_due:
            self._notice_due = False
            parts.append(encode(self._notice()))
        size = 0
        queue = self._queue
        while queue and (size == 0 or size + len(queue[0]) <= FRAME_BYTES):
            data = queue.popleft()
            parts.append(data)
            size += len(data)
        frame = b"[" + b",".join(parts) + b"]"
        await self._send(frame)
        self.sent_bytes += len(frame)
        self.size -= size
        self.sent += len(parts)
        self.frames += 1
        if self._over_since is not None and self.size < self.limit // 2:
            self._over_since = None
        if self._on_sent is not None:
            self._on_sent()

    def _notice(self) -> Error:
        return Error(
            f"you are reading too slowly: {self.dropped:,} messages ({self.dropped_bytes:,} "
            f"bytes) to you have been dropped so far; the broker queues at most "
            f"{self.limit:,} bytes for you"
        )

    async def _farewell(self, code: int, reason: str, last_words: Envelope | None) -> None:
        try:
            with contextlib.suppress(Exception):  # not taken in time: nothing more to do
                async with asyncio.timeout(GRACE):
                    if last_words is not None:
                        await self._send(b"[" + encode(last_words) + b"]")
                    await self._close(code, reason)
        finally:
            self._done()

    def _done(self) -> None:
        if not self.gone.done():
            self.gone.set_result(None)
