"""Letting go of the durable subscriptions that clients took to other brokers.

A client that fails over brings its durable subscriptions to another broker (``Roam``). That
broker floods a ``RouteRelease`` naming the broker the client left, the client and the
subscription; every broker passes it on once (it remembers the ids of the last ``REMEMBERED``),
and the broker named drops its copy, with what it queued, unless the client is connected to it
again. A broker that is down while the release passes keeps its copy until it expires
(``BrokerConfig.durable_expiry``).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping
from typing import Final

from padres.broker.durable import Durables
from padres.broker.routes import Out
from padres.model.protocol import RouteRelease

__all__ = ["REMEMBERED", "Releases"]

log = logging.getLogger("padres.broker")

REMEMBERED: Final = 10_000
"""Releases whose ids a broker remembers, so that one crossing a cycle is passed on once."""


class Releases:
    """A broker's part in releasing durable subscriptions that moved away."""

    def __init__(
        self,
        broker_id: str,
        durables: Durables,
        peers: Mapping[str, str],
        new_id: Callable[[], str],
    ) -> None:
        """``peers``: the neighbour brokers by hop (read, never changed); ``new_id``: a new
        overlay-wide id."""
        self.id = broker_id
        self.durables = durables
        self._peers = peers
        self._new_id = new_id
        self._seen: set[str] = set()
        self._order: deque[str] = deque()

    def moved(self, left: str, client: str, subscription: str) -> list[Out]:
        """``client`` brought durable subscription ``subscription`` here from broker
        ``left``: tell the overlay."""
        if not left or left == self.id:
            return []
        return self.arrive(RouteRelease(self._new_id(), left, client, subscription), None)

    def arrive(self, release: RouteRelease, hop: str | None) -> list[Out]:
        """A release from the neighbour on ``hop`` (None: made here): passed on once, and
        acted on if it names this broker."""
        if release.id in self._seen:
            return []
        self._seen.add(release.id)
        self._order.append(release.id)
        if len(self._order) > REMEMBERED:
            self._seen.discard(self._order.popleft())
        out: list[Out] = [(peer, release) for peer in self._peers if peer != hop]
        owner, name = f"{release.client}@{self.id}", release.subscription
        if release.broker != self.id or not self.durables.has(owner, name):
            return out
        if self.durables.hop_of(owner, name) is not None:
            return out  # its client is back here: it stays
        log.info(
            "%s: durable subscription %r of %s let go: its client took it to another broker",
            self.id,
            name,
            owner,
        )
        return out + self.durables.drop(owner, name)
