"""Taking up subscriptions after a reconnect: no gap, no duplicate.

A durable subscription lives at a broker. When its client comes back at another one (it
failed over), it brings the subscription along (``Standing``): the new broker makes it anew,
as old as the client says, and asks the roots of the trees it follows for the guaranteed
publications made since then that the client has not processed, by producer and number
(``Roam``). What the old broker held for it that was not guaranteed, and what the client had
received and not processed, is not brought: the latter comes again from the roots.

A subscription whose time window reaches into the past gets the stored past, then (a hybrid
one) the live publications. When its connection is lost and made again, the client asks for
it again with its window starting at the oldest timestamp among the latest deliveries it
remembers (``Seen``, at most ``SEEN`` of them), and drops what comes again of those: what was
published while it was away comes from the databases, what it had comes no second time.

A composite subscription whose parts reach into the past is asked for again as it was, its
whole range: its matches depend on everything before them in the range (a sequence's state,
a count window, a consumption policy), so it cannot start later. Matched again over the
stored publications, it reports the same matches, and those it missed while away; the client
drops the matches it remembers (by their publications and bindings).

A publication timestamped before that start (a publisher whose clock is behind, publishing
while the client was away) is not asked for again; nor is one the client received before the
``SEEN`` latest, if it comes again (nor a match before the ``SEEN`` latest).
"""

from __future__ import annotations

import time
from collections import deque
from datetime import datetime
from typing import Final

from msgspec.structs import replace

from padres.model.messages import (
    CompositeSubscription,
    Filter,
    Origin,
    Publication,
    Subscription,
    TimeWindow,
)
from padres.model.producers import Ranges, take
from padres.model.protocol import CompositeNotify, Notify, Roam, Subscribe
from rete.operators import Value

__all__ = ["SEEN", "Seen", "Standing", "windowed"]

SEEN: Final = 10_000
"""Deliveries a historic or hybrid subscription remembers, the latest."""


_Key = tuple[str, str]
_MatchKey = tuple[tuple[_Key, ...], tuple[tuple[str, Value], ...]]


def _key(pub: Publication) -> _Key:
    return (pub.publisher, pub.id)


class Seen:
    """The latest deliveries a subscription received: publications by their publisher and id,
    matches of a composite by their publications and bindings; and their timestamps (a
    match's: its first publication's)."""

    def __init__(self, most: int = SEEN) -> None:
        self._most = most
        self._order: deque[tuple[datetime, _Key | _MatchKey]] = deque()
        self._keys: set[_Key | _MatchKey] = set()

    def first(self, delivery: Notify | CompositeNotify) -> bool:
        """Whether ``delivery`` is new (it is remembered then); False if it came already."""
        key: _Key | _MatchKey
        if isinstance(delivery, Notify):
            key, at = _key(delivery.publication), delivery.publication.timestamp
        else:
            pubs = delivery.publications
            key = (tuple(map(_key, pubs)), tuple(sorted(delivery.bindings.items())))
            at = min(p.timestamp for p in pubs)
        if key in self._keys:
            return False
        self._keys.add(key)
        self._order.append((at, key))
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


def windowed(request: object) -> bool:
    """Whether ``request`` asks for a subscription whose time window has a start (a historic
    or hybrid one, when the start is past), or a composite one with such a part."""
    sub = request.subscription if isinstance(request, Subscribe) else request
    if isinstance(sub, Subscription):
        windows = [sub.filter.window]
    elif isinstance(sub, CompositeSubscription):
        windows = [f.window for f in sub.filters]
    else:
        return False
    return any(w is not None and w.start is not None for w in windows)


class Standing:
    """Where a durable subscription stands, for its client: the broker it lives at, since
    when it exists, and the guaranteed publications processed, by producer."""

    def __init__(self, broker: str) -> None:
        self.broker = broker
        self._since = time.monotonic()
        self.taken: Ranges = {}
        self._received: deque[tuple[int, Origin]] = deque()
        """The deliveries received and not yet processed that have an origin: (number, origin)."""

    def received(self, seq: int, pub: Publication) -> None:
        """Delivery ``seq`` (of ``pub``) has come."""
        if isinstance(pub.origin, Origin):
            self._received.append((seq, pub.origin))

    def processed(self, upto: int) -> None:
        """The deliveries up to ``upto`` are processed."""
        received = self._received
        while received and received[0][0] <= upto:
            origin = received.popleft()[1]
            take(self.taken, origin.producer, origin.seq)

    def moved(self, broker: str) -> Roam:
        """The subscription goes to ``broker``: what to tell it there. What was received and
        not processed is forgotten (it comes again)."""
        self._received.clear()
        left, self.broker = self.broker, broker
        return Roam(max(0.0, time.monotonic() - self._since), left, self.taken)
