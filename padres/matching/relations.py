"""Relations between filters, for routing: can two filters match one publication (overlap), and
does every publication one matches also match the other (covering)?

Each relation is decided attribute by attribute, over the values each side allows there. Routing
needs ``overlaps`` never to answer no for filters that share a publication (a lost delivery),
and ``covers`` never to answer yes for a filter that is not covered. ``overlaps`` is exact, for
numbers, booleans and strings whatever the operators combined on one attribute (see
``_Strings.nonempty``), so no subscription travels toward advertisements it cannot match.
``covers`` is exact for numbers (integers and floats compared by exact value) and booleans;
for strings it decides from the operands (``str-prefix 'ab'`` implies ``str-ge 'ab'``, say)
and answers no when it cannot tell (a larger routing table, never a lost delivery).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import combinations, islice
from typing import Final, TypeAlias, TypeVar

from padres.model.messages import Filter, Predicate
from rete.operators import NUMERIC, STRING, Op, evaluate

__all__ = [
    "EqKey",
    "covering",
    "covers",
    "eq_key",
    "eq_subkeys",
    "overlaps",
    "satisfiable",
]

T = TypeVar("T")


@dataclass
class _Numbers:
    """The numbers an attribute's predicates allow: an interval of the reals less some points.

    Bounds keep their operands' types: an integer and a float are compared by exact value, as
    Python compares them (``2**53 + 1 > float(2**53)``), never by converting one to the other.
    Deciding over the reals is sound for the integers and floats publications carry: an
    interval empty of reals holds none of them, and one within another holds only their values.
    """

    lo: int | float = -math.inf
    lo_open: bool = True
    hi: int | float = math.inf
    hi_open: bool = True
    excluded: set[int | float] = field(default_factory=set)

    def restrict(self, op: Op, x: int | float) -> None:
        if op in (Op.GT, Op.GE, Op.EQ_NUM) and (x > self.lo or (x == self.lo and op is Op.GT)):
            self.lo, self.lo_open = x, op is Op.GT
        if op in (Op.LT, Op.LE, Op.EQ_NUM) and (x < self.hi or (x == self.hi and op is Op.LT)):
            self.hi, self.hi_open = x, op is Op.LT
        if op is Op.NE_NUM:
            self.excluded.add(x)

    def contains(self, x: int | float) -> bool:
        above = x > self.lo or (x == self.lo and not self.lo_open)
        below = x < self.hi or (x == self.hi and not self.hi_open)
        return above and below and x not in self.excluded

    def empty(self) -> bool:
        if self.lo < self.hi:
            return False  # an interval of reals less finitely many points
        return not (self.lo == self.hi and self.contains(self.lo))

    def within(self, other: _Numbers) -> bool:
        """Whether every number allowed here is allowed by ``other`` (exact)."""
        if self.empty():
            return True
        if self.lo == self.hi:
            return other.contains(self.lo)
        lower = self.lo > other.lo or (self.lo == other.lo and (self.lo_open or not other.lo_open))
        upper = self.hi < other.hi or (self.hi == other.hi and (self.hi_open or not other.hi_open))
        # Points other excludes must be outside this interval or excluded here too.
        points = all(not self.contains(x) for x in other.excluded)
        return lower and upper and points


_LEAST: Final = "\x01"
"""The smallest character a string value may hold (NUL is refused: docs/language.md)."""


@dataclass
class _Strings:
    """The strings an attribute's predicates allow."""

    equal: set[str] = field(default_factory=set)
    excluded: set[str] = field(default_factory=set)
    prefixes: set[str] = field(default_factory=set)
    suffixes: set[str] = field(default_factory=set)
    parts: set[str] = field(default_factory=set)
    bounds: list[tuple[Op, str]] = field(default_factory=list)

    def admits(self, s: str) -> bool:
        return (
            all(s == e for e in self.equal)
            and s not in self.excluded
            and all(s.startswith(p) for p in self.prefixes)
            and all(s.endswith(q) for q in self.suffixes)
            and all(c in s for c in self.parts)
            and all(_string_test(op, s, x) for op, x in self.bounds)
        )

    def nonempty(self) -> bool:
        """Whether some string satisfies the predicates (exact).

        The bounds and the prefixes make an interval of the string order, ``[low, high)``
        (``high`` None: no end). An interval that holds infinitely many strings holds, past
        ``low``, strings with any ending, so suffixes, substrings and the finitely many
        excluded strings cannot empty it; a finite one (``high`` is ``low`` followed by
        ``_LEAST`` characters) is checked string by string.
        """
        if self.equal:
            return len(self.equal) == 1 and self.admits(next(iter(self.equal)))
        tail = max(self.suffixes, key=len, default="")
        if any(not tail.endswith(q) for q in self.suffixes):
            return False
        low: str = ""
        high: str | None = None
        for op, x in self.bounds:
            if op in (Op.STR_GT, Op.STR_GE):
                low = max(low, x + _LEAST if op is Op.STR_GT else x)
            else:
                end = x + _LEAST if op is Op.STR_LE else x
                high = end if high is None else min(high, end)
        for prefix in self.prefixes:  # the strings starting with it: [prefix, _after(prefix))
            low = max(low, prefix)
            after = _after(prefix)
            if after is not None:
                high = after if high is None else min(high, after)
        if high is not None and low >= high:
            return False
        if high is not None and high.startswith(low) and not high[len(low) :].strip(_LEAST):
            return any(self.admits(low + _LEAST * k) for k in range(len(high) - len(low)))
        return True

    def implies(self, op: Op, x: str) -> bool:
        """Whether every string allowed here passes ``[attr, op, x]`` (sound, not complete)."""
        if self.equal:
            return all(_string_test(op, e, x) for e in self.equal)
        if op is Op.NEQ:
            return not self.admits(x)  # admits is exact for a single string
        if op is Op.STR_PREFIX:
            return any(p.startswith(x) for p in self.prefixes)
        if op is Op.STR_POSTFIX:
            return any(q.endswith(x) for q in self.suffixes)
        if op is Op.STR_CONTAINS:
            return any(x in s for s in self.prefixes | self.suffixes | self.parts)
        if op in (Op.STR_GT, Op.STR_GE):
            return any(_at_least(bop, b, op, x) for bop, b in self.bounds) or any(
                p > x or (p == x and op is Op.STR_GE) for p in self.prefixes
            )
        if op in (Op.STR_LT, Op.STR_LE):
            return any(_at_most(bop, b, op, x) for bop, b in self.bounds)
        return False


