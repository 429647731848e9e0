"""Taking up a historic or hybrid subscription after a reconnect: no gap, no duplicate.

A subscription whose time window reaches into the past gets the stored past, then (a hybrid
one) the live publications. When its connection is lost and made again, the client asks for
it again with its window starting at the oldest timestamp among the latest deliveries it
remembers (``Seen``, at most ``SEEN`` of them), and drops what comes again of those: what was
published while it was away comes from the databases, what it had comes no second time.

A publication timestamped before that start (a publisher whose clock is behind, publishing
while the client was away) is not asked for again; nor is one the client received before the
``SEEN`` latest, if it comes again.
"""

from __future__ import annotations

from collections import deque
from datetime import datetime
from typing import Final

from msgspec.structs import replace

from padres.model.messages import Filter, Publication, Subscription, TimeWindow
from padres.model.protocol import Subscribe

__all__ = ["SEEN", "Seen", "past_start"]

SEEN: Final = 100_000
"""Deliveries a historic or hybrid subscription remembers, the latest."""


class Seen:
    """The latest publications a subscription received: their publisher and id, and their
    timestamps."""

    def __init__(self, most: int = SEEN) -> None:
        self._most = most
        self._order: deque[tuple[datetime, tuple[str, str]]] = deque()
        self._keys: set[tuple[str, str]] = set()

    def first(self, pub: Publication) -> bool:
        """Whether ``pub`` is new (it is remembered then); False if it came already."""
        key = (pub.publisher, pub.id)
        if key in self._keys:
            return False
        self._keys.add(key)
        self._order.append((pub.timestamp, key))
        if len(self._order) > self._most:
            self._keys.discard(self._order.popleft()[1])
        return True

    def since(self) -> datetime | None:
        """The oldest timestamp remembered (None before the first delivery)."""
        return min((at for at, _ in self._order), default=None)

    def resumed(self, request: Subscription | Subscribe) -> Subscription | Subscribe:
        """``request`` to make again after a reconnect: its window starts at ``since``."""
        start = self.since()
        if start is None:
            return request
        sub = request.subscription if isinstance(request, Subscribe) else request
        flt = sub.filter
        window = flt.window if flt.window is not None else TimeWindow()
        if window.start is not None and window.start >= start:
            return request
        moved = Subscription(sub.id, Filter(flt.predicates, TimeWindow(start, window.end)))
        return replace(request, subscription=moved) if isinstance(request, Subscribe) else moved


def past_start(request: object) -> datetime | None:
    """The start of the window of ``request``, if it asks for a subscription whose window
    reaches into the past (a historic or hybrid one)."""
    sub = request.subscription if isinstance(request, Subscribe) else request
    if not isinstance(sub, Subscription) or sub.filter.window is None:
        return None
    return sub.filter.window.start
