"""The test operators and what each one means: the single definition every matcher follows.

A test never matches a fact that lacks its attribute, or whose value is not of the operator's
type: numeric operators need a number (int or float, never a boolean), ``eq`` and ``neq`` need a
value of the operand's own type (string or boolean), string operators need a string.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any, Final, TypeAlias

__all__ = [
    "NUMERIC",
    "STRING",
    "Op",
    "OperandKind",
    "Value",
    "evaluate",
    "operand_kind",
    "predicate_test",
]

Value: TypeAlias = bool | int | float | str
"""An attribute value. ``bool`` comes first: a subclass of ``int``, but a type of its own here."""


class Op(StrEnum):
    """Predicate operators, spelled as in PADRES."""

    LT = "<"
    LE = "<="
    EQ_NUM = "="
    NE_NUM = "<>"
    GT = ">"
    GE = ">="
    EQ = "eq"
    NEQ = "neq"
    STR_LT = "str-lt"
    STR_LE = "str-le"
    STR_GT = "str-gt"
    STR_GE = "str-ge"
    STR_CONTAINS = "str-contains"
    STR_PREFIX = "str-prefix"
    STR_POSTFIX = "str-postfix"
    IS_PRESENT = "isPresent"

    # A member equals its string, so hashing it as that string is consistent, and runs in C
    # (Enum.__hash__ is Python code, and operators are looked up in dicts on hot paths).
    __hash__ = str.__hash__


class OperandKind(StrEnum):
    """What an operator's operand must be."""

    NUMBER = "number"
    STRING_OR_BOOLEAN = "string or boolean"
    STRING = "string"
    NONE = "nothing"


NUMERIC: Final = frozenset({Op.LT, Op.LE, Op.EQ_NUM, Op.NE_NUM, Op.GT, Op.GE})
STRING: Final = frozenset(
    {
        Op.STR_LT,
        Op.STR_LE,
        Op.STR_GT,
        Op.STR_GE,
        Op.STR_CONTAINS,
        Op.STR_PREFIX,
        Op.STR_POSTFIX,
    }
)


def operand_kind(op: Op) -> OperandKind:
    if op in NUMERIC:
        return OperandKind.NUMBER
    if op in STRING:
        return OperandKind.STRING
    if op is Op.IS_PRESENT:
        return OperandKind.NONE
    return OperandKind.STRING_OR_BOOLEAN


def _is_number(v: object) -> bool:
    t = type(v)
    return t is int or t is float


_Test = Callable[[Any, Any], bool]
"""A test receives the publication's value first, then the operand."""

_TESTS: Final[dict[Op, _Test]] = {
    Op.LT: lambda v, x: _is_number(v) and v < x,
    Op.LE: lambda v, x: _is_number(v) and v <= x,
    Op.EQ_NUM: lambda v, x: _is_number(v) and v == x,
    Op.NE_NUM: lambda v, x: _is_number(v) and v != x,
    Op.GT: lambda v, x: _is_number(v) and v > x,
    Op.GE: lambda v, x: _is_number(v) and v >= x,
    Op.EQ: lambda v, x: type(v) is type(x) and v == x,
    Op.NEQ: lambda v, x: type(v) is type(x) and v != x,
    Op.STR_LT: lambda v, x: type(v) is str and v < x,
    Op.STR_LE: lambda v, x: type(v) is str and v <= x,
    Op.STR_GT: lambda v, x: type(v) is str and v > x,
    Op.STR_GE: lambda v, x: type(v) is str and v >= x,
    Op.STR_CONTAINS: lambda v, x: type(v) is str and x in v,
    Op.STR_PREFIX: lambda v, x: type(v) is str and v.startswith(x),
    Op.STR_POSTFIX: lambda v, x: type(v) is str and v.endswith(x),
    Op.IS_PRESENT: lambda v, x: True,
}


def evaluate(op: Op, operand: Value | None, value: Value) -> bool:
    """Whether a present attribute ``value`` satisfies ``[attr, op, operand]``."""
    return _TESTS[op](value, operand)


def predicate_test(op: Op) -> _Test:
    """The test of ``op``: called with a present attribute's value, then the operand."""
    return _TESTS[op]
