"""A filter as a pyarrow dataset expression, pushed down into the Parquet reader so that it
skips row groups by their statistics and rows before they become publications.

The expression may let through rows the filter does not match (those are checked exactly
afterwards), never the other way round: a predicate is pushed only where pyarrow compares
exactly as the language does (integers with integers, floats with floats, strings byte by byte,
which for UTF-8 is by code point), and left to the exact check otherwise.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from padres.model.messages import Filter, Predicate
from rete.operators import NUMERIC, Op
from spark.columns import TIME

__all__ = ["pushdown"]

_COMPARE: dict[Op, str] = {
    Op.LT: "less",
    Op.LE: "less_equal",
    Op.GT: "greater",
    Op.GE: "greater_equal",
    Op.EQ_NUM: "equal",
    Op.NE_NUM: "not_equal",
    Op.EQ: "equal",
    Op.NEQ: "not_equal",
    Op.STR_LT: "less",
    Op.STR_LE: "less_equal",
    Op.STR_GT: "greater",
    Op.STR_GE: "greater_equal",
}


def _compare(op: Op, column: str, value: object) -> Any:
    return getattr(pc, _COMPARE[op])(pc.field(column), pc.scalar(value))


def _predicate(p: Predicate, columns: Collection[str]) -> Any | None:
    """``p`` as an expression over the file's columns, or None to leave it to the exact check."""
    a, op, x = p.attribute, p.op, p.value
    if op is Op.IS_PRESENT:
        return None
    if op in NUMERIC:
        present = [c for c in (f"{a}__int", f"{a}__float") if c in columns]
        if not present:
            return pc.scalar(False)
        if any(c.endswith("__int") != (type(x) is int) for c in present):
            return None  # int against float: compared exactly only afterwards
        tests = [_compare(op, c, x) for c in present]
        return tests[0] if len(tests) == 1 else tests[0] | tests[1]
    column = f"{a}__bool" if type(x) is bool else f"{a}__str"
    if column not in columns:
        return pc.scalar(False)
    if op is Op.STR_PREFIX:
        return pc.starts_with(pc.field(column), x)
    if op is Op.STR_POSTFIX:
        return pc.ends_with(pc.field(column), x)
    if op is Op.STR_CONTAINS:
        return pc.match_substring(pc.field(column), x)
    return _compare(op, column, x)


def pushdown(flt: Filter, columns: Collection[str]) -> Any:
    """The expression to read a file with ``columns`` by."""
    tests: list[Any] = []
    window = flt.window
    if window is not None and window.start is not None:
        tests.append(
            pc.field(TIME) >= pa.scalar(window.start.astimezone(UTC), pa.timestamp("us", "UTC"))
        )
    if window is not None and window.end is not None:
        tests.append(
            pc.field(TIME) < pa.scalar(window.end.astimezone(UTC), pa.timestamp("us", "UTC"))
        )
    for p in flt.predicates:
        if p.attribute != "class" and (test := _predicate(p, columns)) is not None:
            tests.append(test)
    expression = pc.scalar(True)
    for test in tests:
        expression = expression & test
    return expression
