"""The beta network: joins of composite parts on their shared variables.

Each part of a composite reads an alpha memory (see ``rete.memory``), hash-indexed on every
variable the part binds. When a fact enters a part, the join nodes of every pattern holding that
part probe the other parts' memories, variable by variable, in an order planned once per
(pattern, part). Partial joins are not stored (TREAT's trade-off against Rete's beta memories):
state stays bounded by the alpha memories, and forgetting a fact is O(1).

Composites with the same memories and patterns (the same subscription from several clients,
say) share one join node: the join runs once, with the horizon of the oldest member, and each
member is told of the matches whose facts all arrived after it did.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from rete.conditions import Bind, Composite
from rete.limits import CompositeLimits, Policy
from rete.memory import AlphaMemory, Stored
from rete.operators import Value

__all__ = ["Activation", "CompositeNode", "guards"]


@dataclass(frozen=True, slots=True)
class Activation:
    """A composite condition completed by ``facts`` (one per part of a pattern)."""

    id: Any
    facts: tuple[Any, ...]
    bindings: dict[str, Value]


_Order = tuple[tuple[int, ...], int, tuple[int, ...]]
"""How matches are ranked: the other facts' arrival numbers, the pattern, the slot order."""

_Step = tuple[int, int, str | None]
"""(slot in the pattern, part, variable to probe the part's memory with, or None to scan it)."""


def _variables(composite: Composite) -> list[frozenset[str]]:
    return [frozenset(t.variable for t in part if isinstance(t, Bind)) for part in composite.parts]


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


def guards(composite: Composite) -> list[tuple[str, int] | None]:
    """Per part, a (variable, partner part) that every completion through it needs, if any.

    A fact entering the part can only complete a match if the partner's memory holds a fact
    with the same value of that variable.
    """
    variables = _variables(composite)
    out: list[tuple[str, int] | None] = []
    for leaf in range(len(composite.parts)):
        common: set[tuple[str, int]] | None = None
        for pattern in composite.patterns:
            if leaf not in pattern:
                continue
            here = {
                (x, other)
                for other in pattern
                if other != leaf
                for x in variables[leaf] & variables[other]
            }
            common = here if common is None else common & here
        out.append(min(common) if common else None)
    return out


def _rank(
    results: list[tuple[int, list[Stored], dict[str, Value]]], seq: int
) -> list[tuple[_Order, list[Stored], dict[str, Value]]]:
    """Matches in rank order, each set of facts with the same bindings once."""
    found: dict[object, tuple[_Order, list[Stored], dict[str, Value]]] = {}
    for p, facts, bindings in results:
        others = tuple(sorted(s.seq for s in facts if s.seq != seq))
        order = (others, p, tuple(s.seq for s in facts))
        if len(results) == 1:
            return [(order, facts, bindings)]
        key = (frozenset(s.seq for s in facts), tuple(sorted(bindings.items())))
        if key not in found or order < found[key][0]:
            found[key] = (order, facts, bindings)
    return sorted(found.values(), key=lambda item: item[0])


class CompositeNode:
    """The join plans and terminal of one composite condition, and of its identical twins."""

    def __init__(self, composite: Composite, limits: CompositeLimits) -> None:
        self.composite = composite
        self.limits = limits
        self.members: list[Any] = []
        """The ids of the composites this node serves, oldest first."""
        self.added: list[int] = []
        """When each member was added: it ignores facts up to that sequence number."""
        self.memories: list[AlphaMemory] = []
        self.guards: list[tuple[str, int] | None] = []
        variables = _variables(composite)
        self.starts: list[list[tuple[int, int, list[_Step]]]] = [[] for _ in composite.parts]
        """Per part: (pattern, slot, join plan) for every place the part holds in a pattern."""
        for p, pattern in enumerate(composite.patterns):
            for slot, leaf in enumerate(pattern):
                self.starts[leaf].append((p, slot, _plan(pattern, slot, variables)))

    def activate(self, hits: dict[int, dict[str, Value]], seq: int, fact: Any) -> list[Activation]:
        """The matches a new fact completes as parts ``hits`` (leaf -> its bindings).

        Under the consume policy the chosen match's facts are forgotten here; the caller then
        does not store the new fact either.
        """
        results: list[tuple[int, list[Stored], dict[str, Value]]] = []
        new = {leaf: Stored(seq, fact, leaf_bindings) for leaf, leaf_bindings in hits.items()}
        also = {} if self.limits.distinct else new
        for leaf, first in new.items():
            for p, slot, plan in self.starts[leaf]:
                size = len(self.composite.patterns[p])
                joins = self._join(plan, 0, {slot: first}, first.bindings, (seq,), also)
                for chosen, bindings in joins:
                    results.append((p, [chosen[s] for s in range(size)], bindings))
        if not results:
            return []
        ranked = _rank(results, seq)
        if self.limits.policy is Policy.CONSUME:
            ranked = ranked[:1]
            for used in ranked[0][0][0]:
                for memory in self.memories:
                    memory.forget(used)
        activations = []
        for (others, _, _), facts, bindings in ranked:
            # Members added after the oldest other fact did not see it.
            oldest = others[0] if others else seq
            values = tuple(s.fact for s in facts)
            for member in self.members[: bisect_left(self.added, oldest)]:
                activations.append(Activation(member, values, bindings))
        return activations

    def _join(
        self,
        plan: list[_Step],
        step: int,
        chosen: dict[int, Stored],
        bindings: dict[str, Value],
        used: tuple[int, ...],
        also: dict[int, Stored],
    ) -> Iterator[tuple[dict[int, Stored], dict[str, Value]]]:
        """Fill the plan's slots from the parts' memories, and from ``also`` (part -> the new
        fact, when one fact may fill several parts)."""
        if step == len(plan):
            yield chosen, bindings
            return
        slot, part, probe = plan[step]
        memory = self.memories[part]
        candidates: Iterable[Stored]
        if probe is None:
            candidates = memory.entries.values()
        else:
            candidates = memory.index[probe].get(bindings[probe], {}).values()
        if part in also:
            candidates = (*candidates, also[part])
        added = self.added[0]
        distinct = self.limits.distinct
        for stored in candidates:
            if stored.seq <= added or (distinct and stored.seq in used):
                continue
            merged = bindings
            for variable, value in stored.bindings.items():
                previous = merged.get(variable)
                if previous is None:
                    merged = {**merged, variable: value}
                elif previous != value:
                    break
            else:
                chosen_now = {**chosen, slot: stored}
                yield from self._join(plan, step + 1, chosen_now, merged, (*used, stored.seq), also)
