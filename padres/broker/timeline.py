"""The parts of a historic or hybrid composite matched in timestamp order, as one stream.

A composite with a sequence or a window (``within``, ``late``, ``consume``) reads one time
range: each of its parts has a ``Feed`` (its past from the databases, then its live
publications), and the composite's temporal network must see all of them as one stream in
timestamp order, the past and the live publications alike, as the reference evaluation of the
same publications does (docs/language.md, "Sequences and windows"). A ``Timeline`` makes that
stream:

* A publication several parts' feeds pass on is taken once (by publisher and id).
* While a feed is still replaying its past, a publication is let go only once that feed's past
  has gone beyond it (``Feed.reached``): the feeds answer independently, and one may be far
  behind another. While a repair is due, nothing is let go.
* A replayed publication stamped at or after the *seam*, the moment the subscription was made,
  waits until every feed has finished its past: the live stream (held by the feeds meanwhile)
  may still bring earlier ones, and a database may not have written everything up to its
  answer. At the switch, the end of the past and the held live publications go out together
  in timestamp order.
* A publication stamped more than ``AHEAD`` after the broker's clock is dropped (counted in
  ``early``), as a live composite ignores it: one stamped years ahead would make every other
  one late.

What waits here is bounded as a ``Feed``'s queues are: by how far one feed's past runs ahead of
another's, and by the live publications held while the past is replayed.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Final

from padres.broker.replay import REMEMBERED, Feed
from padres.model.messages import Publication

__all__ = ["AHEAD", "Timeline"]

AHEAD: Final = timedelta(minutes=1)
"""Composites matched in timestamp order ignore a publication stamped further ahead of the
broker's clock than this: one stamped years ahead would make every other one late."""

_Key = tuple[str, str]


class Timeline:
    """See the module docstring. ``seam``: when the subscription was made; ``end``: the end of
    its time range (None: open); ``late``: its lateness."""

    def __init__(self, seam: datetime, end: datetime | None, late: timedelta) -> None:
        self.seam = seam
        self.end = end
        self.late = late
        self.limit = seam + AHEAD
        """Publications stamped after this are dropped (``advance``)."""
        self.early = 0
        self._heap: list[tuple[datetime, int, _Key]] = []
        self._waiting: dict[_Key, Publication] = {}
        self._taken: dict[_Key, None] = {}
        """The latest publications let go (at most ``REMEMBERED``), oldest first."""
        self._added = 0

    def __len__(self) -> int:
        """How many publications wait."""
        return len(self._waiting)

    def add(self, pubs: Iterable[Publication]) -> None:
        """Publications a part's feed passed on."""
        for pub in pubs:
            key = (pub.publisher, pub.id)
            if key in self._waiting or key in self._taken:
                continue
            if pub.timestamp > self.limit:
                self.early += 1
                continue
            self._added += 1
            self._waiting[key] = pub
            heapq.heappush(self._heap, (pub.timestamp, self._added, key))

    def ready(self, feeds: Iterable[Feed]) -> list[Publication]:
        """The publications that may go now, in timestamp order (arrival order between equal
        timestamps), given the parts' ``feeds``."""
        bound: datetime | None = None
        for feed in feeds:
            if feed.done and not feed.due:
                continue
            if feed.due or feed.reached is None:
                return []
            bound = min(self.seam if bound is None else bound, feed.reached)
        out: list[Publication] = []
        heap = self._heap
        while heap and (bound is None or heap[0][0] < bound):
            _, _, key = heapq.heappop(heap)
            out.append(self._waiting.pop(key))
            self._taken[key] = None
            if len(self._taken) > REMEMBERED:
                del self._taken[next(iter(self._taken))]
        return out

    def advance(self, clock: datetime) -> datetime:
        """The broker's clock is ``clock``: publications stamped more than ``AHEAD`` after it
        are dropped from now on. Returns the clock as the composite's network may take it:
        never beyond the end of its range plus its lateness, so that a window still open at
        the range's end never closes."""
        self.limit = clock + AHEAD
        closing = self.closing
        return clock if closing is None else min(clock, closing)

    @property
    def closing(self) -> datetime | None:
        """The time that closes every window closing within the range: its end plus the
        lateness (the watermark is then the end); None for an open range."""
        return None if self.end is None else self.end + self.late
