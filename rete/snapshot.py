"""The partial matches a network holds, as plain values: to keep them, and to rebuild a network
that goes on exactly as the first would have.

``Network.snapshot()`` takes them; ``Network.restore(snapshot)`` gives them to a network holding
the same composite conditions, added in the same order, that has matched nothing yet. The
facts held are listed once each (``Snapshot.facts``, as the caller gave them to ``match``) and
referred to by their place in that list; the rest is numbers, timestamps and the values
variables bound, so that a caller can write a snapshot down with the facts encoded its own way.

Only a network that shares no memories between composites (``Network(share=False)``) can be
taken so: a shared memory belongs to several composites, whose states are then not each their
own.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from rete.operators import Value

__all__ = ["Buffered", "Expiring", "Held", "JoinState", "Snapshot", "TemporalState", "Waiting"]


class Held(NamedTuple):
    """A fact as one part of a composite holds it."""

    number: int
    """Its number: the order it arrived in (a composite matched in arrival order), or the
    order it was released in (one matched in timestamp order)."""
    fact: int
    """Its place in ``Snapshot.facts``."""
    bindings: dict[str, Value]


class Buffered(NamedTuple):
    """A fact waiting in a temporal composite's reorder buffer."""

    arrival: int
    fact: int
    hits: dict[int, dict[str, Value]]
    """The parts it satisfies, and its bindings for each."""


class Waiting(NamedTuple):
    """A match of a temporal composite waiting for its window to close."""

    pattern: int
    held: list[Held]
    """Its facts, one per slot of the pattern."""
    bindings: dict[str, Value]
    closes_at: datetime | None
    closes_after: int | None


class TemporalState(NamedTuple):
    """What one composite matched in timestamp order holds."""

    newest: datetime | None
    clock: datetime | None
    ahead: datetime | None
    arrivals: int
    numbered: int
    late: int
    early: int
    evicted: int
    buffer: list[Buffered]
    memories: list[list[Held]]
    """Per part, the facts it holds, oldest first."""
    waiting: list[Waiting]


class JoinState(NamedTuple):
    """What one composite matched in arrival order holds."""

    added: list[int]
    """When it was added (the number of the last fact matched before)."""
    memories: list[list[Held]]
    """Per part, the facts it holds, oldest first."""


class Expiring(NamedTuple):
    """A fact in the queue of the network's window (``CompositeLimits.window``)."""

    timestamp: datetime
    number: int
    parts: list[tuple[int, int]]
    """The memories holding it: (composite, part), composites numbered in the order they were
    added."""


class Snapshot(NamedTuple):
    """The partial matches of a network's composites (see the module docstring)."""

    facts: list[Any]
    seq: int
    """The number of the last fact matched."""
    clock: datetime | None
    """The time of the last ``advance``, and the latest timestamp it lets in."""
    ahead: datetime | None
    evicted: int
    late: int
    early: int
    newest: datetime | None
    """The newest timestamp the network's window has seen, and its horizon."""
    horizon: datetime | None
    expiring: list[Expiring]
    joins: list[JoinState]
    """Per composite matched in arrival order, in the order they were added."""
    temporal: list[TemporalState]
    """Per composite matched in timestamp order, in the order they were added."""
