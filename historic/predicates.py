"""Filters as SQL: every predicate of the language, with the engine's exact semantics.

A predicate holds for a publication when the attribute is present, of the operator's type, and
the comparison holds (see ``rete.operators``): numbers compare as numbers whether integer or
float, exactly (an integer beyond 2**53 against a float is not rounded), strings by code point,
and ``str-contains`` / ``str-prefix`` / ``str-postfix`` as substring tests, never as patterns.
"""

from __future__ import annotations

import math
from typing import Any, Final

from sqlalchemy import ColumnElement, and_, exists, false, func, literal, or_, select, true
from sqlalchemy.sql.expression import FromClause

from historic.schema import attributes, publications
from padres.messages import Filter, Predicate
from rete.operators import Op

__all__ = ["filter_clause"]

_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**63 - 1


def _int_versus(column: Any, op: Op, x: int | float) -> ColumnElement[bool]:
    """``column op x`` for integer ``column``, exact for any operand."""
    if type(x) is float:
        if op is Op.LT:
            op, x = Op.LT, math.ceil(x)
        elif op is Op.LE:
            op, x = Op.LE, math.floor(x)
        elif op is Op.GT:
            op, x = Op.GT, math.floor(x)
        elif op is Op.GE:
            op, x = Op.GE, math.ceil(x)
        elif not x.is_integer():
            return true() if op is Op.NE_NUM else false()
        else:
            x = int(x)
    k = int(x)
    if k > _INT_MAX or k < _INT_MIN:
        above = k > _INT_MAX  # every stored integer is below k (or above, if not)
        holds = {
            Op.LT: above,
            Op.LE: above,
            Op.GT: not above,
            Op.GE: not above,
            Op.EQ_NUM: False,
            Op.NE_NUM: True,
        }[op]
        return true() if holds else false()
    return _compare(column, op, literal(k))


def _float_versus(column: Any, op: Op, x: int | float) -> ColumnElement[bool]:
    """``column op x`` for float ``column``, exact for integers no float can hold."""
    xf = float(x)
    if type(x) is float or int(xf) == x:
        return _compare(column, op, literal(xf))
    below, above = (
        (math.nextafter(xf, -math.inf), xf) if xf > x else (xf, math.nextafter(xf, math.inf))
    )
    if op in (Op.LT, Op.LE):
        return _compare(column, Op.LE, literal(below))
    if op in (Op.GT, Op.GE):
        return _compare(column, Op.GE, literal(above))
    return true() if op is Op.NE_NUM else false()


def _compare(column: Any, op: Op, value: Any) -> ColumnElement[bool]:
    match op:
        case Op.LT | Op.STR_LT:
            return column < value  # type: ignore[no-any-return]
        case Op.LE | Op.STR_LE:
            return column <= value  # type: ignore[no-any-return]
        case Op.GT | Op.STR_GT:
            return column > value  # type: ignore[no-any-return]
        case Op.GE | Op.STR_GE:
            return column >= value  # type: ignore[no-any-return]
        case Op.EQ_NUM | Op.EQ:
            return column == value  # type: ignore[no-any-return]
        case _:
            return column != value  # type: ignore[no-any-return]


def _value_test(a: FromClause, p: Predicate, dialect: str) -> ColumnElement[bool]:
    op, x = p.op, p.value
    c = a.c
    if op is Op.IS_PRESENT:
        return true()
    if op in (Op.LT, Op.LE, Op.GT, Op.GE, Op.EQ_NUM, Op.NE_NUM):
        number: int | float = x  # type: ignore[assignment]
        return or_(
            and_(c.kind == "i", _int_versus(c.i, op, number)),
            and_(c.kind == "f", _float_versus(c.f, op, number)),
        )
    if type(x) is bool:  # eq / neq on a boolean
        return and_(c.kind == "b", _compare(c.b, op, literal(x)))
    text: str = x  # type: ignore[assignment]
    s = c.s if dialect != "postgresql" else c.s.collate("C")  # compare by code point
    if op in (Op.EQ, Op.NEQ, Op.STR_LT, Op.STR_LE, Op.STR_GT, Op.STR_GE):
        return and_(c.kind == "s", _compare(s, op, literal(text)))
    n = len(text)
    if op is Op.STR_PREFIX:
        test = func.substr(c.s, 1, n) == literal(text)
    elif op is Op.STR_POSTFIX:
        test = and_(func.length(c.s) >= n, func.substr(c.s, func.length(c.s) - n + 1) == text)
    else:  # str-contains
        position = func.strpos if dialect == "postgresql" else func.instr
        test = position(c.s, literal(text)) > 0
    return and_(c.kind == "s", test)


def filter_clause(flt: Filter, dialect: str) -> ColumnElement[bool]:
    """A WHERE clause over ``publications`` selecting the rows that match ``flt``."""
    parts: list[ColumnElement[bool]] = [publications.c["class"] == flt.class_name]
    for p in flt.predicates:
        if p.attribute == "class":
            continue
        a = attributes.alias()
        parts.append(
            exists(
                select(literal(1))
                .select_from(a)
                .where(a.c.pub == publications.c.pk, a.c.name == p.attribute)
                .where(_value_test(a, p, dialect))
            )
        )
    return and_(*parts)
