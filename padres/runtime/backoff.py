"""Waiting between attempts: the one backoff of every retry loop (dialling a broker, a link to a
neighbour, writing to a database).

The delays double from ``first`` up to ``most``; each is drawn at random between half of it and
all of it (jitter), so that many clients that lost the same broker do not all dial it again at
the same instant.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

__all__ = ["Backoff"]


@dataclass
class Backoff:
    """Exponential backoff with jitter; ``reset`` after a success."""

    first: float = 0.1
    most: float = 5.0
    _delay: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.first <= self.most:
            raise ValueError("backoff delays must satisfy 0 < first <= most")
        self._delay = self.first

    def reset(self) -> None:
        self._delay = self.first

    def next(self) -> float:
        """The next delay, in seconds."""
        delay = self._delay * random.uniform(0.5, 1.0)
        self._delay = min(2 * self._delay, self.most)
        return delay

    async def wait(self) -> None:
        """Sleep for the next delay."""
        await asyncio.sleep(self.next())
