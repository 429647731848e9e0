"""A cluster: the conditions that share one access test, matched together with bitsets.

Each condition takes a slot. Its tests are filed by kind: numeric ranges in the ``NumericIndex``,
hashable tests in per-attribute ``KeyedIndex``es, everything else as residual alpha tests
(evaluated once per fact and shared across clusters through a memo). A fact fails a slot when any
index says so; the survivors are checked exactly against their numeric intervals. Slots are
handed out in increasing order; once more than half are dead, the owner swaps in a compacted copy.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from rete.bitset import WORD_DTYPE, Words, positions, to_words, words_for
from rete.conditions import Test
from rete.keyed import KEYED_OPS, KeyedIndex
from rete.numeric import RANGE_OPS, NumericIndex, interval
from rete.operators import Op, Value

__all__ = ["Cluster", "Entry"]


@dataclass(eq=False, slots=True)
class Entry:
    """A condition placed in a cluster: what it reports, and how its tests were filed."""

    target: Any
    """What a match reports: the condition id, or the composite part it stands for."""
    is_part: bool
    tests: tuple[Test, ...]
    required: frozenset[str]
    """Attributes that must be present beyond those of range tests (isPresent, bindings...)."""
    key: Any = None
    """The access key of the cluster holding the entry."""
    slot: int = -1
    keyed: list[tuple[str, str, Value]] = field(default_factory=list)
    residual: list[Test] = field(default_factory=list)
    blurred: bool = False


class Cluster:
    def __init__(self, key: object, capacity: int = 64) -> None:
        self.key = key
        self.capacity = capacity
        self.used = 0
        self.live = 0
        self.entries: list[Entry | None] = []
        self.targets: npt.NDArray[np.object_] = np.empty(capacity, dtype=object)
        self.is_part = np.zeros(capacity, dtype=bool)
        self.parts = 0
        """How many live slots stand for composite parts."""
        self.active: Words = np.zeros(words_for(capacity), dtype=WORD_DTYPE)
        self.numeric = NumericIndex(capacity)
        self.keyed: dict[str, KeyedIndex] = {}
        self.residual: dict[Test, int] = {}
        self.present: dict[str, int] = {}
        self.blurred: set[int] = set()

    # -- changes -----------------------------------------------------------------------------

    def _grow(self) -> None:
        self.capacity *= 2
        self.targets = np.concatenate([self.targets, np.empty(self.capacity // 2, dtype=object)])
        self.is_part = np.concatenate([self.is_part, np.zeros(self.capacity // 2, dtype=bool)])
        extra = words_for(self.capacity) - self.active.size
        self.active = np.concatenate([self.active, np.zeros(extra, dtype=WORD_DTYPE)])
        self.numeric.grow(self.capacity)

    def insert(self, entry: Entry) -> None:
        if self.used == self.capacity:
            self._grow()
        slot = entry.slot = self.used
        self.used += 1
        ranges: defaultdict[str, list[Test]] = defaultdict(list)
        for test in entry.tests:
            if test.op in RANGE_OPS:
                ranges[test.attribute].append(test)
            elif test.op is not Op.IS_PRESENT:
                self._file(entry, test)
        for attribute, tests in ranges.items():
            lo, hi, blurred = interval(tests)
            self.numeric.set(slot, attribute, lo, hi)
            entry.blurred |= blurred
        self._place(entry)

    def _file(self, entry: Entry, test: Test) -> None:
        kind = KEYED_OPS.get(test.op)
        taken = any(k == kind and a == test.attribute for k, a, _ in entry.keyed)
        if kind is not None and not taken:
            entry.keyed.append((kind, test.attribute, test.operand))  # type: ignore[arg-type]
        else:
            entry.residual.append(test)

    def _place(self, entry: Entry) -> None:
        """Register an entry's bits under its slot (on insert, and again after compaction)."""
        slot = entry.slot
        bit = 1 << slot
        for kind, attribute, operand in entry.keyed:
            self.keyed.setdefault(attribute, KeyedIndex()).add(kind, operand, slot)
        for test in entry.residual:
            self.residual[test] = self.residual.get(test, 0) | bit
        for attribute in entry.required:
            self.present[attribute] = self.present.get(attribute, 0) | bit
        if entry.blurred:
            self.blurred.add(slot)
        self.targets[slot] = entry.target
        self.is_part[slot] = entry.is_part
        self.parts += entry.is_part
        self.active[slot >> 6] |= np.uint64(1 << (slot & 63))
        if slot == len(self.entries):
            self.entries.append(entry)
        else:
            self.entries[slot] = entry
        self.live += 1

    def delete(self, entry: Entry) -> None:
        slot = entry.slot
        bit = 1 << slot
        for kind, attribute, operand in entry.keyed:
            index = self.keyed[attribute]
            index.discard(kind, operand, slot)
            if not index:
                del self.keyed[attribute]
        for test in entry.residual:
            _clear(self.residual, test, bit)
        for attribute in entry.required:
            _clear(self.present, attribute, bit)
        self.blurred.discard(slot)
        self.parts -= entry.is_part
        self.targets[slot] = None
        self.active[slot >> 6] &= np.uint64(~(1 << (slot & 63)) & (2**64 - 1))
        self.entries[slot] = None
        self.live -= 1

    @property
    def wasteful(self) -> bool:
        """More than half the slots are dead: time to replace the cluster by ``compacted()``."""
        dead = self.used - self.live
        return dead > 64 and dead > self.live

    def compacted(self) -> Cluster:
        """A copy holding only the live slots, renumbered from 0."""
        live = positions(self.active)
        fresh = Cluster(self.key, max(64, 1 << int(live.size).bit_length()))
        fresh.numeric.copy_rows(self.numeric, live)
        fresh.used = int(live.size)
        for slot, old in enumerate(live.tolist()):
            entry = self.entries[old]
            assert entry is not None
            entry.slot = slot
            fresh._place(entry)
        return fresh

    # -- matching ----------------------------------------------------------------------------

    def match(
        self, attributes: dict[str, Value] | Any, memo: dict[Test, bool]
    ) -> tuple[list[Any], list[Any]]:
        """The targets of the slots ``attributes`` satisfies: (conditions, composite parts)."""
        self.numeric.prepare(self.used)
        fail_words, x, blurred_fact = self.numeric.probe(attributes)
        fail = 0
        for attribute, bits in self.present.items():
            if attribute not in attributes:
                fail |= bits
        for attribute, index in self.keyed.items():
            value = attributes.get(attribute)
            if value is not None:
                fail |= index.failing(value)
        for test, bits in self.residual.items():
            ok = memo.get(test)
            if ok is None:
                ok = memo[test] = test.passes(attributes)
            if not ok:
                fail |= bits
        candidates = self.active
        if fail_words is not None:
            candidates = candidates & ~fail_words
        if fail:
            candidates = candidates & ~to_words(fail, self.active.size)
        slots = positions(candidates)
        if slots.size and self.numeric.columns:
            keep = self.numeric.exact(slots, x)
            if blurred_fact or self.blurred:
                self._recheck(slots, keep, attributes, blurred_fact)
            slots = slots[keep]
        if not slots.size:
            return [], []
        targets = self.targets.take(slots)
        if not self.parts:
            return targets.tolist(), []
        parts = self.is_part.take(slots)
        return targets[~parts].tolist(), targets[parts].tolist()

    def _recheck(
        self,
        slots: npt.NDArray[np.int64],
        keep: npt.NDArray[np.bool_],
        attributes: Any,
        every: bool,
    ) -> None:
        """Decide in Python the slots whose numbers floats cannot represent exactly."""
        for i, slot in enumerate(slots.tolist()):
            if every or slot in self.blurred:
                entry = self.entries[slot]
                assert entry is not None
                keep[i] = all(t.passes(attributes) for t in entry.tests if t.op in RANGE_OPS)


def _clear(bitsets: dict[Any, int], key: Any, bit: int) -> None:
    rest = bitsets[key] & ~bit
    if rest:
        bitsets[key] = rest
    else:
        del bitsets[key]
