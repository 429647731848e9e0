"""Range index for the numeric tests (``<``, ``<=``, ``=``, ``>``, ``>=``) of a cluster.

Every condition's numeric tests on one attribute merge into one closed interval ``[lo, hi]``
(strict bounds become the next float inward), stored as the pair ``(lo, -hi)`` so that one
comparison, ``ends <= (x, -x)``, checks both bounds of every attribute. Each attribute's
value axis is cut into ``CELLS`` cells at quantiles of the interval ends; for each cell a bitset
holds the slots whose interval misses the whole cell, and one more row holds every constrained
slot (a fact without a number there fails them all). Matching a fact ORs one row per attribute;
what survives is a small superset of the matches, which ``exact`` then checks in one vectorized
step. New slots are written to the columns at once and folded into the cell table in batches;
the cells are re-cut when the number of slots has doubled.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from typing import Final, cast

import numpy as np
import numpy.typing as npt

from rete.bitset import WORD_DTYPE, Words, words_for
from rete.conditions import Test
from rete.operators import Op, Value

__all__ = ["CELLS", "RANGE_OPS", "NumericIndex", "interval"]

CELLS: Final = 64
RANGE_OPS: Final = frozenset({Op.LT, Op.LE, Op.EQ_NUM, Op.GT, Op.GE})
EXACT_LIMIT: Final = 2**53
"""Integers beyond this are not exactly floats; conditions or facts using them are rechecked."""

Floats = npt.NDArray[np.float64]


def interval(tests: Sequence[Test]) -> tuple[float, float, bool]:
    """The closed interval the range tests allow, and whether float rounding may blur it."""
    lo, hi = -np.inf, np.inf
    blurred = False
    for t in tests:
        x = float(t.operand)  # type: ignore[arg-type]
        rounded = type(t.operand) is int and abs(t.operand) > EXACT_LIMIT
        blurred |= rounded
        # A rounded bound stays closed: the interval must never lose a true match.
        if t.op is Op.LT:
            hi = min(hi, x if rounded else float(np.nextafter(x, -np.inf)))
        elif t.op is Op.LE:
            hi = min(hi, x)
        elif t.op is Op.GT:
            lo = max(lo, x if rounded else float(np.nextafter(x, np.inf)))
        elif t.op is Op.GE:
            lo = max(lo, x)
        else:
            lo, hi = max(lo, x), min(hi, x)
    return lo, hi, blurred


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
        self.table: Words = np.zeros((0, CELLS + 1, words_for(capacity)), dtype=WORD_DTYPE)
        self.flushed = 0
        self.tuned_at = 0

    @property
    def nbytes(self) -> int:
        return self.ends.nbytes + self.bounds.nbytes + self.table.nbytes

    def grow(self, capacity: int) -> None:
        extra_slots = capacity - self.ends.shape[1]
        width = len(self.columns)
        self.ends = np.hstack([self.ends, np.full((2 * width, extra_slots), -np.inf)])
        extra = words_for(capacity) - self.table.shape[2]
        pad = np.zeros((width, CELLS + 1, extra), dtype=WORD_DTYPE)
        self.table = np.concatenate([self.table, pad], axis=2)

    def _column(self, attribute: str) -> int:
        column = self.columns.get(attribute)
        if column is None:
            column = self.columns[attribute] = len(self.columns)
            self.ends = np.vstack([self.ends, np.full((2, self.ends.shape[1]), -np.inf)])
            self.bounds = np.vstack([self.bounds, np.full((1, CELLS - 1), np.inf)])
            self._cuts.append([])
            self._rows = np.arange(len(self.columns))
            fresh = np.zeros((1, CELLS + 1, self.table.shape[2]), dtype=WORD_DTYPE)
            self.table = np.concatenate([self.table, fresh], axis=0)
        return column

    def copy_rows(self, other: NumericIndex, rows: npt.NDArray[np.int64]) -> None:
        """Take ``other``'s intervals of ``rows`` as slots 0, 1, ... (the cells are re-cut)."""
        self.columns = dict(other.columns)
        width = len(self.columns)
        capacity = self.ends.shape[1]
        self.ends = np.full((2 * width, capacity), -np.inf)
        self.ends[:, : rows.size] = other.ends[:, rows]
        self.bounds = np.full((width, CELLS - 1), np.inf)
        self._cuts = [[] for _ in range(width)]
        self._rows = np.arange(width)
        self.table = np.zeros((width, CELLS + 1, words_for(capacity)), dtype=WORD_DTYPE)

    def set(self, slot: int, attribute: str, lo: float, hi: float) -> None:
        """Constrain ``slot`` on ``attribute``; slots are written once, in increasing order."""
        column = self._column(attribute)
        self.ends[2 * column, slot] = lo
        self.ends[2 * column + 1, slot] = -hi

    def prepare(self, used: int) -> None:
        """Bring the cell table up to date with slots ``[0, used)`` before matching."""
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
            rows = np.vstack([(below | above) & constrained, constrained])
            packed = np.packbits(rows, axis=1, bitorder="little")
            nwords = words_for(used - start)
            padded = np.zeros((CELLS + 1, nwords * 8), dtype=np.uint8)
            padded[:, : packed.shape[1]] = packed
            w0 = start // 64
            self.table[column, :, w0 : w0 + nwords] = padded.view(WORD_DTYPE)
        self.flushed = used

    def probe(self, attributes: Mapping[str, Value]) -> tuple[Words | None, Floats, bool]:
        """The slots that surely fail, the fact as ``(x, -x)`` pairs, and whether to recheck."""
        if not self.columns:
            return None, np.empty(0), False
        cells = []
        pairs: list[float] = []
        blurred = False
        for attribute, cuts in zip(self.columns, self._cuts, strict=True):
            value = attributes.get(attribute)
            t = type(value)
            if t is int or t is float:
                x = float(value)  # type: ignore[arg-type]
                blurred |= t is int and abs(value) > EXACT_LIMIT  # type: ignore[arg-type]
                cells.append(bisect_right(cuts, x))
                pairs += (x, -x)
            else:
                cells.append(CELLS)
                pairs += (0.0, -0.0)
        rows = self.table[self._rows, cells]
        fail = rows[0] if len(cells) == 1 else np.bitwise_or.reduce(rows, axis=0)
        return fail, np.array(pairs)[:, None], blurred

    def exact(self, slots: npt.NDArray[np.int64], x: Floats) -> npt.NDArray[np.bool_]:
        """Which candidate ``slots`` hold ``x`` (as ``probe`` gives it) within every interval."""
        if not self.columns:
            return np.ones(slots.size, dtype=bool)
        return cast(npt.NDArray[np.bool_], (self.ends.take(slots, axis=1) <= x).all(axis=0))
