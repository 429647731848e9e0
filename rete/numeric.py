"""Range index for the numeric tests (``<``, ``<=``, ``=``, ``>``, ``>=``) of a cluster.

Every condition's numeric tests on one attribute merge into one closed interval ``[lo, hi]``
(strict bounds become the next float inward), stored as the pair ``(lo, -hi)`` so that one
comparison, ``ends <= (x, -x)``, checks both bounds of every attribute. Each attribute's
value axis is cut into ``CELLS`` cells at quantiles of the interval ends; for each cell a bitset
holds the slots whose interval misses the whole cell, and one more row holds every constrained
slot (a fact without a number there fails them all). Matching a fact ORs one row per attribute;
what survives is a small superset of the matches, which ``exact`` then checks in one vectorized
step. New slots are written to the columns at once and folded into the cell table in
batches; the cells are re-cut when the number of slots has doubled.

Floats hold integers exactly only up to 2**53. A condition with a range operand that large keeps
those tests for a Python recheck and leaves the attribute unconstrained here; a fact with such an
integer skips that attribute's cells (row ``NO_INFO``) and its candidates are compared in Python
against the interval ends, exactly (Python compares ints and floats exactly).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from itertools import chain
from operator import itemgetter
from typing import Final, cast

import numpy as np
import numpy.typing as npt

from rete.bitset import WORD_DTYPE, Words, words_for
from rete.conditions import Test
from rete.operators import Op, Value

__all__ = ["CELLS", "RANGE_OPS", "NumericIndex", "intervals"]

CELLS: Final = 64
MISSING: Final = CELLS
"""Table row of the constrained slots: they fail a fact without a number there."""
NO_INFO: Final = CELLS + 1
"""Table row with no slot: used for a value floats cannot hold exactly."""
RANGE_OPS: Final = frozenset({Op.LT, Op.LE, Op.EQ_NUM, Op.GT, Op.GE})
EXACT_LIMIT: Final = 2**53
"""From this magnitude on, floats miss integers; such numbers are decided in Python."""

Floats = npt.NDArray[np.float64]


_LT, _LE, _GT, _GE = Op.LT, Op.LE, Op.GT, Op.GE
_FLOATS: Final = frozenset({int, float})
_INF = math.inf


def intervals(
    tests: Sequence[Test],
) -> tuple[list[tuple[str, float, float]], list[Test], list[Test]]:
    """Split tests into closed intervals per attribute (from the range tests floats can hold
    exactly), the range tests they cannot (to recheck in Python), and the other tests."""
    bounds: dict[str, list[float]] = {}
    blurred: dict[str, list[Test]] = {}
    others: list[Test] = []
    for t in tests:
        attribute, op, x = t
        if op not in RANGE_OPS:
            others.append(t)
            continue
        if not -EXACT_LIMIT < x < EXACT_LIMIT:  # type: ignore[operator]
            blurred.setdefault(attribute, []).append(t)
            continue
        b = bounds.get(attribute)
        if b is None:
            b = bounds[attribute] = [-_INF, _INF]
        if op is _GE:
            if x > b[0]:  # type: ignore[operator]
                b[0] = x  # type: ignore[assignment]
        elif op is _LE:
            if x < b[1]:  # type: ignore[operator]
                b[1] = x  # type: ignore[assignment]
        elif op is _GT:
            b[0] = max(b[0], math.nextafter(x, _INF))  # type: ignore[arg-type]
        elif op is _LT:
            b[1] = min(b[1], math.nextafter(x, -_INF))  # type: ignore[arg-type]
        else:
            b[0], b[1] = max(b[0], x), min(b[1], x)  # type: ignore[type-var, assignment]
    recheck: list[Test] = []
    for attribute in blurred:  # the whole attribute is decided in Python
        bounds.pop(attribute, None)
        recheck += (t for t in tests if t.attribute == attribute and t.op in RANGE_OPS)
    exact = [(a, float(lo), float(hi)) for a, (lo, hi) in bounds.items()]
    return exact, recheck, others


def _values(
    facts: Sequence[Mapping[str, Value]], attributes: list[str]
) -> list[tuple[Value | None, ...]]:
    """Each fact's values of ``attributes`` (None where it has none)."""
    row = itemgetter(*attributes)
    try:
        if len(attributes) == 1:
            return [(row(f),) for f in facts]
        return [row(f) for f in facts]
    except KeyError:  # some fact lacks one of them
        return [tuple(f.get(a) for a in attributes) for f in facts]


