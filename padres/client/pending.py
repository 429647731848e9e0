"""A subscription's queue in the client: deliveries the broker sent that the application has not
taken yet, bounded in messages and in bytes.

What a delivery counts for in bytes is its encoding as it came in its frame. A queue at its
limits either drops what comes (a plain subscription: the delivery is counted as dropped, and
the application is told once per episode of losses, by ``SlowConsumer`` raised where the first
was dropped) or keeps it and says so (``flow``): a durable subscription's deliveries are never
dropped, and its client stops reading from the broker until the application has taken some.

An episode of losses ends once its ``SlowConsumer`` has been raised and the queue has drained to
half its limits; the next loss begins another. A queue always takes one delivery when it is
empty, however large, so that no delivery is too large to ever get through.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Final, Generic, NamedTuple, TypeVar

from padres.errors import SlowConsumer

__all__ = ["MAX_PENDING", "MAX_PENDING_BYTES", "Pending", "PendingStatistics", "check_limits"]

MAX_PENDING: Final = 65_536
"""Deliveries a subscription's queue holds at most, by default."""
MAX_PENDING_BYTES: Final = 64 << 20
"""Bytes of deliveries a subscription's queue holds at most, by default."""

T = TypeVar("T")


class PendingStatistics(NamedTuple):
    """A subscription's queue in the client: what waits in it now, what was handed to the
    application (taken from the queue, or passed to its callback) or dropped since the
    subscription was made, and its limits. (``padres.runtime.send_queue.QueueStatistics``
    describes a broker's queues: it counts frames, and has no limits.)"""

    pending: int
    pending_bytes: int
    delivered: int
    dropped: int
    dropped_bytes: int
    max_pending: int
    max_pending_bytes: int


def check_limits(max_pending: int, max_pending_bytes: int) -> None:
    """``ValueError`` unless both limits are at least 1."""
    if max_pending < 1 or max_pending_bytes < 1:
        raise ValueError(
            f"a subscription's queue holds at least 1 delivery and 1 byte, not {max_pending} "
            f"and {max_pending_bytes}"
        )


class Pending(Generic[T]):
    """A bounded queue of one subscription's deliveries (see the module docstring)."""

    def __init__(
        self,
        subscription: str,
        max_pending: int = MAX_PENDING,
        max_pending_bytes: int = MAX_PENDING_BYTES,
        *,
        flow: Callable[[bool], None] | None = None,
    ) -> None:
        """``flow``: for a queue whose deliveries are kept (``put`` with ``keep``), called with
        False when it fills up, and with True once it has room again or is closed."""
        check_limits(max_pending, max_pending_bytes)
        self.subscription = subscription
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self._flow = flow
        self._entries: deque[tuple[T, int | None] | None] = deque()
        """Deliveries and their sizes, in order; notes (``note``) with no size; None where an
        episode of losses began."""
        self.pending = 0
        self.pending_bytes = 0
        self.delivered = 0
        self.dropped = 0
        self.dropped_bytes = 0
        self._losing = False
        """In an episode of losses: the application is not told of more until it is over."""
        self._marked = False
        """The start of the episode of losses is in the queue, not yet reached by ``get``."""
        self._full = False
        """``flow`` was last told that the queue is full."""
        self._closed = False
        self._changed = asyncio.Event()

    @property
    def has_room(self) -> bool:
        return self.pending < self.max_pending and self.pending_bytes < self.max_pending_bytes

    def put(self, item: T, size: int, *, keep: bool = False) -> bool:
        """Queue ``item`` of ``size`` bytes; False if it was dropped: the queue was closed, or
        it would go beyond the limits and may be lost (not ``keep``)."""
        if self._closed:
            return False
        fits = not self.pending or (
            self.pending < self.max_pending and self.pending_bytes + size <= self.max_pending_bytes
        )
        if not fits and not keep:
            self.dropped += 1
            self.dropped_bytes += size
            if not self._losing:
                self._losing = True
                self._marked = True
                self._entries.append(None)
                self._changed.set()
            return False
        self._entries.append((item, size))
        self.pending += 1
        self.pending_bytes += size
        self._changed.set()
        self._tell_flow()
        return True

    def note(self, item: T) -> None:
        """Queue ``item`` among the deliveries without counting it as one: a marker in the
        stream (the end of a subscription's past, say). Notes are never dropped."""
        if not self._closed:
            self._entries.append((item, None))
            self._changed.set()

    async def get(self) -> T | None:
        """The next delivery, waiting for one; None once the queue is closed and empty.
        ``SlowConsumer`` where an episode of losses began."""
        while not self._entries:
            if self._closed:
                return None
            self._changed.clear()
            await self._changed.wait()
        entry = self._entries.popleft()
        if entry is None:
            self._marked = False
            self._end_losses()
            raise SlowConsumer(
                self.subscription,
                pending=self.pending,
                pending_bytes=self.pending_bytes,
                dropped=self.dropped,
                dropped_bytes=self.dropped_bytes,
            )
        item, size = entry
        if size is None:
            return item
        self.pending -= 1
        self.pending_bytes -= size
        self.delivered += 1
        self._end_losses()
        self._tell_flow()
        return item

    def keep_only(self, wanted: Callable[[T], bool]) -> None:
        """Remove the deliveries not ``wanted`` (they come again: they count as neither
        delivered nor dropped)."""
        entries = list(self._entries)
        self._entries.clear()
        for entry in entries:
            if entry is None or entry[1] is None or wanted(entry[0]):
                self._entries.append(entry)
            else:
                self.pending -= 1
                self.pending_bytes -= entry[1]
        self._end_losses()
        self._tell_flow()

    def close(self) -> None:
        """Nothing more comes: ``get`` hands out what is queued, then None."""
        self._closed = True
        self._changed.set()
        self._tell_flow()

    def statistics(self) -> PendingStatistics:
        return PendingStatistics(
            self.pending,
            self.pending_bytes,
            self.delivered,
            self.dropped,
            self.dropped_bytes,
            self.max_pending,
            self.max_pending_bytes,
        )

    def _end_losses(self) -> None:
        """The episode of losses is over once it was told and the queue is half empty."""
        if (
            self._losing
            and not self._marked
            and self.pending <= self.max_pending // 2
            and self.pending_bytes <= self.max_pending_bytes // 2
        ):
            self._losing = False

    def _tell_flow(self) -> None:
        if self._flow is None:
            return
        full = not self._closed and not self.has_room
        if full != self._full:
            self._full = full
            self._flow(not full)
