"""The beta network: joins of composite parts on their shared variables.

Each part of a composite condition has a memory of the facts that matched it (with the values
they bind), hash-indexed on each variable. When a fact enters a part, the join nodes of every
pattern holding that part probe the other parts' memories, variable by variable, in an order
planned once per (pattern, part). Partial joins are not stored (TREAT's trade-off against Rete's
beta memories): memory stays bounded by the part memories, and forgetting a fact is O(1).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from itertools import count
from typing import Any

from rete.conditions import Bind, Composite, Fact
from rete.limits import CompositeLimits, Policy
from rete.operators import Value

__all__ = ["Activation", "CompositeNode", "Expiry", "PartRef"]


@dataclass(frozen=True, slots=True)
class Activation:
    """A composite condition completed by ``facts`` (one per part of a pattern)."""

    id: Any
    facts: tuple[Any, ...]
    bindings: dict[str, Value]


@dataclass(frozen=True, slots=True)
class PartRef:
    """What the alpha network reports when a fact satisfies a composite part's tests."""

    node: CompositeNode
    leaf: int


@dataclass(slots=True)
class _Stored:
    seq: int
    fact: Any
    bindings: dict[str, Value]


class _PartMemory:
    __slots__ = ("entries", "index")

    def __init__(self, variables: frozenset[str]) -> None:
        self.entries: dict[int, _Stored] = {}
        self.index: dict[str, dict[Value, dict[int, _Stored]]] = {v: {} for v in variables}

    def add(self, stored: _Stored) -> None:
        self.entries[stored.seq] = stored
        for variable, table in self.index.items():
            table.setdefault(stored.bindings[variable], {})[stored.seq] = stored

    def remove(self, seq: int) -> bool:
        stored = self.entries.pop(seq, None)
        if stored is None:
            return False
        for variable, table in self.index.items():
            value = stored.bindings[variable]
            bucket = table[value]
            del bucket[seq]
            if not bucket:
                del table[value]
        return True

    def oldest(self) -> int:
        return next(iter(self.entries))


_Order = tuple[tuple[int, ...], int, tuple[int, ...]]
"""How matches are ranked: the other facts' arrival numbers, the pattern, the slot order."""

_Step = tuple[int, int, str | None]
"""(slot in the pattern, part, variable to probe the part's memory with, or None to scan it)."""


def _plan(pattern: tuple[int, ...], start: int, variables: list[frozenset[str]]) -> list[_Step]:
    """Join order from ``start``: parts sharing a bound variable first, then the rest."""
    bound = set(variables[pattern[start]])
    todo = [s for s in range(len(pattern)) if s != start]
    steps: list[_Step] = []
    while todo:
        shared = [(len(variables[pattern[s]] & bound), s) for s in todo]
        count, slot = max(shared)
        todo.remove(slot)
        part = pattern[slot]
        probe = min(variables[part] & bound) if count else None
        steps.append((slot, part, probe))
        bound |= variables[part]
    return steps


class Expiry:
    """The composite facts of a whole network in timestamp order, for the time window."""

    def __init__(self) -> None:
        self.heap: list[tuple[datetime, int, int, _PartMemory]] = []
        self.newest: datetime | None = None
        self._ties = count()

    def see(self, fact: Fact) -> None:
        if self.newest is None or fact.timestamp > self.newest:
            self.newest = fact.timestamp

    def push(self, fact: Fact, seq: int, memory: _PartMemory) -> None:
        heapq.heappush(self.heap, (fact.timestamp, seq, next(self._ties), memory))

    def expire(self, limits: CompositeLimits) -> int:
        """Forget facts older than the window; returns how many memories lost one."""
        if limits.window is None or self.newest is None:
            return 0
        oldest = self.newest - limits.window
        dropped = 0
        heap = self.heap
        while heap and heap[0][0] < oldest:
            _, seq, _, memory = heapq.heappop(heap)
            dropped += memory.remove(seq)
        return dropped

    def forget(self, memories: list[_PartMemory]) -> None:
        gone = {id(m) for m in memories}
        self.heap = [item for item in self.heap if id(item[3]) not in gone]
        heapq.heapify(self.heap)


