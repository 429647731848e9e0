"""Filters as SQL: every predicate of the language, with the engine's exact semantics.

A predicate holds for a publication when the attribute is present, of the operator's type, and
the comparison holds (see ``rete.operators``): numbers compare as numbers whether integer or
float, exactly (an integer beyond 2**53 against a float is not rounded), strings by code point,
and ``str-contains`` / ``str-prefix`` / ``str-postfix`` as substring tests, never as patterns.

Each attribute of a class is in one field column per kind of value it has had (see
``historic.schema``): a predicate tests the columns of its operator's kinds, on the
publication's own row; an attribute no stored publication of the class has makes it false.
``predicate_clause`` tests any SQL expressions, one per kind (the columns of an application's
table, in the conditions of ``historic.rules``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from sqlalchemy import ColumnElement, and_, column, false, func, literal, or_

from historic.schema import publications
from padres.model.messages import Filter, Predicate
from rete.operators import Op

__all__ = ["Fields", "filter_clause", "predicate_clause"]

Fields = Mapping[str, Mapping[str, str]]
"""A class's field columns: attribute name -> kind (``i``, ``f``, ``s``, ``b``) -> column."""

_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**63 - 1
_NUMERIC: Final = (Op.LT, Op.LE, Op.GT, Op.GE, Op.EQ_NUM, Op.NE_NUM)


def _int_versus(c: Any, op: Op, x: int | float) -> ColumnElement[bool]:
    """``c op x`` for an integer column ``c``, exact for any operand."""
    if type(x) is float:
        if op in (Op.LT, Op.GE):
            x = math.ceil(x)
        elif op in (Op.LE, Op.GT):
            x = math.floor(x)
        elif not x.is_integer():
            return c.is_not(None) if op is Op.NE_NUM else false()
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
        return c.is_not(None) if holds else false()
    return _compare(c, op, literal(k))


def _float_versus(c: Any, op: Op, x: int | float) -> ColumnElement[bool]:
    """``c op x`` for a float column ``c``, exact for integers no float can hold."""
    xf = float(x)
    if type(x) is float or int(xf) == x:
        return _compare(c, op, literal(xf))
    below, above = (
        (math.nextafter(xf, -math.inf), xf) if xf > x else (xf, math.nextafter(xf, math.inf))
    )
    if op in (Op.LT, Op.LE):
        return _compare(c, Op.LE, literal(below))
    if op in (Op.GT, Op.GE):
        return _compare(c, Op.GE, literal(above))
    return c.is_not(None) if op is Op.NE_NUM else false()


def _compare(c: Any, op: Op, value: Any) -> ColumnElement[bool]:
    match op:
        case Op.LT | Op.STR_LT:
            return c < value  # type: ignore[no-any-return]
        case Op.LE | Op.STR_LE:
            return c <= value  # type: ignore[no-any-return]
        case Op.GT | Op.STR_GT:
            return c > value  # type: ignore[no-any-return]
        case Op.GE | Op.STR_GE:
            return c >= value  # type: ignore[no-any-return]
        case Op.EQ_NUM | Op.EQ:
            return c == value  # type: ignore[no-any-return]
        case _:
            return c != value  # type: ignore[no-any-return]


def _any(parts: list[ColumnElement[bool]]) -> ColumnElement[bool]:
    return or_(*parts) if parts else false()


def predicate_clause(
    kinds: Mapping[str, ColumnElement[Any]], p: Predicate, dialect: str
) -> ColumnElement[bool]:
    """``p`` on the values of its attribute: ``kinds`` maps a kind (``i``, ``f``, ``s``,
    ``b``) to an expression holding the value when it is of that kind, NULL otherwise."""
    op, x = p.op, p.value
    if op is Op.IS_PRESENT:
        return _any([value.is_not(None) for value in kinds.values()])
    if op in _NUMERIC:
        number: int | float = x  # type: ignore[assignment]
        parts = []
        if "i" in kinds:
            parts.append(_int_versus(kinds["i"], op, number))
        if "f" in kinds:
            parts.append(_float_versus(kinds["f"], op, number))
        return _any(parts)
    if type(x) is bool:  # eq / neq on a boolean
        return _compare(kinds["b"], op, literal(x)) if "b" in kinds else false()
    if "s" not in kinds:
        return false()
    text: str = x  # type: ignore[assignment]
    s: Any = kinds["s"]
    if op in (Op.EQ, Op.NEQ, Op.STR_LT, Op.STR_LE, Op.STR_GT, Op.STR_GE):
        by_code_point = s.collate("C") if dialect == "postgresql" else s
        return _compare(by_code_point, op, literal(text))
    n = len(text)
    if op is Op.STR_PREFIX:
        return func.substr(s, 1, n) == literal(text)
    if op is Op.STR_POSTFIX:
        return and_(func.length(s) >= n, func.substr(s, func.length(s) - n + 1) == literal(text))
    position = func.strpos if dialect == "postgresql" else func.instr  # str-contains
    return position(s, literal(text)) > 0


def filter_clause(flt: Filter, dialect: str, fields: Fields) -> ColumnElement[bool]:
    """A WHERE clause over ``publications`` selecting the rows that match ``flt``; ``fields``
    are the field columns of ``flt``'s class."""
    parts: list[ColumnElement[bool]] = [publications.c["class"] == flt.class_name]
    for p in flt.predicates:
        if p.attribute != "class":
            named = fields.get(p.attribute, {})
            kinds: dict[str, ColumnElement[Any]] = {k: column(n) for k, n in named.items()}
            parts.append(predicate_clause(kinds, p, dialect))
    return and_(*parts)