def _after(prefix: str) -> str | None:
    """The smallest string above every string that starts with ``prefix`` (None: there is
    none, every character of ``prefix`` being the last code point)."""
    stem = prefix.rstrip("\U0010ffff")
    return stem[:-1] + chr(ord(stem[-1]) + 1) if stem else None


def _string_test(op: Op, s: str, x: str) -> bool:
    return evaluate(op, x, s)


def _at_least(bop: Op, b: str, op: Op, x: str) -> bool:
    """[s bop b] implies [s op x] for a lower bound."""
    if bop is Op.STR_GT:
        return b >= x
    if bop is Op.STR_GE:
        return b > x or (b == x and op is Op.STR_GE)
    return False


def _at_most(bop: Op, b: str, op: Op, x: str) -> bool:
    """[s bop b] implies [s op x] for an upper bound."""
    if bop is Op.STR_LT:
        return b <= x
    if bop is Op.STR_LE:
        return b < x or (b == x and op is Op.STR_LE)
    return False


@dataclass
class _Space:
    """What one attribute's predicates allow, by type."""

    numbers: _Numbers | None = field(default_factory=_Numbers)
    strings: _Strings | None = field(default_factory=_Strings)
    booleans: set[bool] | None = field(default_factory=lambda: {True, False})

    def add(self, p: Predicate) -> None:
        op, x = p.op, p.value
        if op is Op.IS_PRESENT:
            return
        if op in NUMERIC:
            self.strings = self.booleans = None
            if self.numbers is not None:
                self.numbers.restrict(op, x)  # type: ignore[arg-type]
            return
        if type(x) is bool:  # eq / neq on a boolean
            self.numbers = self.strings = None
            if self.booleans is not None:
                self.booleans = {b for b in self.booleans if (b == x) == (op is Op.EQ)}
            return
        self.numbers = self.booleans = None
        if self.strings is None:
            return
        text: str = x  # type: ignore[assignment]
        if op is Op.EQ:
            self.strings.equal.add(text)
        elif op is Op.NEQ:
            self.strings.excluded.add(text)
        elif op is Op.STR_PREFIX:
            self.strings.prefixes.add(text)
        elif op is Op.STR_POSTFIX:
            self.strings.suffixes.add(text)
        elif op is Op.STR_CONTAINS:
            self.strings.parts.add(text)
        elif op in STRING:
            self.strings.bounds.append((op, text))


