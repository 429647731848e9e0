"""What a durable subscription (or its client) has had of each producer's guaranteed
publications.

A publisher whose broker is lost sends again, through another broker, what it was not
acknowledged. Those copies travel down another tree, at other positions, where the trees'
cursors cannot tell them from new publications; their producer and number
(``Publication.origin``) can. Per producer, a durable subscription keeps
the numbers it has taken as ranges: one range while they come in order, a few when a
publication comes late (its first broker forwards it when it is back), each taken once.
PostgreSQL-PS keeps the next number expected per sender; ranges take the late one too.

The ranges are bounded: ``MAX_PRODUCERS`` producers per subscription (the one heard from
longest ago is forgotten first) and ``MAX_RANGES`` ranges per producer (the oldest go first).
Forgetting can only let a very late copy through again, never drop a publication.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from typing import Final

__all__ = ["MAX_PRODUCERS", "MAX_RANGES", "Ranges", "ranges_of", "take"]

MAX_PRODUCERS: Final = 1_000
"""Producers remembered per durable subscription, at most."""
MAX_RANGES: Final = 64
"""Ranges of numbers remembered per producer, at most."""

Ranges = dict[str, list[list[int]]]
"""Per producer, the numbers taken: sorted, disjoint, inclusive ``[first, last]`` ranges,
the producer heard from last at the end (as the journal keeps them)."""


def take(ranges: Ranges, producer: str, seq: int) -> bool:
    """Whether publication ``seq`` of ``producer`` is new in ``ranges``; it is taken (into
    ``ranges``, changed in place) either way."""
    taken = ranges.pop(producer, None)
    if taken is None:
        taken = []
        if len(ranges) >= MAX_PRODUCERS:
            del ranges[next(iter(ranges))]
    ranges[producer] = taken
    if taken and taken[-1][1] + 1 == seq:  # the usual case: the next one
        taken[-1][1] = seq
        return True
    i = bisect_right(taken, seq, key=_first) - 1  # the last range starting at or before it
    if i >= 0 and taken[i][1] >= seq:
        return False
    joins_left = i >= 0 and taken[i][1] + 1 == seq
    joins_right = i + 1 < len(taken) and taken[i + 1][0] == seq + 1
    if joins_left and joins_right:
        taken[i][1] = taken.pop(i + 1)[1]
    elif joins_left:
        taken[i][1] = seq
    elif joins_right:
        taken[i + 1][0] = seq
    else:
        taken.insert(i + 1, [seq, seq])
        if len(taken) > MAX_RANGES:
            del taken[0]
    return True


def ranges_of(given: Mapping[str, Sequence[Sequence[int]]]) -> Ranges:
    """``given`` (ranges from elsewhere, a client's, in any order) as ``take`` keeps them:
    each producer's ranges sorted and disjoint, empty ones left out, within the bounds."""
    ranges: Ranges = {}
    for producer, found in list(given.items())[-MAX_PRODUCERS:]:
        merged: list[list[int]] = []
        for first, last in sorted((r[0], r[1]) for r in found if r[0] <= r[1]):
            if merged and first <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], last)
            else:
                merged.append([first, last])
        ranges[producer] = merged[-MAX_RANGES:]
    return ranges


def _first(numbers: list[int]) -> int:
    return numbers[0]