class CompositeNode:
    """The part memories, join plans and terminal of one composite condition."""

    def __init__(self, id: Any, composite: Composite, limits: CompositeLimits) -> None:
        self.id = id
        self.composite = composite
        self.limits = limits
        self.binds: list[tuple[Bind, ...]] = [
            tuple(t for t in part if isinstance(t, Bind)) for part in composite.parts
        ]
        variables = [frozenset(b.variable for b in binds) for binds in self.binds]
        self.memories = [_PartMemory(v) for v in variables]
        self.plans = {
            (p, s): _plan(pattern, s, variables)
            for p, pattern in enumerate(composite.patterns)
            for s in range(len(pattern))
        }
        self.evicted = 0

    def bindings(self, leaf: int, fact: Fact) -> dict[str, Value] | None:
        """The values ``fact`` binds as part ``leaf``, or None if its bindings do not hold."""
        out: dict[str, Value] = {}
        attributes = fact.attributes
        for bind in self.binds[leaf]:
            value = attributes.get(bind.attribute)
            if value is None or not bind.accepts(value):
                return None
            previous = out.setdefault(bind.variable, value)
            if previous != value:
                return None
        return out

    def activate(
        self, hits: dict[int, dict[str, Value]], seq: int, fact: Fact, expiry: Expiry
    ) -> list[Activation]:
        """Join a new fact that satisfied parts ``hits``; store it or consume what it completed."""
        found: dict[object, tuple[_Order, Activation]] = {}
        patterns = self.composite.patterns
        for p, pattern in enumerate(patterns):
            for slot, leaf in enumerate(pattern):
                if leaf not in hits:
                    continue
                first = _Stored(seq, fact, hits[leaf])
                for chosen, bindings in self._join(
                    self.plans[p, slot], 0, {slot: first}, hits[leaf]
                ):
                    facts = [chosen[s] for s in range(len(pattern))]
                    others = tuple(sorted(s.seq for s in facts if s.seq != seq))
                    order = (others, p, tuple(s.seq for s in facts))
                    key = (frozenset(s.seq for s in facts), tuple(sorted(bindings.items())))
                    if key not in found or order < found[key][0]:
                        found[key] = (
                            order,
                            Activation(self.id, tuple(s.fact for s in facts), bindings),
                        )
        if found and self.limits.policy is Policy.CONSUME:
            best_order, best = min(found.values(), key=lambda item: item[0])
            for used in best_order[0]:
                for memory in self.memories:
                    memory.remove(used)
            return [best]
        for leaf, bindings in hits.items():
            memory = self.memories[leaf]
            memory.add(_Stored(seq, fact, bindings))
            if self.limits.window is not None:
                expiry.push(fact, seq, memory)
            if len(memory.entries) > self.limits.max_facts:
                memory.remove(memory.oldest())
                self.evicted += 1
        return [a for _, a in sorted(found.values(), key=lambda item: item[0])]

    def _join(
        self,
        plan: list[_Step],
        step: int,
        chosen: dict[int, _Stored],
        bindings: dict[str, Value],
    ) -> Iterator[tuple[dict[int, _Stored], dict[str, Value]]]:
        if step == len(plan):
            yield chosen, bindings
            return
        slot, part, probe = plan[step]
        memory = self.memories[part]
        if probe is None:
            candidates = memory.entries.values()
        else:
            candidates = memory.index[probe].get(bindings[probe], {}).values()
        used = {s.seq for s in chosen.values()}
        for stored in candidates:
            if stored.seq in used:
                continue
            merged = bindings
            for variable, value in stored.bindings.items():
                previous = merged.get(variable)
                if previous is None:
                    merged = {**merged, variable: value}
                elif previous != value:
                    break
            else:
                yield from self._join(plan, step + 1, {**chosen, slot: stored}, merged)
