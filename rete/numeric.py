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
from collections.abc import Iterator, Mapping, Sequence
from itertools import chain, compress
from operator import itemgetter
from typing import Final, cast

import numpy as np
import numpy.typing as npt

from rete.bitset import WORD_DTYPE, Words, words_for
from rete.conditions import Test
from rete.operators import Op, Value

__all__ = ["BLOCK", "CELLS", "RANGE_OPS", "NumericIndex", "capacity_for", "grown", "intervals"]

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
_LOWEST: Final = -EXACT_LIMIT


def intervals(tests: Sequence[Test]) -> tuple[dict[str, list[float]], list[Test], list[Test]]:
    """Split tests into closed intervals ``[lo, hi]`` by attribute (from the range tests floats
    can hold exactly), the range tests they cannot (to recheck in Python), and the other
    tests."""
    bounds: dict[str, list[float]] = {}
    blurred: dict[str, list[Test]] = {}
    others: list[Test] = []
    for t in tests:
        attribute, op, x = t
        if op not in RANGE_OPS:
            others.append(t)
            continue
        if not _LOWEST < x < EXACT_LIMIT:  # type: ignore[operator]
            blurred.setdefault(attribute, []).append(t)
            continue
        b = bounds.get(attribute)
        if op is _GE:  # the usual bounds first, taken as they are
            if b is None:
                bounds[attribute] = [x, _INF]  # type: ignore[list-item]
            elif x > b[0]:  # type: ignore[operator]
                b[0] = x  # type: ignore[assignment]
            continue
        if op is _LE:
            if b is None:
                bounds[attribute] = [-_INF, x]  # type: ignore[list-item]
            elif x < b[1]:  # type: ignore[operator]
                b[1] = x  # type: ignore[assignment]
            continue
        if b is None:
            b = bounds[attribute] = [-_INF, _INF]
        if op is _GT:
            b[0] = max(b[0], math.nextafter(x, _INF))  # type: ignore[arg-type]
        elif op is _LT:
            b[1] = min(b[1], math.nextafter(x, -_INF))  # type: ignore[arg-type]
        else:
            b[0], b[1] = max(b[0], x), min(b[1], x)  # type: ignore[type-var, assignment]
    recheck: list[Test] = []
    for attribute in blurred:  # the whole attribute is decided in Python
        bounds.pop(attribute, None)
        recheck += (t for t in tests if t.attribute == attribute and t.op in RANGE_OPS)
    return bounds, recheck, others


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


BLOCK: Final = 1 << 20
"""Slots per block of the interval columns and the cell table (a multiple of 64)."""


def grown(capacity: int) -> int:
    """The capacity after ``capacity`` slots are full: doubled up to a block; beyond, the last
    block doubled, or a new one started at 64 slots once it is full. Growing thus copies at most
    half a block, never every slot of a large cluster."""
    if capacity < BLOCK:
        return 2 * capacity
    return capacity + (capacity % BLOCK or 64)


def capacity_for(slots: int) -> int:
    """The least capacity (as ``grown`` steps them from 64) holding ``slots`` slots."""
    capacity = 64
    while capacity < slots:
        capacity = grown(capacity)
    return capacity


_GE_CODE, _LE_CODE, _GT_CODE, _LT_CODE, _EQ_CODE = 1, 2, 3, 4, 5
_CODES: Final = {op: 0 for op in Op} | {
    Op.GE: _GE_CODE,
    Op.LE: _LE_CODE,
    Op.GT: _GT_CODE,
    Op.LT: _LT_CODE,
    Op.EQ_NUM: _EQ_CODE,
}
"""Each operator's number in ``set_many``: 0 for all but the range operators."""
_ATTRIBUTE, _OP, _OPERAND = itemgetter(0), itemgetter(1), itemgetter(2)

PENDING: Final = 65_536
"""Intervals buffered before they are written to the columns (boxed numbers cost far more
than array cells)."""


def _sizes(capacity: int) -> list[int]:
    """Slots per block of ``capacity``: full blocks, then the rest."""
    full, rest = divmod(capacity, BLOCK)
    return [BLOCK] * full + ([rest] if rest else [])


def _spans(start: int, stop: int) -> Iterator[tuple[int, int, int]]:
    """Slots ``[start, stop)`` block by block: (block, first, end), both within the block."""
    while start < stop:
        block, first = divmod(start, BLOCK)
        end = min(BLOCK, first + stop - start)
        yield block, first, end
        start += end - first


