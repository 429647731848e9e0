"""Which files of an archive can hold a publication matching a filter: the pruning decision,
made from the catalog alone, without reading a file.

A file's statistics describe a closed region: every row is of the file's class, has a time in
``[start, end]``, and carries only the attributes of its columns, each value within its
column's ``[minimum, maximum]`` (an attribute with columns of several types may take any of
them). A file is read when the filter overlaps that region, decided by the relation the brokers
route with (``padres.matching.relations.overlaps``), attribute by attribute and type by type.

``overlaps`` compares numbers as floats, so integers beyond 2**53 are first widened to the
nearest floats outside them, on both sides: the decision may keep a file it could have skipped,
never the other way round.
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Final

from padres.matching.relations import overlaps
from padres.model.messages import Filter, Predicate
from rete.operators import NUMERIC, Op, Value
from spark.columns import attribute_of, type_of
from spark.stats import ColumnStats, FileStats

__all__ = ["float_above", "float_below", "may_match", "prune", "region"]

_EXACT: Final = 2**53
_LOWEST: Final = -sys.float_info.max
_HIGHEST: Final = sys.float_info.max


def float_below(x: int | float) -> float:
    """The largest float not above ``x``."""
    f = float(x)
    return f if f <= x else math.nextafter(f, -math.inf)


def float_above(x: int | float) -> float:
    """The smallest float not below ``x``."""
    f = float(x)
    return f if f >= x else math.nextafter(f, math.inf)


def _relaxed(p: Predicate) -> list[Predicate]:
    """``p`` with an integer operand float cannot hold exactly replaced by float bounds around
    it (a weaker test, so no match is lost)."""
    x = p.value
    if p.op not in NUMERIC or type(x) is not int or abs(x) <= _EXACT:
        return [p]
    a = p.attribute
    if p.op in (Op.LT, Op.LE):
        return [Predicate(a, Op.LE, float_above(x))]
    if p.op in (Op.GT, Op.GE):
        return [Predicate(a, Op.GE, float_below(x))]
    if p.op is Op.EQ_NUM:
        return [Predicate(a, Op.GE, float_below(x)), Predicate(a, Op.LE, float_above(x))]
    return [Predicate(a, Op.IS_PRESENT)]  # <>: any number but one


def _boxes(attribute: str, kind: type, c: ColumnStats) -> list[tuple[Predicate, ...]]:
    """The values one column of a file may hold, as conjunctions of predicates."""
    low, high = c.low, c.high
    if kind is bool:
        values: Sequence[Value] = (False, True) if low is None or low != high else (low,)
        return [(Predicate(attribute, Op.EQ, v),) for v in values]
    if kind is str:
        if low is None or high is None:
            return [(Predicate(attribute, Op.STR_GE, ""),)]
        return [(Predicate(attribute, Op.STR_GE, low), Predicate(attribute, Op.STR_LE, high))]
    lo = _LOWEST if low is None else float_below(low)  # type: ignore[arg-type]
    hi = _HIGHEST if high is None else float_above(high)  # type: ignore[arg-type]
    return [(Predicate(attribute, Op.GE, lo), Predicate(attribute, Op.LE, hi))]


def region(stats: FileStats) -> dict[str, list[tuple[Predicate, ...]]]:
    """Attribute -> the alternatives (one per value type) its values lie in, in this file.
    A column whose every value is null holds nothing, and is left out."""
    found: defaultdict[str, list[tuple[Predicate, ...]]] = defaultdict(list)
    for name, c in stats.columns.items():
        if c.nulls >= stats.rows:
            continue
        attribute = attribute_of(name)
        found[attribute].extend(_boxes(attribute, type_of(name), c))
    return dict(found)


def may_match(flt: Filter, stats: FileStats) -> bool:
    """Whether the file can hold a publication matching ``flt`` (never False when it does)."""
    if stats.class_name != flt.class_name or stats.rows == 0:
        return False
    window = flt.window
    if window is not None and (
        (window.start is not None and stats.end < window.start)
        or (window.end is not None and stats.start >= window.end)
    ):
        return False
    by_attribute: defaultdict[str, list[Predicate]] = defaultdict(list)
    for p in flt.predicates:
        if p.attribute != "class":
            by_attribute[p.attribute].extend(_relaxed(p))
    if not by_attribute:
        return True
    cls = Predicate("class", Op.EQ, stats.class_name)
    boxes = region(stats)
    for attribute, predicates in by_attribute.items():
        wanted = Filter((cls, *predicates))
        if not any(
            overlaps(wanted, Filter((cls, *box)), b_closed=True) for box in boxes.get(attribute, ())
        ):
            return False
    return True


def prune(flt: Filter, files: Iterable[FileStats]) -> list[FileStats]:
    """The files ``flt`` has to read."""
    return [f for f in files if may_match(flt, f)]
