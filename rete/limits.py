"""How composite subscriptions keep and use partial matches."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

__all__ = ["CompositeLimits", "Consumption", "Policy"]


class Policy(StrEnum):
    """What happens to publications once they complete a composite match."""

    CONSUME_AND_REMAIN = "consume-and-remain"
    """They stay and may complete further matches (PADRES' only policy; the default)."""
    CONSUME = "consume"
    """They are used once: a match forgets the publications that completed it."""


class Consumption(StrEnum):
    """Which match a temporal composite takes, when it uses each fact once and a fact
    completes several: the one whose other facts came first, or last (by timestamp)."""

    FIRST = "first"
    LAST = "last"


@dataclass(frozen=True, slots=True)
class CompositeLimits:
    """Bounds on the partial state of each composite subscription.

    ``max_facts`` publications at most per part (the oldest are evicted first); with ``window``
    set, none whose timestamp is older than the newest timestamp seen minus ``window``.

    ``distinct``: each part of a match is filled by a different publication (the default). With
    ``distinct=False`` one publication may fill several parts, as in PADRES: ``[number,150],
    [price,70]`` alone completes ``{[number,>,120]} & {[price,<,80]}``. Distinct is the default
    because a composite subscription correlates several events; a single publication that
    satisfies every part is what the atomic subscription joining the parts' predicates matches,
    and counting it as a correlation would make ``{[class,eq,'A']} & {[class,eq,'A']}`` (two
    orders) fire on every order.
    """

    policy: Policy = Policy.CONSUME_AND_REMAIN
    max_facts: int = 10_000
    window: timedelta | None = None
    distinct: bool = True

    def __post_init__(self) -> None:
        if self.max_facts < 1:
            raise ValueError("max_facts must be at least 1")
        if self.window is not None and self.window <= timedelta(0):
            raise ValueError("window must be positive")
