"""The network: add and remove conditions at any time, match facts one by one or in batches."""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from rete.alpha import AlphaNetwork
from rete.beta import Activation, CompositeNode, guards
from rete.cluster import SMALL, Entry
from rete.conditions import Bind, Composite, Conjunction, Fact, TemporalComposite, Test
from rete.limits import CompositeLimits, Policy
from rete.memory import AlphaMemory, Expiry, Holders, Stored
from rete.operators import Value
from rete.snapshot import Expiring, Held, JoinState, Snapshot
from rete.temporal import Inlet, TemporalNode

__all__ = ["DuplicateCondition", "Network", "Result", "UnknownCondition"]


class DuplicateCondition(KeyError):
    """A condition id is already in the network."""


class UnknownCondition(KeyError):
    """No condition has this id."""


@dataclass(slots=True)  # not frozen: one is made per fact, and a frozen one costs twice as much
class Result:
    """What one fact matched: condition ids, and the composite conditions it completed."""

    conditions: list[Any] = field(default_factory=list)
    activations: list[Activation] = field(default_factory=list)


def _split(conjunction: Conjunction) -> tuple[tuple[Test, ...], frozenset[str]]:
    if Bind not in map(type, conjunction):
        return conjunction, _NO_BINDS  # type: ignore[return-value]
    tests = tuple(t for t in conjunction if type(t) is Test)
    binds = frozenset(b.attribute for b in conjunction if isinstance(b, Bind))
    return tests, binds


_NO_BINDS: frozenset[str] = frozenset()


def _atomic(conjunction: Conjunction) -> tuple[Test, ...]:
    """The tests of an atomic condition (``ValueError`` if it binds variables)."""
    tests, binds = _split(conjunction)
    if binds:
        raise ValueError("variables belong only in composite conditions")
    return tests


_Signature = tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]


def _signature(memories: list[AlphaMemory], patterns: tuple[tuple[int, ...], ...]) -> _Signature:
    """Composites with the same memories and patterns join alike: they share a join node."""
    return tuple(id(m) for m in memories), patterns


