"""What the network matches: tests, variable bindings, conjunctions and composite conditions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple, Protocol, TypeAlias

from rete.operators import Op, Value, evaluate

__all__ = ["Bind", "Composite", "Conjunction", "Fact", "Test"]


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
