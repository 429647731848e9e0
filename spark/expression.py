"""A filter as a Spark column expression, equal to the reference matcher on every row.

Each predicate becomes a test of the typed columns of its attribute (``spark.columns``); a null
column is a missing attribute, on which no predicate holds, as in the language. Numbers compare
exactly across types: an integer column against a float operand compares with the operand
rounded to the integers the right way, a float column against an integer float cannot hold
with the floats around it, so Spark never rounds a 64-bit integer to a double.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from datetime import UTC
from functools import reduce
from typing import Any, Final

from padres.model.messages import Filter, Predicate
from rete.operators import NUMERIC, Op
from spark.columns import SUFFIXES, TIME
from spark.plan import float_above, float_below

__all__ = ["expression"]

_MIN: Final = -(2**63)
_MAX: Final = 2**63 - 1


def _functions() -> Any:
    from pyspark.sql import functions

    return functions


def _col(name: str) -> Any:
    return _functions().col(f"`{name}`")


def _lit(value: object) -> Any:
    return _functions().lit(value)


def _compare(c: Any, op: Op, x: Any) -> Any:
    if op in (Op.LT, Op.STR_LT):
        return c < x
    if op in (Op.LE, Op.STR_LE):
        return c <= x
    if op in (Op.GT, Op.STR_GT):
        return c > x
    if op in (Op.GE, Op.STR_GE):
        return c >= x
    if op in (Op.EQ_NUM, Op.EQ):
        return c == x
    return c != x


def _integers(c: Any, op: Op, k: int) -> Any:
    """``c op k`` for a 64-bit integer column and any integer ``k``."""
    if k > _MAX or k < _MIN:
        below = k > _MAX  # every value is below k
        holds = {
            Op.LT: below,
            Op.LE: below,
            Op.GT: not below,
            Op.GE: not below,
            Op.EQ_NUM: False,
            Op.NE_NUM: True,
        }[op]
        return c.isNotNull() if holds else _lit(False)
    return _compare(c, op, _lit(k).cast("long"))


def _int_column(c: Any, op: Op, x: int | float) -> Any:
    if type(x) is int:
        return _integers(c, op, x)
    if op in (Op.LT, Op.GE):  # v < x  <=>  v < ceil(x);  v >= x  <=>  v >= ceil(x)
        return _integers(c, op, math.ceil(x))
    if op in (Op.LE, Op.GT):  # v <= x  <=>  v <= floor(x);  v > x  <=>  v > floor(x)
        return _integers(c, op, math.floor(x))
    if float(x).is_integer():
        return _integers(c, op, int(x))
    return _lit(False) if op is Op.EQ_NUM else c.isNotNull()


def _float_column(c: Any, op: Op, x: int | float) -> Any:
    if type(x) is float or float(x) == x:
        return _compare(c, op, _lit(float(x)))
    # x lies strictly between two floats: no float equals it
    if op in (Op.LT, Op.LE):
        return c <= _lit(float_below(x))
    if op in (Op.GT, Op.GE):
        return c >= _lit(float_above(x))
    return _lit(False) if op is Op.EQ_NUM else c.isNotNull()


def _any(tests: list[Any]) -> Any:
    return reduce(lambda a, b: a | b, tests) if tests else _lit(False)


def _predicate(p: Predicate, columns: Collection[str]) -> Any:
    a, op, x = p.attribute, p.op, p.value
    typed = {t: f"{a}__{s}" for t, s in SUFFIXES.items() if f"{a}__{s}" in columns}
    if op is Op.IS_PRESENT:
        return _any([_col(name).isNotNull() for name in typed.values()])
    if op in NUMERIC:
        tests = []
        if int in typed:
            tests.append(_int_column(_col(typed[int]), op, x))  # type: ignore[arg-type]
        if float in typed:
            tests.append(_float_column(_col(typed[float]), op, x))  # type: ignore[arg-type]
        return _any(tests)
    name = typed.get(type(x))
    if name is None:
        return _lit(False)
    c = _col(name)
    if op is Op.STR_PREFIX:
        return c.startswith(x)
    if op is Op.STR_POSTFIX:
        return c.endswith(x)
    if op is Op.STR_CONTAINS:
        return c.contains(x)
    return _compare(c, op, _lit(x))


def expression(flt: Filter, columns: Collection[str]) -> Any:
    """``flt`` (and its window) over a table of one class with ``columns``."""
    tests = [_predicate(p, columns) for p in flt.predicates if p.attribute != "class"]
    window = flt.window
    if window is not None and window.start is not None:
        tests.append(_col(TIME) >= _lit(window.start.astimezone(UTC)))
    if window is not None and window.end is not None:
        tests.append(_col(TIME) < _lit(window.end.astimezone(UTC)))
    return reduce(lambda a, b: a & b, tests) if tests else _lit(True)
