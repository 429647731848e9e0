"""What the network matches: tests, variable bindings, conjunctions and composite conditions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple, Protocol, TypeAlias

from rete.limits import Consumption
from rete.operators import Op, Value, evaluate

__all__ = [
    "Absence",
    "Bind",
    "Composite",
    "Conjunction",
    "Fact",
    "Gap",
    "Order",
    "TemporalComposite",
    "Test",
]


class Fact(Protocol):
    """What the network matches: attribute values and a timestamp (for composite windows)."""

    @property
    def attributes(self) -> Mapping[str, Value]: ...

    @property
    def timestamp(self) -> datetime: ...


class Test(NamedTuple):
    """``attribute op operand``: one alpha test, shared by every condition that uses it.

    A named tuple: compiling thousands of conditions unpacks tests in tight loops.
    """

    attribute: str
    op: Op
    operand: Value | None = None

    def passes(self, attributes: Mapping[str, Value]) -> bool:
        value = attributes.get(self.attribute)
        return value is not None and evaluate(self.op, self.operand, value)

    # Tests are dict keys (shared alpha nodes); as plain tuples 1, 1.0 and True would be one key.
    def __eq__(self, other: object) -> bool:
        return (
            type(other) is Test
            and tuple.__eq__(self, other)
            and type(self.operand) is type(other.operand)
        )

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash((self.attribute, self.op, self.operand, type(self.operand)))


Test.__test__ = False  # type: ignore[attr-defined]  # not a pytest test class, despite the name


class Bind(NamedTuple):
    """Binds ``variable`` to the value of ``attribute``.

    ``numeric`` binds numbers (operator ``=``), otherwise strings and booleans (``eq``); ``type``
    narrows further: ``S`` strings, ``I`` integers, ``F`` any number, ``""`` no narrowing.
    """

    attribute: str
    variable: str
    numeric: bool
    type: str = ""

    def accepts(self, value: Value) -> bool:
        t = type(value)
        if (t is int or t is float) != self.numeric:
            return False
        if self.type == "S":
            return t is str
        if self.type == "I":
            return t is int
        return True


Conjunction: TypeAlias = tuple[Test | Bind, ...]
"""Tests and bindings that one fact must satisfy together."""


@dataclass(frozen=True, slots=True)
class Composite:
    """Conjunctions joined by AND / OR, in disjunctive normal form.

    ``patterns`` lists the alternatives, each a tuple of indices into ``parts``. A match of a
    pattern is one distinct fact per part with agreeing variable bindings.
    """

    parts: tuple[Conjunction, ...]
    patterns: tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True)
class Gap:
    """In a pattern of a temporal composite: the facts of slots ``left`` all come before those
    of ``right`` (by timestamp, strictly). ``strict``: and no fact satisfying a part of the
    pattern, with agreeing bindings, lies between the last of ``left`` and the first of
    ``right``."""

    left: tuple[int, ...]
    right: tuple[int, ...]
    strict: bool = False


@dataclass(frozen=True, slots=True)
class Absence:
    """In a pattern of a temporal composite: no fact satisfying part ``part`` (with bindings
    agreeing with the match) lies after the last fact of slots ``left`` and before the first
    of ``right``; with ``right`` None, before the window of the match closes."""

    part: int
    left: tuple[int, ...]
    right: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Order:
    """The time constraints of one pattern of a temporal composite."""

    gaps: tuple[Gap, ...] = ()
    absences: tuple[Absence, ...] = ()


@dataclass(frozen=True, slots=True)
class TemporalComposite:
    """A composite evaluated in timestamp order: its ``patterns`` (indices into ``parts``) with
    the ``orders`` of each, a window (``within`` a duration and / or ``events`` facts: the
    facts of a match are at most that far apart), and ``lateness``: how far behind the newest
    timestamp a fact may arrive and still be taken in its place. ``consume`` (None: the
    network's policy) says which match a fact completing several takes, each fact then used
    once.

    Parts that appear only in absences are in ``parts`` but in no pattern's slots."""

    parts: tuple[Conjunction, ...]
    patterns: tuple[tuple[int, ...], ...]
    orders: tuple[Order, ...]
    within: timedelta | None = None
    events: int | None = None
    lateness: timedelta = timedelta(0)
    consume: Consumption | None = None
