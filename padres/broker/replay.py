"""One historic or hybrid subscription at its edge broker: the past, then the live stream.

The databases asked for the past answer independently, each in time order. A ``Feed`` merges
their answers into one time-ordered stream (a publication stored by several databases is
passed on once), holds back live publications while the past is still arriving, and at the
switch passes on those the past did not already contain. From then on live publications pass
through, save those the past already delivered (a publication can reach a database before it
reaches the subscriber). Publications outside the subscription's time window never pass.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Final

from padres.model.messages import Publication, TimeWindow

__all__ = ["SEAM", "Feed"]

SEAM: Final = timedelta(seconds=60)
"""How far around the switch replayed publications are remembered, to drop live duplicates."""

_Key = tuple[str, str]


def _key(pub: Publication) -> _Key:
    return (pub.publisher, pub.id)


class Feed:
    """See the module docstring. ``databases``: those asked; ``live``: a hybrid subscription,
    whose live publications are delivered after the past; ``started``: when it was made."""

    def __init__(
        self,
        window: TimeWindow | None,
        databases: Iterable[str],
        *,
        live: bool,
        started: datetime,
    ) -> None:
        self.window = window
        self.live = live
        self.waiting = set(databases)
        self.answered: list[str] = []
        self.failed: dict[str, str] = {}
        self._queues: dict[str, deque[Publication]] = {db: deque() for db in self.waiting}
        self._held: list[Publication] = []
        self._at: datetime | None = None
        self._at_keys: set[_Key] = set()
        self._recent: set[_Key] = set()
        self._recent_since = started - SEAM
        self._last_replayed: datetime | None = None

    @property
    def done(self) -> bool:
        """Whether every database asked has finished (or failed)."""
        return not self.waiting

    def replayed(self, database: str, pubs: Iterable[Publication]) -> list[Publication]:
        """A database's next publications; returns what can be passed on now."""
        queue = self._queues.get(database)
        if queue is None or database not in self.waiting:
            return []
        queue.extend(p for p in pubs if self.window is None or p.timestamp in self.window)
        return self._merge()

    def finished(self, database: str, error: str = "") -> list[Publication]:
        """A database finished (``error``: it failed); returns what can be passed on now, the
        held live publications included once the last database has finished."""
        if database not in self.waiting:
            return []
        self.waiting.discard(database)
        if error:
            self.failed[database] = error
        else:
            self.answered.append(database)
        out = self._merge()
        if self.done:
            out += [p for p in self._held if _key(p) not in self._recent]
            self._held = []
        return out

    def arrived(self, pub: Publication) -> list[Publication]:
        """A live publication matched; returns it if it is to be passed on now."""
        if not self.live or (self.window is not None and pub.timestamp not in self.window):
            return []
        if not self.done:
            self._held.append(pub)
            return []
        if self._recent:
            if _key(pub) in self._recent:
                return []
            last = self._last_replayed
            if last is not None and pub.timestamp > last + SEAM:
                self._recent.clear()  # the live stream is well past the switch
        return [pub]

    def _merge(self) -> list[Publication]:
        """Pass on replayed publications in time order while no waiting database could still
        send an earlier one."""
        out: list[Publication] = []
        queues = self._queues
        while True:
            heads = [q for q in queues.values() if q]
            if not heads or any(not queues[db] for db in self.waiting):
                return out
            pub = min(heads, key=lambda q: q[0].timestamp).popleft()
            key = _key(pub)
            if pub.timestamp != self._at:
                self._at, self._at_keys = pub.timestamp, set()
            if key in self._at_keys:
                continue  # the same publication from another database
            self._at_keys.add(key)
            if pub.timestamp >= self._recent_since:
                self._recent.add(key)
            self._last_replayed = pub.timestamp
            out.append(pub)