class NumericIndex:
    """Interval columns and cell table over the slots of one cluster, in blocks of ``BLOCK``
    slots (see ``grown``): a cluster of up to a block matches on one array of each."""

    def __init__(self, capacity: int) -> None:
        self.columns: dict[str, int] = {}
        self.ends: list[Floats] = [np.full((0, size), -np.inf) for size in _sizes(capacity)]
        """Per block: rows lo of column 0, -hi of column 0, lo of column 1, ...; one entry per
        slot (-inf: no bound). Slots run along rows so that gathering candidates is one
        ``take``."""
        self.bounds: Floats = np.full((0, CELLS - 1), np.inf)
        self._cuts: list[list[float]] = []
        """``bounds`` as Python lists, per column, for bisecting one value cheaply."""
        self._rows = np.arange(0)
        self.table: list[Words] = [
            np.zeros((0, CELLS + 2, words_for(size)), dtype=WORD_DTYPE) for size in _sizes(capacity)
        ]
        """Per block: per column and cell, the slots failing a value in that cell."""
        self.flushed = 0
        self.tuned_at = 0
        self._pending: tuple[list[str], list[list[float]], list[int], list[int]] = ([], [], [], [])
        """Intervals set since the last ``prepare``: their attributes and ``[lo, hi]`` ends, the
        slots they were set for and how many each."""
        self._ready = 0
        """Slots whose ``ends`` hold real values; beyond, memory not yet written (see grow)."""

    def grow(self, capacity: int) -> None:
        """Make room for ``capacity`` slots (a capacity ``grown`` gave): the last block is
        copied into a larger one, or a new block started."""
        # One allocation each and only the used part copied: the rest of ``ends`` is written
        # when its slots are taken, and zeroed memory comes lazily from the OS, so growing a
        # block costs a copy, not a fill of the whole new capacity.
        height, room = self.ends[0].shape[0], self.table[0].shape[0]
        last = len(self.ends) - 1
        for block, size in enumerate(_sizes(capacity)[last:], last):
            if block == last and size == self.ends[last].shape[1]:
                continue  # full: a new block follows
            ends = np.empty((height, size))
            table = np.zeros((room, CELLS + 2, words_for(size)), dtype=WORD_DTYPE)
            if block == last:
                ready = min(max(0, self._ready - block * BLOCK), size)
                ends[:, :ready] = self.ends[block][:, :ready]
                table[:, :, : self.table[block].shape[2]] = self.table[block]
                self.ends[block], self.table[block] = ends, table
            else:
                self.ends.append(ends)
                self.table.append(table)

    def _column(self, attribute: str) -> int:
        column = self.columns.get(attribute)
        if column is None:
            column = self.columns[attribute] = len(self.columns)
            if column == self.bounds.shape[0]:
                # Room for columns grows by a quarter (rows past the last column are unused):
                # a condition on many new attributes costs a copy per growth, not per column,
                # and at most a quarter of the room, every slot's, goes unused.
                extra = max(1, column // 4)
                self.ends = [
                    np.vstack([ends, np.full((2 * extra, ends.shape[1]), -np.inf)])
                    for ends in self.ends
                ]
                self.bounds = np.vstack([self.bounds, np.full((extra, CELLS - 1), np.inf)])
                self.table = [
                    np.concatenate(
                        [table, np.zeros((extra, CELLS + 2, table.shape[2]), dtype=WORD_DTYPE)]
                    )
                    for table in self.table
                ]
            self._cuts.append([])
            self._rows = np.arange(len(self.columns))
        return column

    def copy_rows(self, other: NumericIndex, rows: npt.NDArray[np.int64], used: int) -> None:
        """Take ``other``'s intervals of ``rows`` (of its ``used`` slots) as slots 0, 1, ...
        (the cells are re-cut)."""
        other._write_pending(used)
        self.columns = dict(other.columns)
        width = len(self.columns)
        taken = other._gather(rows)
        self.ends = [np.empty((2 * width, ends.shape[1])) for ends in self.ends]
        for block, first, end in _spans(0, rows.size):
            at = block * BLOCK
            self.ends[block][:, first:end] = taken[:, at + first : at + end]
        self._ready = int(rows.size)
        self.bounds = np.full((width, CELLS - 1), np.inf)
        self._cuts = [[] for _ in range(width)]
        self._rows = np.arange(width)
        self.table = [
            np.zeros((width, CELLS + 2, table.shape[2]), dtype=WORD_DTYPE) for table in self.table
        ]

    def set_intervals(self, slot: int, bounds: dict[str, list[float]]) -> None:
        """Constrain ``slot`` to closed intervals, ``[lo, hi]`` by attribute (as ``intervals``
        gives them); each slot is set once."""
        if not self.columns.keys() >= bounds.keys():
            for attribute in bounds:
                self._column(attribute)
        attributes, ends, slots, counts = self._pending
        attributes += bounds
        ends += bounds.values()
        slots.append(slot)
        counts.append(len(bounds))
        if len(attributes) >= PENDING:
            self._write_pending(slot + 1)

    def set_many(
        self, start: int, conditions: Sequence[Sequence[Test]]
    ) -> list[tuple[Sequence[Test], Sequence[Test]]] | None:
        """``intervals`` and ``set_intervals`` at once for the tests of many slots, ``start``
        and on: per slot, the range tests to recheck and the other tests. Vectorized over every
        range test; None, and nothing set, if some range operand is no number."""
        tests = list(chain.from_iterable(conditions))
        code = np.fromiter(map(_CODES.__getitem__, map(_OP, tests)), np.int8, len(tests))
        owner = np.repeat(np.arange(len(conditions)), list(map(len, conditions)))
        ranged = list(compress(tests, code.tolist()))
        x = np.array(list(map(_OPERAND, ranged)))
        if x.dtype.kind not in "biuf":  # strings, or integers beyond 64 bits
            return None
        x = x.astype(float)
        others: dict[int, list[Test]] = {}
        for i in np.flatnonzero(code == 0).tolist():
            others.setdefault(int(owner[i]), []).append(tests[i])
        code, owner = code[code != 0], owner[code != 0]
        rechecks: dict[int, list[Test]] = {}
        exact = np.abs(x) < EXACT_LIMIT  # NaN and infinities are blurred too
        if not exact.all():  # the whole attribute of a blurred test is decided in Python
            blurred = {(owner[j], ranged[j].attribute) for j in np.flatnonzero(~exact).tolist()}
            for j, test in enumerate(ranged):
                if (owner[j], test.attribute) in blurred:
                    exact[j] = False
                    rechecks.setdefault(int(owner[j]), []).append(test)
            ranged = list(compress(ranged, exact.tolist()))
            code, owner, x = code[exact], owner[exact], x[exact]
        names = list(map(_ATTRIBUTE, ranged))
        try:
            column = np.fromiter(map(self.columns.__getitem__, names), np.intp, len(names))
        except KeyError:  # new attributes: columns for them, in order of first use
            for attribute in dict.fromkeys(names):
                self._column(attribute)
            column = np.fromiter(map(self.columns.__getitem__, names), np.intp, len(names))
        # Each test bounds its slot's interval from below, above or both; a bound is the
        # tightest of them (the largest of the (lo, -hi) pairs), -inf where none.
        lo = np.where((code == _GE_CODE) | (code == _EQ_CODE), x, -np.inf)
        lo = np.where(code == _GT_CODE, np.nextafter(x, np.inf), lo)
        hi = np.where((code == _LE_CODE) | (code == _EQ_CODE), x, np.inf)
        hi = np.where(code == _LT_CODE, np.nextafter(x, -np.inf), hi)
        self._write_pending(start + len(conditions))
        rows = np.concatenate([2 * column, 2 * column + 1])
        block, at = np.divmod(np.tile(start + owner, 2), BLOCK)
        values = np.concatenate([lo, -hi])
        for b in np.unique(block).tolist():
            which = block == b
            ends = self.ends[b]
            flat = ends.reshape(-1)  # a view: blocks are contiguous
            np.maximum.at(flat, rows[which] * ends.shape[1] + at[which], values[which])
        none = ((), ())
        if not rechecks and not others:  # the usual case: one shared pair, nothing to allocate
            return [none] * len(conditions)
        return [(rechecks.get(i, ()), others.get(i, ())) for i in range(len(conditions))]

    def _write_pending(self, used: int) -> None:
        """Make ``ends`` hold slots ``[0, used)``: no bound unless one was set."""
        if self._ready < used:
            for block, first, end in _spans(self._ready, used):
                self.ends[block][:, first:end] = -np.inf
            self._ready = used
        attributes, ends, slots, counts = self._pending
        if not slots:
            return
        self._pending = ([], [], [], [])
        size = len(attributes)
        column = np.fromiter(map(self.columns.__getitem__, attributes), np.intp, size)
        rows = np.stack([2 * column, 2 * column + 1])
        values = np.fromiter(chain.from_iterable(ends), float, 2 * size).reshape(size, 2).T
        values[1] *= -1  # (lo, -hi)
        at = np.broadcast_to(np.repeat(slots, counts), rows.shape)
        if len(self.ends) == 1:
            self.ends[0][rows, at] = values
            return
        blocks, at = np.divmod(at, BLOCK)
        for b in np.unique(blocks).tolist():
            which = blocks == b
            self.ends[b][rows[which], at[which]] = values[which]

    def prepare(self, used: int) -> None:
        """Bring the cell table up to date with slots ``[0, used)`` before matching."""
        self._write_pending(used)
        if used >= 2 * self.tuned_at and used - self.tuned_at >= 32:
            self._tune(used)
        if self.flushed < used:
            self._flush(used)

    def _tune(self, used: int) -> None:
        quantiles = np.linspace(0.0, 1.0, CELLS + 1)[1:-1]
        spans = list(_spans(0, used))
        for column in range(len(self.columns)):
            lo = [self.ends[block][2 * column, first:end] for block, first, end in spans]
            hi = [-self.ends[block][2 * column + 1, first:end] for block, first, end in spans]
            ends = np.concatenate(lo + hi)
            ends = ends[np.isfinite(ends)]
            cuts = np.unique(np.quantile(ends, quantiles)) if ends.size else np.empty(0)
            self.bounds[column] = np.inf
            self.bounds[column, : cuts.size] = cuts
            self._cuts[column] = cuts.tolist()
        self.tuned_at = used
        self.flushed = 0

    def _flush(self, used: int) -> None:
        cells = np.arange(CELLS)[:, None]
        for block, start, end in _spans((self.flushed // 64) * 64, used):
            ends, table = self.ends[block], self.table[block]
            nwords = words_for(end - start)
            w0 = start // 64
            for column in range(len(self.columns)):
                lo = ends[2 * column, start:end]
                hi = -ends[2 * column + 1, start:end]
                bounds = self.bounds[column]
                constrained = np.isfinite(lo) | np.isfinite(hi)
                below = cells < np.searchsorted(bounds, lo, "right")
                above = cells > np.searchsorted(bounds, hi, "right")
                rows = np.vstack(
                    [(below | above) & constrained, constrained, np.zeros_like(constrained)]
                )
                packed = np.packbits(rows, axis=1, bitorder="little")
                padded = np.zeros((CELLS + 2, nwords * 8), dtype=np.uint8)
                padded[:, : packed.shape[1]] = packed
                table[column, :, w0 : w0 + nwords] = padded.view(WORD_DTYPE)  # NO_INFO stays 0
        self.flushed = used

    def _failing(self, index: tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]) -> Words:
        """The OR of the table rows ``index`` picks, over the columns (the next to last axis:
        one fact's cells, or one row of cells per fact), the blocks joined."""
        single = len(self.columns) == 1
        out = []
        for table in self.table:
            rows = table[index]
            out.append(rows[..., 0, :] if single else np.bitwise_or.reduce(rows, axis=-2))
        return out[0] if len(out) == 1 else np.concatenate(out, axis=-1)

    def _gather(self, slots: npt.NDArray[np.int64]) -> Floats:
        """The interval ends of ``slots`` (in any order), a column per slot."""
        height = 2 * len(self.columns)
        if len(self.ends) == 1:
            return self.ends[0][:height].take(slots, axis=1)
        block, at = np.divmod(slots, BLOCK)
        out = np.empty((height, slots.size))
        for b, ends in enumerate(self.ends):
            which = np.flatnonzero(block == b)
            if which.size:
                out[:, which] = ends[:height].take(at[which], axis=1)
        return out

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
        return self._failing((self._rows, np.array(cells))), np.array(pairs)[:, None], big

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
        return self._failing((self._rows[None, :], cells)), pairs, big

    def exact_batch(
        self, slots: npt.NDArray[np.int64], facts: npt.NDArray[np.int64], x: Floats
    ) -> npt.NDArray[np.bool_]:
        """``exact`` for (fact, slot) pairs: ``x`` as ``probe_batch`` gives it, one column per
        fact; ``facts[i]`` is the column of the fact paired with ``slots[i]``."""
        if not self.columns:
            return np.ones(slots.size, dtype=bool)
        return cast(
            npt.NDArray[np.bool_], (self._gather(slots) <= x.take(facts, axis=1)).all(axis=0)
        )

    def exact_big(self, slot: int, big: list[tuple[int, int]]) -> bool:
        """Whether ``slot``'s intervals hold the large integers of ``big`` (compared exactly)."""
        block, at = divmod(slot, BLOCK)
        ends = self.ends[block]
        return all(ends[2 * c, at] <= v and v <= -ends[2 * c + 1, at] for c, v in big)

    def exact(self, slots: npt.NDArray[np.int64], x: Floats) -> npt.NDArray[np.bool_]:
        """Which candidate ``slots`` hold ``x`` (as ``probe`` gives it) within every interval."""
        if not self.columns:
            return np.ones(slots.size, dtype=bool)
        return cast(npt.NDArray[np.bool_], (self._gather(slots) <= x).all(axis=0))
