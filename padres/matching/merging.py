"""Merging filters, for routing: one filter in place of several, matching all they match.

A filter's predicates on an attribute make an *interval* when they are all bounds of one kind:
numbers (``<``, ``<=``, ``=``, ``>=``, ``>``) or strings (``str-lt``, ``str-le``, ``str-ge``,
``str-gt``, and ``eq`` with a string, a point). Two filters may merge when they have the same
*key*: the same class, the same other predicates (word for word), and intervals on the same
attributes, each of the same kind (``merge_key``). The language has no ``in`` and no
disjunction, so a merged filter is one conjunction again:

- a *perfect* merge matches exactly what one of the two matches: their intervals differ on one
  attribute at most, and there they overlap or touch (``[x,>=,0],[x,<,5]`` and
  ``[x,>=,5],[x,<=,9]`` make ``[x,>=,0],[x,<=,9]``; ``[x,<,5]`` and ``[x,>=,2]`` make every
  number, ``[x,>=,-1.7976931348623157e+308]``);
- an *imperfect* merge is their *hull*: per attribute, the smallest interval holding both. It
  matches publications neither matches (false positives), and is taken only when its estimated
  false-positive rate is at most a bound.

The estimate takes the publications as spread evenly over the box the hull spans, within the
*domain* of each attribute (the range its publishers advertise); only the number attributes on
which the two differ count, the others being the same on both sides. A merged filter carries
``useful``, a lower bound of the share of its box that one of its members matches (1 for a
perfect merge), and merging two, with shares ``ua`` and ``ub``, of boxes ``A`` and ``B``
(volumes relative to the hull ``H``) bounds the new share below by
``max(ua*A + ub*B - |A & B|, ua*A, ub*B) / H``: what both members cover is counted once at
most. The estimated rate is ``1 - useful``, so under the even spread the rate is at most the
estimate, which is at most the bound. Where a differing attribute has no finite extent (an
unbounded hull and no advertised bound) nothing can be estimated, and the filters are not
merged imperfectly; nor are they where they differ on strings, which have no measure here.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Final, NamedTuple, TypeAlias, TypeVar

from padres.model.messages import Filter, Predicate
from rete.operators import Op

__all__ = [
    "Domain",
    "Group",
    "Interval",
    "Merged",
    "best_merge",
    "contains",
    "group",
    "intervals",
    "merge",
    "merge_key",
    "order",
]

Bound: TypeAlias = int | float | str
_K = TypeVar("_K")

_LOWER: Final = {Op.GT: True, Op.GE: False, Op.EQ_NUM: False}
_UPPER: Final = {Op.LT: True, Op.LE: False, Op.EQ_NUM: False}
_STR_LOWER: Final = {Op.STR_GT: True, Op.STR_GE: False, Op.EQ: False}
_STR_UPPER: Final = {Op.STR_LT: True, Op.STR_LE: False, Op.EQ: False}
_ANY_NUMBER: Final = -sys.float_info.max
"""Every number a publication may carry is at least this (floats are finite, integers 64-bit)."""


@dataclass(frozen=True, slots=True)
class Interval:
    """The numbers (or strings) between ``lo`` and ``hi``; None: no bound on that side."""

    numeric: bool
    lo: Bound | None = None
    lo_open: bool = True
    hi: Bound | None = None
    hi_open: bool = True

    def empty(self) -> bool:
        if self.lo is None or self.hi is None:
            return False
        return self.lo > self.hi or (  # type: ignore[operator]
            self.lo == self.hi and (self.lo_open or self.hi_open)
        )

    def within(self, other: Interval) -> bool:
        """Whether every value here is in ``other``."""
        return _starts_later(self, other) and _ends_sooner(self, other)

    def joins(self, other: Interval) -> bool:
        """Whether the union with ``other`` is one interval (they overlap or touch)."""
        first, second = (self, other) if _starts_later(other, self) else (other, self)
        if first.hi is None or second.lo is None:
            return True
        if second.lo == first.hi:
            return not (first.hi_open and second.lo_open)
        return second.lo < first.hi  # type: ignore[operator]

    def hull(self, other: Interval) -> Interval:
        """The smallest interval holding both."""
        lo = self if _starts_later(other, self) else other
        hi = self if _ends_sooner(other, self) else other
        return Interval(self.numeric, lo.lo, lo.lo_open, hi.hi, hi.hi_open)

    def meet(self, other: Interval) -> Interval | None:
        """The values in both (None: none)."""
        lo = self if _starts_later(self, other) else other
        hi = self if _ends_sooner(self, other) else other
        met = Interval(self.numeric, lo.lo, lo.lo_open, hi.hi, hi.hi_open)
        return None if met.empty() else met

    def width(self) -> float:
        """Its length (numbers only; infinite when unbounded)."""
        if self.lo is None or self.hi is None:
            return float("inf")
        return float(self.hi) - float(self.lo)

    def predicates(self, attribute: str) -> tuple[Predicate, ...]:
        """The predicates that make this interval on ``attribute``."""
        if self.lo is not None and self.lo == self.hi:
            return (Predicate(attribute, Op.EQ_NUM if self.numeric else Op.EQ, self.lo),)
        out: list[Predicate] = []
        if self.lo is not None:
            if self.numeric:
                op = Op.GT if self.lo_open else Op.GE
            else:
                op = Op.STR_GT if self.lo_open else Op.STR_GE
            out.append(Predicate(attribute, op, self.lo))
        if self.hi is not None:
            if self.numeric:
                op = Op.LT if self.hi_open else Op.LE
            else:
                op = Op.STR_LT if self.hi_open else Op.STR_LE
            out.append(Predicate(attribute, op, self.hi))
        if not out:  # every number, or every string
            bound = Predicate(attribute, Op.GE, _ANY_NUMBER)
            out.append(bound if self.numeric else Predicate(attribute, Op.STR_GE, ""))
        return tuple(out)


def _starts_later(a: Interval, b: Interval) -> bool:
    """Whether ``a`` starts no sooner than ``b``."""
    if b.lo is None:
        return True
    if a.lo is None:
        return False
    if a.lo == b.lo:
        return a.lo_open or not b.lo_open
    return a.lo > b.lo  # type: ignore[operator]


def _ends_sooner(a: Interval, b: Interval) -> bool:
    """Whether ``a`` ends no later than ``b``."""
    if b.hi is None:
        return True
    if a.hi is None:
        return False
    if a.hi == b.hi:
        return a.hi_open or not b.hi_open
    return a.hi < b.hi  # type: ignore[operator]


def _interval(predicates: list[Predicate]) -> Interval | None:
    """The interval ``predicates`` on one attribute make, if they make one."""
    bounds = [p for p in predicates if p.op is not Op.IS_PRESENT]
    if not bounds:
        return None
    if all(p.op in _LOWER or p.op in _UPPER for p in bounds):
        numeric, lower, upper = True, _LOWER, _UPPER
    elif all(p.op in _STR_LOWER or p.op in _STR_UPPER for p in bounds) and all(
        type(p.value) is str for p in bounds
    ):
        numeric, lower, upper = False, _STR_LOWER, _STR_UPPER
    else:
        return None
    iv: Interval | None = Interval(numeric)
    for p in bounds:
        value: Bound = p.value  # type: ignore[assignment]
        if iv is not None and p.op in lower:
            iv = iv.meet(Interval(numeric, value, lower[p.op]))
        if iv is not None and p.op in upper:
            iv = iv.meet(Interval(numeric, hi=value, hi_open=upper[p.op]))
    return iv


@lru_cache(maxsize=1 << 16)
def intervals(flt: Filter) -> Mapping[str, Interval]:
    """The attributes of ``flt`` whose predicates make an interval (its class aside); read-only."""
    by_attribute: dict[str, list[Predicate]] = {}
    for p in flt.predicates:
        if p.attribute != "class":
            by_attribute.setdefault(p.attribute, []).append(p)
    out: dict[str, Interval] = {}
    for attribute, predicates in sorted(by_attribute.items()):
        iv = _interval(predicates)
        if iv is not None:
            out[attribute] = iv
    return out


@lru_cache(maxsize=1 << 16)
def merge_key(flt: Filter) -> Hashable | None:
    """What filters that may merge with ``flt`` have in common with it (None: it merges with
    none, having no interval, or a time window)."""
    ranges = intervals(flt)
    if not ranges or flt.window is not None:
        return None
    rest = frozenset(p for p in flt.predicates if p.attribute not in ranges)
    return rest, tuple((a, iv.numeric) for a, iv in ranges.items())


def order(flt: Filter) -> tuple[tuple[int, Bound, bool], ...]:
    """A sort key: filters of one key in the order of their intervals' lower bounds."""
    return tuple(
        (0, 0, False) if iv.lo is None else (1, iv.lo, iv.lo_open) for iv in intervals(flt).values()
    )


