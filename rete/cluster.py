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
from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt

from rete.bitset import WORD_DTYPE, Words, from_positions, pairs, positions, to_words, words_for
from rete.conditions import Test
from rete.keyed import KEYED_OPS, KeyedIndex, tag
from rete.numeric import NumericIndex, capacity_for, grown, intervals
from rete.operators import Op, Value, evaluate

__all__ = ["Cluster", "Entry", "Filing"]


@dataclass(eq=False, slots=True)
class Entry:
    """A condition placed in a cluster: what it reports, and how its tests were filed."""

    target: Any
    """What a match reports: the condition id, or the composite part it stands for."""
    is_part: bool
    required: frozenset[str]
    """Attributes that must be present beyond those of range tests (isPresent, bindings...)."""
    key: Any
    """The access key of the cluster holding the entry (one tuple for all its entries)."""
    slot: int
    keyed: tuple[tuple[str, str, Value], ...] = ()
    residual: tuple[Test, ...] = ()
    recheck: tuple[Test, ...] = ()
    """Range tests whose numbers floats blur (beyond 2**53): decided in Python."""
    tests: tuple[Test, ...] | None = None
    """All the tests, kept only while the cluster is small enough to evaluate them directly."""


Filing: TypeAlias = tuple[Any, bool, frozenset[str], tuple[Test, ...]]
"""A condition on its way into a cluster: what it reports, whether a composite part, the
attributes it binds variables to, and its tests less the access test."""


SMALL: Final = 16
"""Default size up to which a cluster evaluates its conditions directly."""
FEW: Final = 3
"""Fewer facts than this visiting a cluster are matched one by one (cheaper below it)."""
BULK: Final = 32
"""From this many conditions inserted together on, their intervals are set vectorized..."""
CHUNK: Final = 2048
"""... this many at a time."""
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

    def _grow(self, slots: int) -> None:
        """Make room for ``slots`` slots in one step (capacities as ``grown`` steps them)."""
        capacity = self.capacity
        while capacity < slots:
            capacity = grown(capacity)
        extra = capacity - self.capacity
        if not extra:
            return
        self.capacity = capacity
        self.targets = np.concatenate([self.targets, np.empty(extra, dtype=object)])
        self.is_part = np.concatenate([self.is_part, np.zeros(extra, dtype=bool)])
        words = words_for(capacity) - self.active.size
        self.active = np.concatenate([self.active, np.zeros(words, dtype=WORD_DTYPE)])
        self.numeric.grow(capacity)

    def insert(self, filings: Sequence[Filing]) -> list[Entry]:
        """File conditions under new slots, in order, and give their entries: one growth, and
        many conditions' intervals set together."""
        start = self.used
        self._grow(start + len(filings))
        conditions = [tests for _, _, _, tests in filings]
        split: list[tuple[Sequence[Test], Sequence[Test]]] = []
        for first in range(0, len(conditions), CHUNK):  # temporaries stay small
            chunk = conditions[first : first + CHUNK]
            done = self.numeric.set_many(start + first, chunk) if len(chunk) >= BULK else None
            if done is None:
                done = []
                for slot, tests in enumerate(chunk, start + first):
                    exact, blurred, other = intervals(tests)
                    if exact:
                        self.numeric.set_intervals(slot, exact)
                    done.append((blurred, other))
            split += done
        keep = self.small - self.live if self.tested == self.live else 0
        entries = []
        for slot, (target, is_part, binds, tests), (recheck, others) in zip(
            range(start, start + len(filings)), filings, split, strict=True
        ):
            required = binds.union(t.attribute for t in others) if others else binds
            entry = Entry(target, is_part, required, self.key, slot)
            if slot - start < keep:
                entry.tests = tests
            if others:
                _sort(entry, others)
            if recheck:
                entry.recheck = tuple(recheck)
            entries.append(entry)
        self.used += len(entries)
        self._place(entries)
        return entries

    def _place(self, entries: list[Entry]) -> None:
        """Register the bits of entries in consecutive slots, from the first one's (on insert,
        and again after compaction)."""
        start = entries[0].slot
        stop = start + len(entries)
        keyed: dict[tuple[str, str, str, Value], list[int]] = {}
        residual: dict[Test, list[int]] = {}
        present: dict[str, list[int]] = {}
        targets, is_part = self.targets, self.is_part
        for slot, entry in enumerate(entries, start):
            for kind, attribute, operand in entry.keyed:  # (tagged: True and 1 are one key)
                keyed.setdefault((attribute, kind, tag(operand), operand), []).append(slot)
            for test in entry.residual:
                residual.setdefault(test, []).append(slot)
            for attribute in entry.required:
                present.setdefault(attribute, []).append(slot)
            if entry.recheck:
                self.blurred.add(slot)
            targets[slot] = entry.target
            if entry.is_part:
                is_part[slot] = True
                self.parts += 1
            self.tested += entry.tests is not None
        # Bits of many slots joined before they meet the cluster's, which are as long as the
        # cluster: one long OR for each, not one per slot.
        for (attribute, kind, _, operand), slots in keyed.items():
            self.keyed.setdefault(attribute, KeyedIndex()).add(kind, operand, _bits(slots))
        for test, slots in residual.items():
            self.residual[test] = self.residual.get(test, 0) | _bits(slots)
        for attribute, slots in present.items():
            self.present[attribute] = self.present.get(attribute, 0) | _bits(slots)
        first, last = start >> 6, (stop - 1) >> 6
        span = ((1 << (stop - start)) - 1) << (start & 63)
        if first == last:
            self.active[first] |= np.uint64(span)
        else:
            self.active[first : last + 1] |= to_words(span, last + 1 - first)
        self.entries[start:stop] = entries
        self.live += len(entries)

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
        fresh = Cluster(self.key, capacity_for(int(live.size) + 1), self.small)
        fresh.numeric.copy_rows(self.numeric, live, self.used)
        fresh.used = int(live.size)
        entries = []
        for slot, old in enumerate(live.tolist()):
            entry = self.entries[old]
            assert entry is not None
            entry.slot = slot
            entries.append(entry)
        fresh._place(entries)
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


def _sort(entry: Entry, others: Sequence[Test]) -> None:
    """File an entry's tests other than ranges: keyed (one of a kind per attribute), residual
    (each once), or neither (isPresent: its attribute is required)."""
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


def _bits(slots: list[int]) -> int:
    """A bitset of ``slots`` (increasing), built on the span they cover."""
    return from_positions([slot - slots[0] for slot in slots]) << slots[0]


def _clear(bitsets: dict[Any, int], key: Any, bit: int) -> None:
    rest = bitsets[key] & ~bit
    if rest:
        bitsets[key] = rest
    else:
        del bitsets[key]