def _exact_floats(values: list[tuple[Value | None, ...]]) -> Floats | None:
    """``values`` as floats, if all are numbers (not booleans) that floats hold exactly."""
    if not set(map(type, chain.from_iterable(values))) <= _FLOATS:
        return None
    try:
        out = np.array(values, dtype=float)
    except OverflowError:
        return None
    return None if (np.abs(out) >= EXACT_LIMIT).any() else out


class NumericIndex:
    """Interval columns and cell table over the slots of one cluster."""

    def __init__(self, capacity: int) -> None:
        self.columns: dict[str, int] = {}
        self.ends: Floats = np.full((0, capacity), -np.inf)
        """Rows lo of column 0, -hi of column 0, lo of column 1, ...; one entry per slot
        (-inf: no bound). Slots run along rows so that gathering candidates is one ``take``."""
        self.bounds: Floats = np.full((0, CELLS - 1), np.inf)
        self._cuts: list[list[float]] = []
        """``bounds`` as Python lists, per column, for bisecting one value cheaply."""
        self._rows = np.arange(0)
        self.table: Words = np.zeros((0, CELLS + 2, words_for(capacity)), dtype=WORD_DTYPE)
        self.flushed = 0
        self.tuned_at = 0
        self._pending: tuple[list[int], list[int], list[float]] = ([], [], [])
        """Interval ends set since the last ``prepare``: (rows, slots, values)."""
        self._ready = 0
        """Slots whose ``ends`` hold real values; beyond, memory not yet written (see grow)."""

    def grow(self, capacity: int) -> None:
        # One allocation each and only the used part copied: the rest of ``ends`` is written
        # when its slots are taken, and zeroed memory comes lazily from the OS, so doubling a
        # large cluster costs a copy, not a fill of the whole new capacity.
        ends = np.empty((self.ends.shape[0], capacity))
        ends[:, : self._ready] = self.ends[:, : self._ready]
        self.ends = ends
        table = np.zeros((*self.table.shape[:2], words_for(capacity)), dtype=WORD_DTYPE)
        table[:, :, : self.table.shape[2]] = self.table
        self.table = table

    def _column(self, attribute: str) -> int:
        column = self.columns.get(attribute)
        if column is None:
            column = self.columns[attribute] = len(self.columns)
            if column == self.bounds.shape[0]:
                # Room for columns grows by a quarter (rows past the last column are unused):
                # a condition on many new attributes costs a copy per growth, not per column,
                # and at most a quarter of the room, every slot's, goes unused.
                extra = max(1, column // 4)
                self.ends = np.vstack(
                    [self.ends, np.full((2 * extra, self.ends.shape[1]), -np.inf)]
                )
                self.bounds = np.vstack([self.bounds, np.full((extra, CELLS - 1), np.inf)])
                fresh = np.zeros((extra, CELLS + 2, self.table.shape[2]), dtype=WORD_DTYPE)
                self.table = np.concatenate([self.table, fresh], axis=0)
            self._cuts.append([])
            self._rows = np.arange(len(self.columns))
        return column

    def copy_rows(self, other: NumericIndex, rows: npt.NDArray[np.int64], used: int) -> None:
        """Take ``other``'s intervals of ``rows`` (of its ``used`` slots) as slots 0, 1, ...
        (the cells are re-cut)."""
        other._write_pending(used)
        self.columns = dict(other.columns)
        width = len(self.columns)
        capacity = self.ends.shape[1]
        self.ends = np.empty((2 * width, capacity))
        self.ends[:, : rows.size] = other.ends[: 2 * width, rows]
        self._ready = int(rows.size)
        self.bounds = np.full((width, CELLS - 1), np.inf)
        self._cuts = [[] for _ in range(width)]
        self._rows = np.arange(width)
        self.table = np.zeros((width, CELLS + 2, words_for(capacity)), dtype=WORD_DTYPE)

    def set_intervals(self, slot: int, intervals: list[tuple[str, float, float]]) -> None:
        """Constrain ``slot`` to ``(attribute, lo, hi)`` intervals; each slot is set once."""
        rows, slots, values = self._pending
        columns = self.columns
        for attribute, lo, hi in intervals:
            column = columns.get(attribute)
            if column is None:
                column = self._column(attribute)
            rows += (2 * column, 2 * column + 1)
            slots += (slot, slot)
            values += (lo, -hi)
        if len(rows) >= 65_536:  # bounded buffer: boxed numbers cost far more than array cells
            self._write_pending(slot + 1)

    def _write_pending(self, used: int) -> None:
        """Make ``ends`` hold slots ``[0, used)``: no bound unless one was set."""
        if self._ready < used:
            self.ends[:, self._ready : used] = -np.inf
            self._ready = used
        rows, slots, values = self._pending
        if rows:
            self.ends[rows, slots] = values
            self._pending = ([], [], [])

    def prepare(self, used: int) -> None:
        """Bring the cell table up to date with slots ``[0, used)`` before matching."""
        self._write_pending(used)
        if used >= 2 * self.tuned_at and used - self.tuned_at >= 32:
            self._tune(used)
        if self.flushed < used:
            self._flush(used)

    def _tune(self, used: int) -> None:
        quantiles = np.linspace(0.0, 1.0, CELLS + 1)[1:-1]
        for column in range(len(self.columns)):
            ends = np.concatenate([self.ends[2 * column, :used], -self.ends[2 * column + 1, :used]])
            ends = ends[np.isfinite(ends)]
            cuts = np.unique(np.quantile(ends, quantiles)) if ends.size else np.empty(0)
            self.bounds[column] = np.inf
            self.bounds[column, : cuts.size] = cuts
            self._cuts[column] = cuts.tolist()
        self.tuned_at = used
        self.flushed = 0

    def _flush(self, used: int) -> None:
        start = (self.flushed // 64) * 64
        cells = np.arange(CELLS)[:, None]
        for column in range(len(self.columns)):
            lo = self.ends[2 * column, start:used]
            hi = -self.ends[2 * column + 1, start:used]
            bounds = self.bounds[column]
            constrained = np.isfinite(lo) | np.isfinite(hi)
            below = cells < np.searchsorted(bounds, lo, "right")
            above = cells > np.searchsorted(bounds, hi, "right")
            rows = np.vstack(
                [(below | above) & constrained, constrained, np.zeros_like(constrained)]
            )
            packed = np.packbits(rows, axis=1, bitorder="little")
            nwords = words_for(used - start)
            padded = np.zeros((CELLS + 2, nwords * 8), dtype=np.uint8)
            padded[:, : packed.shape[1]] = packed
            w0 = start // 64
            self.table[column, :, w0 : w0 + nwords] = padded.view(WORD_DTYPE)  # NO_INFO stays 0
        self.flushed = used

    def probe(
        self, attributes: Mapping[str, Value]
    ) -> tuple[Words | None, Floats, list[tuple[int, int]]]:
        """The slots that surely fail, the fact as ``(x, -x)`` pairs, and the (column, integer)
        pairs that floats cannot hold (their columns pass here; ``exact_big`` decides them)."""
        if not self.columns:
            return None, np.empty(0), []
        cells = []
        pairs: list[float] = []
        big: list[tuple[int, int]] = []
        for column, (attribute, cuts) in enumerate(zip(self.columns, self._cuts, strict=True)):
            value = attributes.get(attribute)
            t = type(value)
            if t is int and abs(value) >= EXACT_LIMIT:  # type: ignore[arg-type]
                big.append((column, value))  # type: ignore[arg-type]
                cells.append(NO_INFO)
                pairs += (math.inf, math.inf)
            elif t is int or t is float:
                x = float(value)  # type: ignore[arg-type]
                cells.append(bisect_right(cuts, x))
                pairs += (x, -x)
            else:
                cells.append(MISSING)
                pairs += (0.0, -0.0)
        rows = self.table[self._rows, cells]
        fail = rows[0] if len(cells) == 1 else np.bitwise_or.reduce(rows, axis=0)
        return fail, np.array(pairs)[:, None], big

    def probe_batch(
        self, facts: Sequence[Mapping[str, Value]]
    ) -> tuple[Words | None, Floats, list[list[tuple[int, int]]]]:
        """``probe`` for many facts at once: the slots that surely fail as one row of words per
        fact, the facts as columns of ``(x, -x)`` pairs, and each fact's large integers."""
        big: list[list[tuple[int, int]]] = [[] for _ in facts]
        if not self.columns:
            return None, np.empty((0, len(facts))), big
        width = len(self.columns)
        given = _values(facts, list(self.columns))
        xs = _exact_floats(given)
        if xs is not None and len(facts) <= 16:  # all numbers floats hold: cells at once
            cells = (xs[:, :, None] >= self.bounds[None, :width, :]).sum(axis=2)
        elif xs is not None:
            cells = np.empty((len(facts), width), dtype=np.intp)
            for column in range(width):
                cells[:, column] = np.searchsorted(self.bounds[column], xs[:, column], "right")
        else:
            xs = np.zeros((len(facts), width))
            cells = np.full((len(facts), width), MISSING, dtype=np.intp)
            for i, values in enumerate(given):
                for column, value in enumerate(values):
                    t = type(value)
                    if t is int and abs(value) >= EXACT_LIMIT:  # type: ignore[arg-type]
                        big[i].append((column, value))  # type: ignore[arg-type]
                        cells[i, column] = NO_INFO
                        xs[i, column] = math.inf
                    elif t is int or t is float:
                        xs[i, column] = value
                        cells[i, column] = bisect_right(self._cuts[column], value)  # type: ignore[type-var]
        pairs = np.empty((2 * width, len(facts)))
        pairs[0::2] = xs.T
        pairs[1::2] = -xs.T
        for i, fact_big in enumerate(big):
            for column, _ in fact_big:
                pairs[2 * column + 1, i] = math.inf
        rows = self.table[self._rows[None, :], cells]
        fail = rows[:, 0] if width == 1 else np.bitwise_or.reduce(rows, axis=1)
        return fail, pairs, big

    def exact_batch(
        self, slots: npt.NDArray[np.int64], facts: npt.NDArray[np.int64], x: Floats
    ) -> npt.NDArray[np.bool_]:
        """``exact`` for (fact, slot) pairs: ``x`` as ``probe_batch`` gives it, one column per
        fact; ``facts[i]`` is the column of the fact paired with ``slots[i]``."""
        if not self.columns:
            return np.ones(slots.size, dtype=bool)
        ends = self.ends[: 2 * len(self.columns)]
        return cast(
            npt.NDArray[np.bool_], (ends.take(slots, axis=1) <= x.take(facts, axis=1)).all(axis=0)
        )

    def exact_big(self, slot: int, big: list[tuple[int, int]]) -> bool:
        """Whether ``slot``'s intervals hold the large integers of ``big`` (compared exactly)."""
        ends = self.ends
        return all(ends[2 * c, slot] <= v and v <= -ends[2 * c + 1, slot] for c, v in big)

    def exact(self, slots: npt.NDArray[np.int64], x: Floats) -> npt.NDArray[np.bool_]:
        """Which candidate ``slots`` hold ``x`` (as ``probe`` gives it) within every interval."""
        if not self.columns:
            return np.ones(slots.size, dtype=bool)
        ends = self.ends[: 2 * len(self.columns)]
        return cast(npt.NDArray[np.bool_], (ends.take(slots, axis=1) <= x).all(axis=0))