def contains(a: Filter, b: Filter) -> bool:
    """Whether ``a`` matches every publication ``b`` matches, both of one key (sound)."""
    if merge_key(a) != merge_key(b) or merge_key(a) is None:
        return False
    mine = intervals(a)
    return all(iv.within(mine[attribute]) for attribute, iv in intervals(b).items())


Domain: TypeAlias = Callable[[str], Interval | None]
"""The numbers publications may carry on an attribute (None: any)."""


class Merged(NamedTuple):
    filter: Filter
    useful: float
    """A lower bound of the share of the filter's box that one of its members matches: 1 when
    it matches exactly what they match."""


def merge(
    a: Filter,
    b: Filter,
    useful: tuple[float, float] = (1.0, 1.0),
    bound: float = 0.0,
    domain: Domain | None = None,
) -> Merged | None:
    """``a`` and ``b`` (of shares ``useful``) merged into one filter: perfectly if they can be,
    else imperfectly when the estimated false-positive rate is at most ``bound`` (see the
    module docstring); None if neither."""
    key = merge_key(a)
    if key is None or key != merge_key(b):
        return None
    ia, ib = intervals(a), intervals(b)
    differ = [attribute for attribute, iv in ia.items() if iv != ib[attribute]]
    if not differ:
        return Merged(a, max(useful))
    if useful == (1.0, 1.0) and len(differ) == 1:
        attribute = differ[0]
        if ia[attribute].joins(ib[attribute]):
            return Merged(_rebuilt(a, {attribute: ia[attribute].hull(ib[attribute])}), 1.0)
    if bound <= 0.0 or not all(ia[attribute].numeric for attribute in differ):
        return None
    share = _share(ia, ib, differ, useful, domain)
    if share is None or 1.0 - share > bound:
        return None
    # Not a perfect merge, even where what it adds has no width (a point between two open
    # ends): never reported as one.
    share = min(share, math.nextafter(1.0, 0.0))
    return Merged(_rebuilt(a, {d: ia[d].hull(ib[d]) for d in differ}), share)


