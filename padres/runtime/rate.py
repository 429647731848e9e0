"""A token bucket: how often something may happen, with a burst of up to ``burst`` at once."""

from __future__ import annotations

import time

__all__ = ["Rate"]


class Rate:
    """At most ``per_second`` events a second on average, ``burst`` of them at once (by
    default a second's worth)."""

    def __init__(self, per_second: float, burst: float | None = None) -> None:
        self.per_second = per_second
        self.burst = per_second if burst is None else burst
        self._tokens = self.burst
        self._at = time.monotonic()

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.per_second)
        self._at = now

    def allow(self) -> bool:
        """Whether one more event may happen now (it is counted if so)."""
        self._refill()
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def charge(self, count: int = 0) -> float:
        """Count ``count`` events that happened, allowed or not; return the seconds until
        the events counted so far are back within the rate (0.0: they are)."""
        self._refill()
        self._tokens -= count
        return max(0.0, -self._tokens / self.per_second)
