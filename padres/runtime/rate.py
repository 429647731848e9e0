"""A token bucket: how often something may happen, with a burst of up to a second's worth."""

from __future__ import annotations

import time

__all__ = ["Rate"]


class Rate:
    """At most ``per_second`` events a second on average, ``per_second`` of them at once."""

    def __init__(self, per_second: float) -> None:
        self.per_second = per_second
        self._tokens = per_second
        self._at = time.monotonic()

    def allow(self) -> bool:
        """Whether one more event may happen now (it is counted if so)."""
        now = time.monotonic()
        self._tokens = min(self.per_second, self._tokens + (now - self._at) * self.per_second)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True
