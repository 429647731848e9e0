"""Connections that have not yet shown who they are, bounded per address and overall.

A WebSocket connection is a stranger until the broker accepts its ``hello``; an HTTP connection
while it has not sent a whole request's headers (when it opens, and between its requests). A
stranger holds a file descriptor and a little memory for nothing yet, so a broker takes at most
``per_address`` of them from one address and ``total`` in all; one more is closed at once.
Neighbours, accepted clients and requests under way are never counted, so a flood of strangers
leaves them the descriptors they need (``total`` is kept well below the process's limit).
"""

from __future__ import annotations

import resource
from collections import Counter
from collections.abc import Hashable
from typing import Final

__all__ = ["PER_ADDRESS", "Strangers", "default_total"]

PER_ADDRESS: Final = 256
"""Strangers one address may hold at once, by default."""
TOTAL: Final = 4096
"""Strangers in all, by default, unless a quarter of the descriptors the process may open is
fewer."""


def default_total() -> int:
    """``TOTAL``, or a quarter of the file descriptors this process may open if fewer: the rest
    is kept for links, accepted clients and the broker's own files."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return TOTAL if soft == resource.RLIM_INFINITY else max(16, min(TOTAL, soft // 4))


class Strangers:
    """See the module docstring."""

    def __init__(self, per_address: int = PER_ADDRESS, total: int | None = None) -> None:
        self.per_address = per_address
        self.total = default_total() if total is None else total
        self.refused = 0
        """Connections closed at once for being one stranger too many."""
        self._addresses: dict[Hashable, str] = {}
        self._counts: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._addresses)

    def arrive(self, key: Hashable, address: str) -> str | None:
        """Count ``key`` (a connection) from ``address`` as a stranger; or, when that would be
        one too many, why it is refused (it is not counted)."""
        if key in self._addresses:
            return None
        if self._counts[address] >= self.per_address:
            self.refused += 1
            return f"too many connections from {address} that have not said who they are"
        if len(self._addresses) >= self.total:
            self.refused += 1
            return "too many connections that have not said who they are"
        self._addresses[key] = address
        self._counts[address] += 1
        return None

    def leave(self, key: Hashable) -> None:
        """``key`` is no longer a stranger (it has said who it is, or it is gone)."""
        address = self._addresses.pop(key, None)
        if address is None:
            return
        self._counts[address] -= 1
        if not self._counts[address]:
            del self._counts[address]
