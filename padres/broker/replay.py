"""One historic or hybrid subscription at its edge broker: the past, then the live stream.

The databases asked for the past answer independently, each in time order. A ``Feed`` merges
their answers into one time-ordered stream (a publication stored by several databases is
passed on once), holds back live publications while the past is still arriving, and at the
switch passes on those the past did not already contain. From then on live publications pass
through, save those the past already delivered (a publication can reach a database before it
reaches the subscriber). Publications outside the subscription's time window never pass.

A hybrid feed may be *repaired*: when a tree it followed was lost with a failed link and comes
back, the past since the loss is asked again (``reopen``) and merged in the same way, so
that what the live stream missed meanwhile arrives, and nothing it already passed on comes
twice. What a feed passed on is remembered for this, the latest ``REMEMBERED`` publications.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from datetime import datetime
from typing import Final

from padres.model.messages import Publication, TimeWindow

__all__ = ["REMEMBERED", "Feed"]

REMEMBERED: Final = 10_000
"""How many of the publications a feed passed on it remembers, the latest, to drop copies."""

_Key = tuple[str, str]


def _key(pub: Publication) -> _Key:
    return (pub.publisher, pub.id)


class Feed:
    """See the module docstring. ``databases``: those asked; ``live``: a hybrid subscription,
    whose live publications are delivered after the past."""

    def __init__(self, window: TimeWindow | None, databases: Iterable[str], *, live: bool) -> None:
        self.window = window
        self.live = live
        self.answered: list[str] = []
        self.failed: dict[str, str] = {}
        self.waiting: set[str] = set()
        self._queues: dict[str, deque[Publication]] = {}
        self._held: list[Publication] = []
        self._passed: dict[_Key, datetime] = {}
        """The latest publications passed on, oldest first, with their times."""
        self.lost: dict[str, float] = {}
        """Trees this feed followed that were lost with a failed link: tree id -> when
        (Unix seconds, the broker's clock)."""
        self.due = False
        """Whether a lost tree, or a database, came (back) since: a repair is due, and live
        publications are held until it is made."""
        self.reached: datetime | None = None
        """The timestamp of the latest replayed publication merged since the databases were
        asked (None: none yet): every earlier one they will send has been passed on."""
        self._ask(databases)

    @property
    def done(self) -> bool:
        """Whether every database asked has finished (or failed)."""
        return not self.waiting

    def remembers_since(self) -> datetime | None:
        """The time of the oldest publication remembered as passed on, if the memory is full
        (before it, what was passed on is no longer known); None if it is not."""
        if len(self._passed) < REMEMBERED:
            return None
        return next(iter(self._passed.values()))

    def reopen(self, databases: Iterable[str]) -> None:
        """Ask ``databases`` again (a repair): live publications are held until they finish,
        and what they send that was passed on already is dropped."""
        self._ask(databases)

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
        elif database not in self.answered:
            self.answered.append(database)
        return self._merge() + self._release()

    def arrived(self, pub: Publication) -> list[Publication]:
        """A live publication matched; returns it if it is to be passed on now."""
        if not self.live or (self.window is not None and pub.timestamp not in self.window):
            return []
        if not self.done or self.due:
            self._held.append(pub)
            return []
        return [pub] if self._pass(pub) else []

    def settle(self) -> list[Publication]:
        """A repair that was due is not made (nobody to ask): returns the live publications
        held for it."""
        self.due = False
        return self._release()

    def _ask(self, databases: Iterable[str]) -> None:
        self.due = False
        self.reached = None
        self.waiting = set(databases)
        self._queues = {db: deque() for db in self.waiting}

    def _release(self) -> list[Publication]:
        """The held live publications, once neither the past nor a repair holds them."""
        if not self.done or self.due:
            return []
        held, self._held = self._held, []
        return [p for p in held if self._pass(p)]

    def _pass(self, pub: Publication) -> bool:
        """Whether ``pub`` is new here; if it is, it is remembered as passed on."""
        key = _key(pub)
        passed = self._passed
        if key in passed:
            return False
        passed[key] = pub.timestamp
        if len(passed) > REMEMBERED:
            del passed[next(iter(passed))]
        return True

    def _merge(self) -> list[Publication]:
        """Pass on replayed publications in time order while no waiting database could still
        send an earlier one."""
        out: list[Publication] = []
        queues = self._queues
        if len(queues) == 1:  # one database: its order is the order
            (queue,) = queues.values()
            if queue:
                self.reached = queue[-1].timestamp
                out = [p for p in queue if self._pass(p)]
                queue.clear()
            return out
        while True:
            heads = [q for q in queues.values() if q]
            if not heads or any(not queues[db] for db in self.waiting):
                return out
            pub = min(heads, key=lambda q: q[0].timestamp).popleft()
            self.reached = pub.timestamp
            if self._pass(pub):
                out.append(pub)
