"""Measuring a link to a neighbour broker: pings in the data's own way.

Every ``PROBE`` seconds the node sends each neighbour a ``LinkPing`` carrying the time on its
own monotonic clock, through the link's send queue, behind whatever waits there; the
neighbour's node answers with a ``LinkPong`` carrying the same time, as soon as it reads the
ping, through its own send queue. So the round trip is the network's both ways, the queue on
each side, and the time each side takes to read: what a publication pays, twice. One ping is
out at a time; its round trips are smoothed (``SMOOTHING``), and half of that is the link's
cost. A ping unanswered for ``SUSPECT`` seconds (or four smoothed round trips, if longer)
makes the neighbour *suspect*: the link is open, but nothing crosses it now (the neighbour is
frozen, or buried in work). The broker core takes the measures (``Broker.measured``) and
moves trees away from suspect or slow parents (``padres.broker.paths``); the keepalive, which
closes a link silent for two heartbeats, is separate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from padres.broker.paths import LinkState
from padres.model.protocol import LinkPing

__all__ = ["PROBE", "SMOOTHING", "SUSPECT", "Probe"]

PROBE: Final = 0.25
"""Seconds between two pings of a link."""
SUSPECT: Final = 1.0
"""Seconds a ping may wait for its answer, at least, before the neighbour is suspect."""
SMOOTHING: Final = 0.25
"""The weight of a new round trip in the smoothed one."""


@dataclass
class Probe:
    """The measures of one link."""

    rtt: float | None = None
    """The smoothed round trip, in seconds (None before the first answer)."""
    sent: float | None = None
    """When the ping still unanswered was sent (the node's monotonic clock)."""
    last: float = float("-inf")
    """When the latest ping was sent."""
    samples: int = 0
    """Answers taken."""

    def ping(self, now: float) -> LinkPing | None:
        """The ping to send now, if one is due (none while one is unanswered)."""
        if self.sent is not None or now - self.last < PROBE:
            return None
        self.sent = self.last = now
        return LinkPing(now)

    def pong(self, sent: float, now: float) -> None:
        """The answer to the ping sent at ``sent`` came at ``now``."""
        if sent != self.sent:
            return  # not the one out (from before a restart of the link, say)
        sample = max(0.0, now - sent)
        self.rtt = sample if self.rtt is None else self.rtt + SMOOTHING * (sample - self.rtt)
        self.sent = None
        self.samples += 1

    def state(self, now: float) -> LinkState:
        """The link as measured now."""
        rtt = self.rtt or 0.0
        suspect = self.sent is not None and now - self.sent > max(SUSPECT, 4 * rtt)
        return LinkState(rtt / 2, suspect)