def _spaces(predicates: Iterable[Predicate]) -> dict[str, _Space]:
    spaces: defaultdict[str, _Space] = defaultdict(_Space)
    for p in predicates:
        spaces[p.attribute].add(p)
    return dict(spaces)


@lru_cache(maxsize=1 << 16)
def _filter_spaces(flt: Filter) -> dict[str, _Space]:
    """A filter's spaces, computed once for filters compared again and again (read-only)."""
    return _spaces(flt.predicates)


def _merged(a: Filter, b: Filter) -> dict[str, _Space]:
    return _spaces([*a.predicates, *b.predicates])


def overlaps(a: Filter, b: Filter, *, b_closed: bool = False) -> bool:
    """Whether some publication can match both filters.

    ``b_closed``: publications matching ``b`` carry no attribute ``b`` does not name (an
    advertisement under the conformity check), so ``a`` may constrain only ``b``'s attributes.
    """
    if b_closed and not {p.attribute for p in a.predicates} <= {p.attribute for p in b.predicates}:
        return False
    for space in _merged(a, b).values():
        numbers = space.numbers is not None and not space.numbers.empty()
        strings = space.strings is not None and space.strings.nonempty()
        booleans = bool(space.booleans)
        if not (numbers or strings or booleans):
            return False
    return True


@lru_cache(maxsize=1 << 12)
def satisfiable(flt: Filter) -> bool:
    """Whether some publication can match ``flt`` (exact)."""
    return overlaps(flt, flt)


def covers(a: Filter, b: Filter) -> bool:
    """Whether every publication that matches ``b`` also matches ``a``."""
    mine = _filter_spaces(a)
    theirs = _filter_spaces(b)
    if not mine.keys() <= theirs.keys():
        return False  # b lets some attribute of a be absent
    for attribute, space in mine.items():
        if not _within(
            theirs[attribute], space, [p for p in a.predicates if p.attribute == attribute]
        ):
            return False
    return True


def _within(inner: _Space, outer: _Space, predicates: list[Predicate]) -> bool:
    """Whether every value ``inner`` allows, ``outer`` allows too (sound)."""
    numbers = inner.numbers
    if (
        numbers is not None
        and not numbers.empty()
        and not (outer.numbers is not None and numbers.within(outer.numbers))
    ):
        return False
    booleans = inner.booleans or set()
    if not booleans <= (outer.booleans or set()):
        return False
    if inner.strings is not None and inner.strings.nonempty():
        if outer.strings is None:
            return False
        for p in predicates:
            if p.op is Op.IS_PRESENT or p.op in NUMERIC or type(p.value) is bool:
                continue
            if not inner.strings.implies(p.op, p.value):  # type: ignore[arg-type]
                return False
    return True


EqKey: TypeAlias = frozenset[Predicate]
"""A filter's equality predicates: a filter covering another has a subset of its key."""


def eq_key(flt: Filter) -> EqKey:
    """A filter's string and boolean equality predicates (its class among them)."""
    return frozenset(p for p in flt.predicates if p.op is Op.EQ)


def eq_subkeys(key: EqKey) -> Iterator[EqKey]:
    """The subsets of an equality key that keep its class predicate, largest first."""
    rest = [p for p in key if p.attribute != "class"]
    cls = key - set(rest)
    if len(rest) > 6:  # too many to enumerate: the key itself and the class alone
        yield key
        yield frozenset(cls)
        return
    for size in range(len(rest), -1, -1):
        for chosen in combinations(rest, size):
            yield cls | frozenset(chosen)


def covering(by_key: Mapping[EqKey, Mapping[Filter, T]], flt: Filter, scan: int) -> T | None:
    """What ``by_key`` (filters by their equality keys) files under a filter covering ``flt``:
    under ``flt`` itself first, else under the first that covers it of at most ``scan`` filters
    filed under a subset of its key (a covering filter's equality predicates are among the
    covered one's, so no other can cover it)."""
    key = eq_key(flt)
    same = by_key.get(key, {}).get(flt)
    if same:
        return same
    others = (
        (other, entry)
        for sub_key in eq_subkeys(key)
        for other, entry in by_key.get(sub_key, {}).items()
        if other != flt
    )
    for other, entry in islice(others, scan):
        if covers(other, flt):
            return entry
    return None
