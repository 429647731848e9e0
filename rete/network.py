"""The network: add and remove conditions at any time, match facts one by one or in batches."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from rete.alpha import AlphaNetwork
from rete.beta import Activation, CompositeNode, Expiry, PartRef
from rete.cluster import Entry
from rete.conditions import Bind, Composite, Conjunction, Fact, Test
from rete.limits import CompositeLimits
from rete.operators import Value

__all__ = ["DuplicateCondition", "Network", "Result", "UnknownCondition"]


class DuplicateCondition(KeyError):
    """A condition id is already in the network."""


class UnknownCondition(KeyError):
    """No condition has this id."""


@dataclass(frozen=True, slots=True)
class Result:
    """What one fact matched: condition ids, and the composite conditions it completed."""

    conditions: list[Any] = field(default_factory=list)
    activations: list[Activation] = field(default_factory=list)


def _split(conjunction: Conjunction) -> tuple[tuple[Test, ...], frozenset[str]]:
    tests = tuple(dict.fromkeys(t for t in conjunction if isinstance(t, Test)))  # once each
    binds = frozenset(b.attribute for b in conjunction if isinstance(b, Bind))
    return tests, binds


class Network:
    """A Rete network over conjunctive and composite conditions (see the package docstring)."""

    def __init__(self, limits: CompositeLimits | None = None) -> None:
        self.limits = limits or CompositeLimits()
        self._alpha = AlphaNetwork()
        self._atomic: dict[Hashable, tuple[Entry, tuple[Test, ...]]] = {}
        self._composite: dict[
            Hashable, tuple[CompositeNode, list[tuple[Entry, tuple[Test, ...]]]]
        ] = {}
        self._expiry = Expiry()
        self._seq = 0
        self._window_evicted = 0

    def __len__(self) -> int:
        return len(self._atomic) + len(self._composite)

    def __contains__(self, cid: Hashable) -> bool:
        return cid in self._atomic or cid in self._composite

    def add(self, cid: Hashable, condition: Conjunction | Composite) -> None:
        """Add a condition under a new id; it sees the facts matched from now on."""
        if cid in self:
            raise DuplicateCondition(cid)
        if isinstance(condition, Composite):
            node = CompositeNode(cid, condition, self.limits)
            entries = []
            for leaf, part in enumerate(condition.parts):
                tests, binds = _split(part)
                entry = self._alpha.add(PartRef(node, leaf), tests, binds, is_part=True)
                entries.append((entry, tests))
            self._composite[cid] = (node, entries)
        else:
            tests, binds = _split(condition)
            if binds:
                raise ValueError("variables belong only in composite conditions")
            self._atomic[cid] = (self._alpha.add(cid, tests, binds, is_part=False), tests)

    def remove(self, cid: Hashable) -> None:
        """Remove a condition and everything only it used (composite memories included)."""
        if cid in self._atomic:
            entry, tests = self._atomic.pop(cid)
            self._alpha.remove(entry, tests)
            return
        if cid not in self._composite:
            raise UnknownCondition(cid)
        node, entries = self._composite.pop(cid)
        for entry, tests in entries:
            self._alpha.remove(entry, tests)
        if self.limits.window is not None:
            self._expiry.forget(node.memories)

    def match(self, fact: Fact) -> Result:
        """Match the next fact: the conditions it satisfies and the composites it completes."""
        self._seq += 1
        atomic, parts = self._alpha.match(fact.attributes)
        if not self._composite:
            return Result(atomic)
        expiry = self._expiry
        expiry.see(fact)
        self._window_evicted += expiry.expire(self.limits)
        if not parts:
            return Result(atomic)
        hits: defaultdict[CompositeNode, dict[int, dict[str, Value]]] = defaultdict(dict)
        for ref in parts:
            bindings = ref.node.bindings(ref.leaf, fact)
            if bindings is not None:
                hits[ref.node][ref.leaf] = bindings
        activations: list[Activation] = []
        for node, leaf_hits in hits.items():
            activations += node.activate(leaf_hits, self._seq, fact, expiry)
        return Result(atomic, activations)

    def match_many(self, facts: Iterable[Fact]) -> list[Result]:
        """Match facts in order, as ``match`` would one by one."""
        return [self.match(fact) for fact in facts]

    @property
    def evicted(self) -> int:
        """Composite facts forgotten because of ``max_facts`` or the window."""
        return self._window_evicted + sum(node.evicted for node, _ in self._composite.values())

    def stats(self) -> dict[str, int]:
        """Sizes of everything the network holds (all zero once every condition is removed)."""
        alpha = self._alpha
        clusters = alpha.clusters.values()
        return {
            "conditions": len(self._atomic),
            "composites": len(self._composite),
            "alpha_tests": len(alpha.tests),
            "clusters": len(alpha.clusters),
            "slots": sum(c.live for c in clusters),
            "keyed_indexes": sum(len(c.keyed) for c in clusters),
            "residual_tests": sum(len(c.residual) for c in clusters),
            "composite_facts": sum(
                len(m.entries) for node, _ in self._composite.values() for m in node.memories
            ),
            "expiry_queue": len(self._expiry.heap),
            "evicted": self.evicted,
        }