def _share(
    ia: Mapping[str, Interval],
    ib: Mapping[str, Interval],
    differ: list[str],
    useful: tuple[float, float],
    domain: Domain | None,
) -> float | None:
    """The lower bound of the hull's useful share (see the module docstring); None when the
    hull has no finite extent on an attribute where they differ."""
    va = vb = vab = 1.0  # volumes relative to the hull's, attribute by attribute
    for attribute in differ:
        dom = None if domain is None else domain(attribute)
        hull = ia[attribute].hull(ib[attribute])
        if dom is not None:
            hull = hull.meet(dom)  # type: ignore[assignment]
            if hull is None:
                return None
        extent = hull.width()
        if not 0.0 < extent < float("inf"):
            return None
        both = ia[attribute].meet(ib[attribute])
        va *= _clipped(ia[attribute], hull) / extent
        vb *= _clipped(ib[attribute], hull) / extent
        vab *= 0.0 if both is None else _clipped(both, hull) / extent
    ua, ub = useful[0] * va, useful[1] * vb
    return min(1.0, max(ua + ub - vab, ua, ub))


def _clipped(iv: Interval, within: Interval) -> float:
    met = iv.meet(within)
    return 0.0 if met is None else met.width()


def _rebuilt(flt: Filter, replaced: Mapping[str, Interval]) -> Filter:
    """``flt`` with the predicates on each attribute of ``replaced`` made its interval."""
    out: list[Predicate] = []
    done: set[str] = set()
    for p in flt.predicates:
        iv = replaced.get(p.attribute)
        if iv is None:
            out.append(p)
        elif p.attribute not in done:
            done.add(p.attribute)
            out += iv.predicates(p.attribute)
    return Filter(tuple(out))


