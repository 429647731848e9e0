"""Back-pressure across the overlay: a congested link slows every broker's publishers.

A broker whose link to a neighbour holds more than it should (``Limits.pause_at``, decided by
the runtime) stops reading from its own publishers, and tells the overlay: it floods a
``RouteCongestion`` naming itself, again every ``REFRESH`` seconds while it lasts, and once
more when it has cleared. Every broker passes each on once (the origin's run and number say
which is newer) and, while any other broker is congested, stops reading from its publishers
too. Links are still read everywhere, so nothing that was accepted waits on a cycle of
brokers; what publishers send meanwhile waits in their sockets.

The state is soft: a congestion not heard of again within ``HOLD`` seconds is over, so that
one whose origin died or was cut off never holds the overlay for long.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from padres.broker.routes import Out
from padres.model.protocol import RouteCongestion

__all__ = ["HOLD", "ORIGINS", "REFRESH", "Congestion"]

REFRESH: Final = 1.0
"""Seconds between two floods of a congestion that lasts."""
HOLD: Final = 3.0
"""Seconds a congestion holds once heard of, unless heard of again."""
ORIGINS: Final = 4096
"""Brokers whose latest congestion a broker remembers; past that, those over go."""


@dataclass
class _Heard:
    run: str
    seq: int
    until: float
    """When it is over, unless heard of again (0.0: it has cleared)."""


class Congestion:
    """One broker's part in back-pressure across the overlay."""

    def __init__(self, broker_id: str, run: str, peers: Mapping[str, str]) -> None:
        """``run``: this run of the broker (a congestion from an earlier run is older);
        ``peers``: the neighbour brokers by hop (read, never changed)."""
        self.id = broker_id
        self._run = run
        self._peers = peers
        self._seq = 0
        self._own = False
        self._told = 0.0
        self._heard: dict[str, _Heard] = {}

    def local(self, congested: bool, now: float) -> list[Out]:
        """Whether one of this broker's links is congested now: what to flood, if anything
        (a change, or a congestion that lasts and is due to be told again)."""
        if congested == self._own and not (congested and now - self._told >= REFRESH):
            return []
        self._own, self._told = congested, now
        self._seq += 1
        return self._flood(RouteCongestion(self.id, self._run, self._seq, congested), None)

    def arrive(self, message: RouteCongestion, hop: str, now: float) -> list[Out]:
        """A congestion flooded by the neighbour on ``hop``: taken and passed on once."""
        if message.origin == self.id:
            return []
        heard = self._heard.get(message.origin)
        if heard is not None and heard.run == message.run and heard.seq >= message.seq:
            return []
        until = now + HOLD if message.congested else 0.0
        self._heard[message.origin] = _Heard(message.run, message.seq, until)
        if len(self._heard) > ORIGINS:  # those over long ago go first
            for origin, past in list(self._heard.items()):
                if past.until <= now and len(self._heard) > ORIGINS // 2:
                    del self._heard[origin]
        return self._flood(message, hop)

    def elsewhere(self, now: float) -> bool:
        """Whether another broker is congested now."""
        return any(heard.until > now for heard in self._heard.values())

    def origins(self, now: float) -> list[str]:
        """The other brokers congested now."""
        return sorted(origin for origin, heard in self._heard.items() if heard.until > now)

    def _flood(self, message: RouteCongestion, source: str | None) -> list[Out]:
        return [(hop, message) for hop in self._peers if hop != source]