class Network:
    """A Rete network over conjunctive and composite conditions (see the package docstring)."""

    def __init__(
        self,
        limits: CompositeLimits | None = None,
        small_cluster: int = SMALL,
        *,
        share: bool = True,
    ) -> None:
        """``small_cluster``: clusters up to this many conditions are evaluated test by test.
        ``share``: identical composite parts (and composites) share their memories (and join
        nodes) under consume-and-remain; a network fed part by part (``match_part``) must not
        share, or a fact given to one part would reach the identical ones too."""
        self.limits = limits or CompositeLimits()
        self._share = share and self.limits.policy is Policy.CONSUME_AND_REMAIN
        self._alpha = AlphaNetwork(small_cluster)
        self._atomic: dict[Hashable, Entry] = {}
        self._composite: dict[Hashable, CompositeNode] = {}
        self._joins: dict[_Signature, CompositeNode] = {}
        self._temporal: dict[Hashable, TemporalNode] = {}
        self._binders: dict[tuple[Bind, ...], int] = {}
        """A number for each list of bindings a temporal part makes (``Inlet.kind``)."""
        self._shared: dict[frozenset[Test | Bind], AlphaMemory] = {}
        self._holders = Holders()
        self._expiry = Expiry()
        self._seq = 0
        self._evicted = 0
        self._late = 0
        self._early = 0
        self._clock: datetime | None = None
        self._ahead: datetime | None = None
        """The last ``advance``: its time, and the latest timestamp it lets in."""
        self._prefetched: dict[int, tuple[Mapping[str, Value], tuple[list[Any], list[Any]]]] = {}

    def __len__(self) -> int:
        return len(self._atomic) + len(self._composite) + len(self._temporal)

    def __contains__(self, cid: Hashable) -> bool:
        return cid in self._atomic or cid in self._composite or cid in self._temporal

    def add(self, cid: Hashable, condition: Conjunction | Composite | TemporalComposite) -> None:
        """Add a condition under a new id; it sees the facts matched from now on."""
        if cid in self:
            raise DuplicateCondition(cid)
        self._prefetched = {}
        if isinstance(condition, TemporalComposite):
            temporal = TemporalNode(cid, condition, self.limits)
            for inlet, part in zip(temporal.inlets, condition.parts, strict=True):
                inlet.kind = self._binders.setdefault(inlet.binds, len(self._binders))
                tests, attributes = _split(part)
                inlet.entry = self._alpha.add(inlet, tests, attributes, is_part=True)
            if self._clock is not None:
                temporal.advance(self._clock, self._ahead)  # nothing is held yet: no matches
            self._temporal[cid] = temporal
        elif isinstance(condition, Composite):
            self._composite[cid] = self._join_node(condition)
            node = self._composite[cid]
            node.members.append(cid)
            node.added.append(self._seq)
            for memory in node.memories:
                memory.count_from(self._seq)
        else:
            tests = _atomic(condition)
            self._atomic[cid] = self._alpha.add(cid, tests, _NO_BINDS, is_part=False)

    def add_many(self, conditions: Iterable[tuple[Hashable, Conjunction]]) -> None:
        """``add`` each of ``conditions`` (id and conjunction) in turn, for a frame of
        subscriptions or a load: each cluster they go to grows once and takes its share at once.
        Nothing is added if an id is taken or given twice (``DuplicateCondition``) or a
        conjunction binds a variable (``ValueError``)."""
        ids: set[Hashable] = set()
        filed = []
        for cid, condition in conditions:
            if cid in self or cid in ids:
                raise DuplicateCondition(cid)
            ids.add(cid)
            filed.append((cid, _atomic(condition), _NO_BINDS, False))
        self._prefetched = {}
        entries = self._alpha.add_many(filed)
        self._atomic.update(zip((cid for cid, *_ in filed), entries, strict=True))

    def _join_node(self, composite: Composite) -> CompositeNode:
        """The join node for a new composite: an identical one's, if sharing is allowed."""
        memories = [self._memory(part) for part in composite.parts]
        shared = self._share
        node = self._joins.get(_signature(memories, composite.patterns)) if shared else None
        if node is None:
            node = CompositeNode(composite, self.limits)
            node.memories = memories
            # A fact may fill its partner part itself when parts need not be distinct facts.
            node.guards = guards(composite) if self.limits.distinct else [None] * len(memories)
            for leaf, memory in enumerate(memories):
                memory.attach((node, leaf), self._guard(node, node.guards[leaf]))
            if shared:
                self._joins[_signature(memories, composite.patterns)] = node
        return node

    @staticmethod
    def _guard(
        node: CompositeNode, guard: tuple[str, int] | None
    ) -> tuple[str, AlphaMemory] | None:
        return None if guard is None else (guard[0], node.memories[guard[1]])

    def _memory(self, part: Conjunction) -> AlphaMemory:
        """The alpha memory of a composite part: shared with identical parts when allowed."""
        shared = self._share
        key = frozenset(part)
        if shared and key in self._shared:
            return self._shared[key]
        tests, attributes = _split(part)
        binds = tuple(b for b in part if isinstance(b, Bind))
        memory = AlphaMemory(binds, self._holders, private=not shared)
        memory.entry = self._alpha.add(memory, tests, attributes, is_part=True)
        if shared:
            self._shared[key] = memory
        return memory

    def remove(self, cid: Hashable) -> None:
        """Remove a condition and everything only it used (composite memories included)."""
        self._prefetched = {}
        entry = self._atomic.pop(cid, None)
        if entry is not None:
            self._alpha.remove(entry)
            return
        temporal = self._temporal.pop(cid, None)
        if temporal is not None:
            for inlet in temporal.inlets:
                self._alpha.remove(inlet.entry)
            self._evicted += temporal.evicted
            self._late += temporal.late
            self._early += temporal.early
            return
        node = self._composite.pop(cid, None)
        if node is None:
            raise UnknownCondition(cid)
        i = node.members.index(cid)
        del node.members[i]
        added = node.added.pop(i)
        for memory in node.memories:
            memory.uncount(added)
        if node.members:
            return
        self._joins.pop(_signature(node.memories, node.composite.patterns), None)
        for leaf, memory in enumerate(node.memories):
            memory.detach((node, leaf), self._guard(node, node.guards[leaf]))
            if not memory.users:
                self._alpha.remove(memory.entry)
                if not memory.private:
                    del self._shared[frozenset(node.composite.parts[leaf])]
                memory.clear()  # its entries in the expiry queue now expire as no-ops
        if not self._composite:
            self._expiry.heap.clear()

    def prefetch(self, facts: Sequence[Fact]) -> None:
        """Run the alpha network over ``facts`` together, ahead of their ``match`` or ``peek``:
        one vectorized pass per cluster rather than one per fact. Each fact's result waits for
        its first match or peek (the same fact: the same attributes object) until the next
        prefetch, or until a condition is added or removed (the results would be stale)."""
        if not self._alpha.batches():
            self._prefetched = {}
            return
        matched = self._alpha.match_batch([f.attributes for f in facts])
        self._prefetched = {
            id(f.attributes): (f.attributes, result)
            for f, result in zip(facts, matched, strict=True)
        }

    def match_batch(self, facts: Sequence[Fact]) -> list[Result]:
        """``match`` each of ``facts`` in turn, the alpha network over all of them at once."""
        self.prefetch(facts)
        results = [self.match(f) for f in facts]
        self._prefetched = {}
        return results

    def _alpha_match(self, attributes: Mapping[str, Value]) -> tuple[list[Any], list[Any]]:
        hit = self._prefetched.pop(id(attributes), None)
        if hit is not None and hit[0] is attributes:
            return hit[1]
        return self._alpha.match(attributes)

    def peek(self, fact: Fact) -> Result:
        """The atomic conditions ``fact`` satisfies, without matching it: composite conditions
        neither see nor keep it."""
        return Result(self._alpha_match(fact.attributes)[0])

    def match(self, fact: Fact) -> Result:
        """Match the next fact: the conditions it satisfies and the composites it completes."""
        self._seq += 1
        if self._prefetched:
            atomic, parts = self._alpha_match(fact.attributes)
        else:
            atomic, parts = self._alpha.match(fact.attributes)
        if self._temporal and parts:
            return Result(atomic, self._temporal_step(fact, parts))
        if not self._composite:
            return Result(atomic)
        return Result(atomic, self._join(fact, parts))

    def _temporal_step(self, fact: Fact, parts: list[Any]) -> list[Activation]:
        """``fact`` offered to the temporal composites whose parts it passed, then joined as
        usual for the others."""
        inlets = [p for p in parts if type(p) is Inlet]
        activations = []
        if self._composite:
            activations = self._join(fact, [p for p in parts if type(p) is not Inlet])
        hits: dict[TemporalNode, dict[int, dict[str, Value]]] = {}
        attributes = fact.attributes
        bound: dict[int, dict[str, Value] | None] = {}  # parts binding alike bind once
        for inlet in inlets:
            kind = inlet.kind
            if kind in bound:
                bindings = bound[kind]
            else:
                bindings = bound[kind] = inlet.bindings(attributes)
            if bindings is not None:
                hits.setdefault(inlet.node, {})[inlet.leaf] = bindings
        for node, leaves in hits.items():
            activations += node.offer(fact, leaves)
        return activations

    def advance(self, now: datetime, ahead: timedelta | None = None) -> list[Activation]:
        """Time passes without a fact: temporal composites take ``now`` less their lateness as
        their watermark; the matches that completes (those waiting for a window to close).
        ``ahead``: from now on they refuse facts stamped more than this after ``now``."""
        out: list[Activation] = []
        limit = None if ahead is None else now + ahead
        self._clock, self._ahead = now, limit
        for node in self._temporal.values():
            out += node.advance(now, limit)
        return out

    @property
    def composites(self) -> int:
        """How many composite conditions (temporal ones included) the network holds."""
        return len(self._composite) + len(self._temporal)

    @property
    def late(self) -> int:
        """Facts temporal composites dropped: they came later than their lateness allows."""
        return self._late + sum(node.late for node in self._temporal.values())

    @property
    def early(self) -> int:
        """Facts temporal composites refused for a timestamp too far ahead (``advance``)."""
        return self._early + sum(node.early for node in self._temporal.values())

    def match_part(self, fact: Fact, cid: Hashable, part: int) -> Result:
        """Match the next fact as a candidate for one part of composite ``cid`` only (a fact
        known to come from that part's source): the part's tests still apply. The network must
        not share memories (``share=False``): a fact given to one part would reach identical
        parts too."""
        self._seq += 1
        node = self._composite[cid]
        tests, _ = _split(node.composite.parts[part])
        if not all(t.passes(fact.attributes) for t in tests):
            return Result()
        return Result([], self._join(fact, [node.memories[part]]))

    def _join(self, fact: Fact, parts: list[AlphaMemory]) -> list[Activation]:
        """The beta step: ``fact`` enters the memories of the composite ``parts`` it satisfies,
        joined against what they hold; the composites it completes."""
        limits = self.limits
        window = limits.window
        if window is not None:
            self._evicted += self._expiry.advance(fact.timestamp, window)
        if not parts:
            return []
        seq = self._seq
        hits: dict[CompositeNode, dict[int, Stored]] = {}
        stores: list[tuple[AlphaMemory, Stored]] = []
        for memory in parts:
            bindings = memory.bindings(fact)
            if bindings is None:
                continue
            stored = Stored(seq, fact, bindings)
            stores.append((memory, stored))
            for node, leaf in memory.activated(bindings):
                leaves = hits.get(node)
                if leaves is None:
                    hits[node] = {leaf: stored}
                else:
                    leaves[leaf] = stored
        activations: list[Activation] = []
        consumed: set[CompositeNode] = set()
        for node, leaf_hits in hits.items():
            found = node.activate(leaf_hits, seq)
            if found:
                if limits.policy is Policy.CONSUME:
                    consumed.add(node)
                activations += found
        kept: list[AlphaMemory] = []
        for memory, stored in stores:
            if consumed and memory.private and memory.users[0][0] in consumed:
                continue  # consumed: the fact completed a match and is used up
            memory.store(stored)
            kept.append(memory)
            if len(memory.entries) > limits.max_facts:
                self._evicted += memory.forget(memory.oldest())
        if window is not None and kept:
            self._expiry.push(fact.timestamp, seq, kept)
        return activations

    # -- partial matches, to keep -------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The partial matches of the network's composites, as plain values (``rete.snapshot``);
        only for a network that shares no memories."""
        if self._share:
            raise ValueError("a network sharing memories between composites has no snapshot")
        facts: list[Any] = []
        places: dict[int, int] = {}

        def place(fact: Any) -> int:
            found = places.get(id(fact))
            if found is None:
                found = places[id(fact)] = len(facts)
                facts.append(fact)
            return found

        nodes = list(self._composite.values())
        joins = [
            JoinState(
                list(node.added),
                [
                    [Held(s.seq, place(s.fact), s.bindings) for s in memory.entries.values()]
                    for memory in node.memories
                ],
            )
            for node in nodes
        ]
        where = {id(m): (j, p) for j, node in enumerate(nodes) for p, m in enumerate(node.memories)}
        expiring = [
            Expiring(ts, seq, [where[id(m)] for m in memories if seq in m.entries])
            for ts, seq, memories in self._expiry.heap
        ]
        temporal = [node.export(place) for node in self._temporal.values()]
        return Snapshot(
            facts,
            self._seq,
            self._clock,
            self._ahead,
            self._evicted,
            self._late,
            self._early,
            self._expiry.newest,
            self._expiry.horizon,
            [e for e in expiring if e.parts],
            joins,
            temporal,
        )

    def restore(self, snapshot: Snapshot) -> None:
        """Take up the partial matches of ``snapshot``, taken of a network holding the same
        composite conditions, added in the same order; this one has matched nothing yet.
        ``ValueError`` if the conditions differ."""
        nodes = list(self._composite.values())
        temporal = list(self._temporal.values())
        if len(nodes) != len(snapshot.joins) or len(temporal) != len(snapshot.temporal):
            raise ValueError("the snapshot is of a network with other composites")
        facts = snapshot.facts
        for node, state in zip(nodes, snapshot.joins, strict=True):
            if len(state.memories) != len(node.memories) or len(state.added) != len(node.added):
                raise ValueError("the snapshot is of a composite with other parts")
            node.added[:] = state.added
            for memory, held in zip(node.memories, state.memories, strict=True):
                memory.added[:] = state.added
                for h in held:
                    memory.store(Stored(h.number, facts[h.fact], h.bindings))
        for tnode, tstate in zip(temporal, snapshot.temporal, strict=True):
            tnode.restore(tstate, facts)
        self._expiry.heap = [
            (e.timestamp, e.number, [nodes[j].memories[p] for j, p in e.parts])
            for e in snapshot.expiring
        ]
        heapq.heapify(self._expiry.heap)
        self._expiry.newest, self._expiry.horizon = snapshot.newest, snapshot.horizon
        self._seq, self._clock, self._ahead = snapshot.seq, snapshot.clock, snapshot.ahead
        self._evicted, self._late, self._early = snapshot.evicted, snapshot.late, snapshot.early
        self._prefetched = {}

    def prepare(self) -> None:
        """Fold every condition added so far into the indexes now, rather than lazily at the
        first fact that visits each cluster (call it after a bulk load)."""
        for cluster in self._alpha.clusters.values():
            cluster.prepare()

    @property
    def evicted(self) -> int:
        """(Composite part, fact) pairs forgotten because of ``max_facts`` or the window."""
        return self._evicted + sum(node.evicted for node in self._temporal.values())

    def stats(self) -> dict[str, int]:
        """Sizes of everything the network holds (all zero once every condition is removed)."""
        alpha = self._alpha
        clusters = alpha.clusters.values()
        memories = {id(m): m for node in self._composite.values() for m in node.memories}
        return {
            "conditions": len(self._atomic),
            "composites": len(self._composite),
            "alpha_nodes": alpha.nodes(),
            "clusters": len(alpha.clusters),
            "slots": sum(c.live for c in clusters),
            "keyed_indexes": sum(len(c.keyed) for c in clusters),
            "residual_tests": sum(len(c.residual) for c in clusters),
            "join_nodes": len({id(node) for node in self._composite.values()}),
            "alpha_memories": len(memories),
            "composite_facts": sum(len(m.entries) for m in memories.values()),
            "held_values": len(self._holders),
            "expiry_queue": len(self._expiry.heap),
            "temporal_composites": len(self._temporal),
            "temporal_facts": sum(node.held() for node in self._temporal.values()),
            "late": self.late,
            "early": self.early,
            "evicted": self.evicted,
        }