class Group(NamedTuple):
    """Filters merged into one (``group``)."""

    filter: Filter
    useful: float
    members: tuple[str, ...]


def best_merge(
    flt: Filter,
    useful: float,
    size: int,
    candidates: Iterable[tuple[_K, Filter, float, int]],
    bound: float,
    domain: Domain | None,
    most: int,
) -> tuple[Merged, _K] | None:
    """The best merge of ``flt`` (of share ``useful``, standing for ``size`` members) with
    one of ``candidates`` (key, filter, share, size), and that one's key; a perfect merge ends
    the search, and none may stand for over ``most`` members. None if none merges."""
    best: tuple[Merged, _K] | None = None
    for key, other, other_useful, other_size in candidates:
        if size + other_size > most:
            continue
        merged = merge(flt, other, (useful, other_useful), bound, domain)
        if merged is not None and (best is None or merged.useful > best[0].useful):
            best = (merged, key)
            if merged.useful >= 1.0:
                break
    return best


def group(
    filters: Iterable[tuple[str, Filter]],
    bound: float = 0.0,
    domain: Domain | None = None,
    *,
    scan: int = 16,
    most: int = 64,
) -> list[Group]:
    """``filters`` (by id) merged among themselves, key by key, in the order of their
    intervals: each joins a group that already matches all it matches, or merges with the
    groups of its key while one merges (the best first), or is a group of its own. A merge
    tries at most the ``scan`` latest groups, and a group holds at most ``most``."""
    by_key: dict[object, list[tuple[str, Filter]]] = {}
    for ident, flt in filters:
        key = merge_key(flt)
        by_key.setdefault(ident if key is None else key, []).append((ident, flt))
    out: list[Group] = []
    for items in by_key.values():
        pool: list[Group] = []
        for ident, flt in sorted(items, key=lambda item: order(item[1])):
            home = next(
                (
                    k
                    for k in range(len(pool) - 1, max(-1, len(pool) - 1 - scan), -1)
                    if len(pool[k].members) < most and contains(pool[k].filter, flt)
                ),
                None,
            )
            if home is not None:
                joined = pool[home]
                pool[home] = joined._replace(members=(*joined.members, ident))
                continue
            current = Group(flt, 1.0, (ident,))
            while True:
                latest = range(len(pool) - 1, max(-1, len(pool) - 1 - scan), -1)
                best = best_merge(
                    current.filter,
                    current.useful,
                    len(current.members),
                    ((k, pool[k].filter, pool[k].useful, len(pool[k].members)) for k in latest),
                    bound,
                    domain,
                    most,
                )
                if best is None:
                    break
                merged, k = best
                current = Group(
                    merged.filter, merged.useful, (*pool.pop(k).members, *current.members)
                )
            pool.append(current)
        out += pool
    return out
