"""The beta network: joins of composite parts on their shared variables.

Each part of a composite reads an alpha memory (see ``rete.memory``), hash-indexed on every
variable the part binds. When a fact enters a part, the join nodes of every pattern holding that
part probe the other parts' memories, variable by variable, in an order planned once per
(pattern, part). Partial joins are not stored (TREAT's trade-off against Rete's beta memories):
state stays bounded by the alpha memories, and forgetting a fact is O(1) (facts go oldest first,
from the front of their memory's index buckets).

Composites with the same memories and patterns (the same subscription from several clients,
say) share one join node: the join runs once, with the horizon of the oldest member, and each
member is told of the matches whose facts all arrived after it did.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
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

_Step = tuple[int, int, str | None, tuple[str, ...], tuple[str, ...]]
"""(slot in the pattern, part, variable to probe the part's memory with or None to scan it,
the part's variables already bound (each fact there must agree), those it binds anew)."""

_Start = tuple[int, int, list[_Step], tuple[int, ...]]
"""(pattern, its size, join plan from one of its slots, the parts the plan visits)."""


def _binds(composite: Composite) -> list[tuple[str, ...]]:
    """Per part, the variables it binds, in the order its facts bind them."""
    return [
        tuple(dict.fromkeys(t.variable for t in part if isinstance(t, Bind)))
        for part in composite.parts
    ]


def _variables(composite: Composite) -> list[frozenset[str]]:
    return [frozenset(binds) for binds in _binds(composite)]


def _plan(
    pattern: tuple[int, ...],
    start: int,
    binds: list[tuple[str, ...]],
    variables: list[frozenset[str]],
) -> list[_Step]:
    """Join order from ``start``: parts sharing a bound variable first, then the rest.

    Every fact in a part's memory binds all of the part's variables (``binds``, as a set in
    ``variables``), so which of them a step checks and which it adds is known here.
    """
    bound = set(variables[pattern[start]])
    todo = [s for s in range(len(pattern)) if s != start]
    steps: list[_Step] = []
    while todo:
        shared = [(len(variables[pattern[s]] & bound), s) for s in todo]
        count, slot = max(shared)
        todo.remove(slot)
        part = pattern[slot]
        probe = min(variables[part] & bound) if count else None
        checks = tuple(x for x in binds[part] if x in bound)
        fresh = tuple(x for x in binds[part] if x not in bound)
        steps.append((slot, part, probe, checks, fresh))
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
) -> list[tuple[tuple[int, ...], list[Stored], dict[str, Value]]]:
    """Matches in rank order, each set of facts with the same bindings once; each match with
    the arrival numbers of its facts other than the new one (``seq``), in increasing order."""
    if len(results) == 1:
        _, facts, bindings = results[0]
        return [(tuple(sorted([s.seq for s in facts if s.seq != seq])), facts, bindings)]
    found: dict[object, tuple[_Order, list[Stored], dict[str, Value]]] = {}
    for p, facts, bindings in results:
        others = tuple(sorted(s.seq for s in facts if s.seq != seq))
        order = (others, p, tuple(s.seq for s in facts))
        key = (frozenset(s.seq for s in facts), tuple(sorted(bindings.items())))
        if key not in found or order < found[key][0]:
            found[key] = (order, facts, bindings)
    ranked = sorted(found.values(), key=lambda item: item[0])
    return [(order[0], facts, bindings) for order, facts, bindings in ranked]


def _empty(memories: list[AlphaMemory], parts: tuple[int, ...]) -> bool:
    """Whether any of these parts' memories is empty."""
    for part in parts:  # noqa: SIM110 - any() over a generator costs more on this hot path
        if not memories[part].entries:
            return True
    return False


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
        binds = _binds(composite)
        variables = [frozenset(b) for b in binds]
        self.distinct = limits.distinct
        self.starts: list[list[_Start]] = [[] for _ in composite.parts]
        """Per part: a ``_Start`` for every place the part holds in a pattern."""
        for p, pattern in enumerate(composite.patterns):
            for slot, leaf in enumerate(pattern):
                plan = _plan(pattern, slot, binds, variables)
                others = tuple(step[1] for step in plan)
                self.starts[leaf].append((p, len(pattern), plan, others))

    def activate(self, hits: dict[int, Stored], seq: int) -> list[Activation]:
        """The matches completed by the new fact numbered ``seq``, entering the parts ``hits``
        (leaf -> the fact as stored there).

        Under the consume policy the chosen match's facts are forgotten here; the caller then
        does not store the new fact either.
        """
        results: list[tuple[int, list[Stored], dict[str, Value]]] = []
        also = _NO_PARTS if self.distinct else hits
        memories = self.memories
        for leaf, first in hits.items():
            for p, size, plan, others in self.starts[leaf]:
                if not also and _empty(memories, others):
                    continue  # the pattern cannot complete
                chosen: list[Stored] = [first] * size
                if plan:
                    self._join(plan, 0, chosen, first.bindings, (seq,), also, p, results)
                else:
                    results.append((p, chosen, first.bindings))
        if not results:
            return []
        ranked = _rank(results, seq)
        if self.limits.policy is Policy.CONSUME:
            ranked = ranked[:1]
            for used in ranked[0][0]:
                for memory in self.memories:
                    memory.forget(used)
        activations = []
        members, added = self.members, self.added
        for others, facts, bindings in ranked:
            # Members added after the oldest other fact did not see it.
            seen = bisect_left(added, others[0] if others else seq)
            if seen:
                values = tuple([s.fact for s in facts])
                for member in members[:seen]:
                    activations.append(Activation(member, values, bindings))
        return activations

    def _join(
        self,
        plan: list[_Step],
        step: int,
        chosen: list[Stored],
        bindings: dict[str, Value],
        used: tuple[int, ...],
        also: dict[int, Stored],
        pattern: int,
        out: list[tuple[int, list[Stored], dict[str, Value]]],
    ) -> None:
        """Fill the plan's slots in ``chosen`` from the parts' memories, and from ``also`` (part
        -> the new fact, when one fact may fill several parts); add each complete match to
        ``out``."""
        slot, part, probe, checks, fresh = plan[step]
        memory = self.memories[part]
        candidates: Iterable[Stored]
        if probe is None:
            candidates = memory.entries.values()
        else:
            bucket = memory.index[probe].get(bindings[probe])
            if bucket is None:
                if part not in also:
                    return
                bucket = []
            candidates = bucket
        if part in also:
            candidates = (*candidates, also[part])
        added = self.added[0]
        distinct = self.distinct
        last = step + 1 == len(plan)
        for stored in candidates:
            if stored.seq <= added or (distinct and stored.seq in used):
                continue
            values = stored.bindings
            for variable in checks:
                if bindings[variable] != values[variable]:
                    break
            else:
                merged = bindings
                if fresh:
                    merged = bindings.copy()
                    for variable in fresh:
                        merged[variable] = values[variable]
                chosen[slot] = stored
                if last:
                    out.append((pattern, chosen.copy(), merged))
                else:
                    used_now = (*used, stored.seq)
                    self._join(plan, step + 1, chosen, merged, used_now, also, pattern, out)


_NO_PARTS: dict[int, Stored] = {}
