"""A cluster: the conditions that share one access test, matched together with bitsets.

Below ``small`` live conditions a cluster simply evaluates each one's tests in Python: numpy's
fixed cost per call outweighs indexing there. Beyond that, each condition takes a slot. Its tests
are filed by kind: numeric ranges in the ``NumericIndex``, hashable tests in per-attribute
``KeyedIndex``es, everything else as residual alpha tests (evaluated once per fact and shared
across clusters through a memo). A fact fails a slot when any
index says so; the survivors are checked exactly against their numeric intervals. Slots are
handed out in increasing order; once more than half are dead, the owner swaps in a compacted copy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from rete.bitset import WORD_DTYPE, Words, pairs, positions, to_words, words_for
from rete.conditions import Test
from rete.keyed import KEYED_OPS, KeyedIndex
from rete.numeric import NumericIndex, intervals
from rete.operators import Op, Value, evaluate

__all__ = ["Cluster", "Entry"]


@dataclass(eq=False, slots=True)
class Entry:
    """A condition placed in a cluster: what it reports, and how its tests were filed."""

    target: Any
    """What a match reports: the condition id, or the composite part it stands for."""
    is_part: bool
    required: frozenset[str]
    """Attributes that must be present beyond those of range tests (isPresent, bindings...)."""
    key: Any = None
    """The access key of the cluster holding the entry."""
    slot: int = -1
    keyed: tuple[tuple[str, str, Value], ...] = ()
    residual: tuple[Test, ...] = ()
    recheck: tuple[Test, ...] = ()
    """Range tests whose numbers floats blur (beyond 2**53): decided in Python."""
    tests: tuple[Test, ...] | None = None
    """All the tests, kept only while the cluster is small enough to evaluate them directly."""


SMALL: Final = 16
"""Default size up to which a cluster evaluates its conditions directly."""
FEW: Final = 3
"""Fewer facts than this visiting a cluster are matched one by one (cheaper below it)."""
BATCH_WORDS: Final = 1 << 20
"""Facts matched together in a cluster hold at most this many bitset words (8 MiB)."""


class Cluster:
    def __init__(self, key: object, capacity: int = 64, small: int = SMALL) -> None:
        self.key = key
        self.small = small
        self.tested = 0
        """Live entries that kept their tests (all of them, while the cluster is small)."""
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

    def insert(self, entry: Entry, tests: tuple[Test, ...]) -> None:
        """File ``tests`` (the condition less its access test) under a new slot."""
        if self.used == self.capacity:
            self._grow()
        slot = entry.slot = self.used
        self.used += 1
        if self.live < self.small and self.tested == self.live:
            entry.tests = tests
        exact, recheck, others = intervals(tests)
        if exact:
            self.numeric.set_intervals(slot, exact)
        keyed: list[tuple[str, str, Value]] = []
        residual: list[Test] = []
        for test in others:
            if test.op is Op.IS_PRESENT:
                continue
            kind = KEYED_OPS.get(test.op)
            if kind is not None and all(k != kind or a != test.attribute for k, a, _ in keyed):
                keyed.append((kind, test.attribute, test.operand))  # type: ignore[arg-type]
            elif test not in residual:
                residual.append(test)
        if keyed:
            entry.keyed = tuple(keyed)
        if residual:
            entry.residual = tuple(residual)
        if recheck:
            entry.recheck = tuple(recheck)
        self._place(entry)

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
        if entry.recheck:
            self.blurred.add(slot)
        self.targets[slot] = entry.target
        self.is_part[slot] = entry.is_part
        self.parts += entry.is_part
        self.tested += entry.tests is not None
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
        self.tested -= entry.tests is not None
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
        fresh = Cluster(self.key, max(64, 1 << int(live.size).bit_length()), self.small)
        fresh.numeric.copy_rows(self.numeric, live, self.used)
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
        if self.tested == self.live <= self.small:
            return self._match_directly(attributes)
        self.prepare()
        fail_words, x, big = self.numeric.probe(attributes)
        (fail,) = self._failing([attributes], [memo])
        candidates = self.active
        if fail_words is not None:
            candidates = candidates & ~fail_words
        if fail:
            candidates = candidates & ~to_words(fail, self.active.size)
        slots = positions(candidates)
        if slots.size and (self.numeric.columns or self.blurred):
            keep = self.numeric.exact(slots, x)
            if big or self.blurred:
                self._recheck(slots, keep, attributes, big)
            slots = slots[keep]
        if not slots.size:
            return [], []
        targets = self.targets.take(slots)
        if not self.parts:
            return targets.tolist(), []
        parts = self.is_part.take(slots)
        return targets[~parts].tolist(), targets[parts].tolist()

    def batches(self, facts: int) -> bool:
        """Whether matching ``facts`` facts together beats matching them one by one here."""
        return facts >= FEW and not self.tested == self.live <= self.small

    def match_batch(
        self, facts: Sequence[Mapping[str, Value]], memos: Sequence[dict[Test, bool]]
    ) -> list[tuple[list[Any], list[Any]]]:
        """``match`` for many facts at once (``memos[i]`` is fact i's): one vectorized pass
        over the cluster's bitsets instead of one per fact."""
        if not self.batches(len(facts)):
            return [self.match(f, m) for f, m in zip(facts, memos, strict=True)]
        self.prepare()
        out: list[tuple[list[Any], list[Any]]] = []
        step = max(1, BATCH_WORDS // self.active.size)
        for start in range(0, len(facts), step):
            chunk = facts[start : start + step]
            out += self._match_chunk(chunk, memos[start : start + step])
        return out

    def _match_chunk(
        self, facts: Sequence[Mapping[str, Value]], memos: Sequence[dict[Test, bool]]
    ) -> list[tuple[list[Any], list[Any]]]:
        nwords = self.active.size
        fail_words, x, big = self.numeric.probe_batch(facts)
        fails = self._failing(facts, memos)
        candidates = np.broadcast_to(self.active, (len(facts), nwords))
        if fail_words is not None:
            candidates = candidates & ~fail_words
        if any(fails):
            packed = b"".join(f.to_bytes(nwords * 8, "little") for f in fails)
            candidates = candidates & ~np.frombuffer(packed, dtype=WORD_DTYPE).reshape(-1, nwords)
        which, slots = pairs(candidates)
        if slots.size and (self.numeric.columns or self.blurred):
            keep = self.numeric.exact_batch(slots, which, x)
            if self.blurred or any(big):
                for i, (fact, slot) in enumerate(zip(which.tolist(), slots.tolist(), strict=True)):
                    if keep[i]:
                        keep[i] = self._exact_in_python(slot, facts[fact], big[fact])
            which, slots = which[keep], slots[keep]
        ends = np.searchsorted(which, np.arange(len(facts) + 1)).tolist()
        targets = self.targets.take(slots).tolist()
        if not self.parts:
            return [(targets[ends[i] : ends[i + 1]], []) for i in range(len(facts))]
        is_part = self.is_part.take(slots).tolist()
        out: list[tuple[list[Any], list[Any]]] = []
        for i in range(len(facts)):
            atomic: list[Any] = []
            parts: list[Any] = []
            for j in range(ends[i], ends[i + 1]):
                (parts if is_part[j] else atomic).append(targets[j])
            out.append((atomic, parts))
        return out

    def _failing(
        self, facts: Sequence[Mapping[str, Value]], memos: Sequence[dict[Test, bool]]
    ) -> list[int]:
        """Per fact, the slots its presence, keyed and residual tests fail, as a Python int (a
        keyed index is asked once per distinct value)."""
        fails = [0] * len(facts)
        for attribute, bits in self.present.items():
            for i, attributes in enumerate(facts):
                if attribute not in attributes:
                    fails[i] |= bits
        for attribute, index in self.keyed.items():
            known: dict[tuple[type, Value], int] = {}
            for i, attributes in enumerate(facts):
                value = attributes.get(attribute)
                if value is not None:
                    key = (type(value), value)  # 1, 1.0 and True are one dict key otherwise
                    fail = known.get(key)
                    if fail is None:
                        fail = known[key] = index.failing(value)
                    fails[i] |= fail
        if self.residual:
            for i, (attributes, memo) in enumerate(zip(facts, memos, strict=True)):
                for test, bits in self.residual.items():
                    ok = memo.get(test)
                    if ok is None:
                        ok = memo[test] = test.passes(attributes)
                    if not ok:
                        fails[i] |= bits
        return fails

    def prepare(self) -> None:
        """Bring the numeric index up to date (done before matching)."""
        self.numeric.prepare(self.used)

    def _match_directly(self, attributes: Any) -> tuple[list[Any], list[Any]]:
        atomic: list[Any] = []
        parts: list[Any] = []
        for entry in self.entries:
            if entry is None:
                continue
            for attribute in entry.required:
                if attribute not in attributes:
                    break
            else:
                tests: tuple[Test, ...] = entry.tests  # type: ignore[assignment]  # cluster small
                for test in tests:
                    value = attributes.get(test.attribute)
                    if value is None or not evaluate(test.op, test.operand, value):
                        break
                else:
                    (parts if entry.is_part else atomic).append(entry.target)
        return atomic, parts

    def _recheck(
        self,
        slots: npt.NDArray[np.int64],
        keep: npt.NDArray[np.bool_],
        attributes: Any,
        big: list[tuple[int, int]],
    ) -> None:
        """Decide in Python what floats cannot: large integers in the fact or the conditions."""
        for i, slot in enumerate(slots.tolist()):
            if keep[i]:
                keep[i] = self._exact_in_python(slot, attributes, big)

    def _exact_in_python(self, slot: int, attributes: Any, big: list[tuple[int, int]]) -> bool:
        if big and not self.numeric.exact_big(slot, big):
            return False
        if slot in self.blurred:
            entry = self.entries[slot]
            assert entry is not None
            return all(t.passes(attributes) for t in entry.recheck)
        return True


def _clear(bitsets: dict[Any, int], key: Any, bit: int) -> None:
    rest = bitsets[key] & ~bit
    if rest:
        bitsets[key] = rest
    else:
        del bitsets[key]
