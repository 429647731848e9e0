"""The reference matcher: every subscription evaluated against every publication, one by one.

It is the executable specification that faster engines must agree with, written to be obviously
correct rather than fast. Composite semantics (see docs/language.md):

* a composite subscription remembers the publications that matched any of its parts, per part;
* a new publication completes a match when, for one pattern of the composite's disjunctive normal
  form, distinct publications fill every part, the new one among them, with agreeing bindings
  (with ``distinct=False`` one publication may fill several parts);
* the same set of publications with the same bindings is one match, however many ways it fills
  the parts;
* ``CONSUME_AND_REMAIN`` (PADRES) reports every match the new publication completes and keeps all
  publications; ``CONSUME`` reports one (the one whose other publications arrived earliest) and
  forgets the publications it used;
* each part keeps at most ``max_facts`` publications (the oldest go first) and, when ``window`` is
  set, none whose timestamp is older than the newest timestamp seen minus ``window``.

Composites with a sequence or a window of their own are matched in timestamp order
(``padres.matching.reference_temporal``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from padres.errors import DuplicateId, UnknownId
from padres.matching.matcher import CompositeMatch, MatchResult, filter_bindings, matches
from padres.matching.reference_temporal import TemporalState
from padres.model.messages import CompositeSubscription, Publication, Subscription
from rete.limits import CompositeLimits, Policy
from rete.operators import Value

__all__ = ["ReferenceMatcher"]


@dataclass
class _Fact:
    seq: int
    pub: Publication


@dataclass
class _CompositeState:
    sub: CompositeSubscription
    memories: list[list[_Fact]] = field(default_factory=list)


class ReferenceMatcher:
    """Brute-force matcher over atomic and composite subscriptions."""

    def __init__(self, limits: CompositeLimits | None = None) -> None:
        self.limits = limits or CompositeLimits()
        self._atomic: dict[str, Subscription] = {}
        self._composite: dict[str, _CompositeState] = {}
        self._temporal: dict[str, TemporalState] = {}
        self._seq = 0
        self._newest: datetime | None = None
        self._evicted = 0

    @property
    def evicted(self) -> int:
        return self._evicted + sum(t.evicted for t in self._temporal.values())

    def __len__(self) -> int:
        return len(self._atomic) + len(self._composite) + len(self._temporal)

    def add(self, subscription: Subscription | CompositeSubscription) -> None:
        sid = subscription.id
        if sid in self._atomic or sid in self._composite or sid in self._temporal:
            raise DuplicateId(subscription.id)
        if isinstance(subscription, Subscription):
            self._atomic[subscription.id] = subscription
        elif subscription.timing is not None:
            self._temporal[sid] = TemporalState(subscription, subscription.timing, self.limits)
        else:
            state = _CompositeState(subscription, [[] for _ in subscription.filters])
            self._composite[subscription.id] = state

    def remove(self, subscription_id: str) -> None:
        found = (
            self._atomic.pop(subscription_id, None)
            or self._composite.pop(subscription_id, None)
            or self._temporal.pop(subscription_id, None)
        )
        if isinstance(found, TemporalState):
            self._evicted += found.evicted
        if found is None:
            raise UnknownId(subscription_id)

    def match(self, publication: Publication) -> MatchResult:
        self._seq += 1
        if self._newest is None or publication.timestamp > self._newest:
            self._newest = publication.timestamp
        atomic = tuple(sid for sid, sub in self._atomic.items() if matches(sub.filter, publication))
        completed: list[CompositeMatch] = []
        for state in self._composite.values():
            completed.extend(self._match_composite(state, _Fact(self._seq, publication)))
        for temporal in self._temporal.values():
            completed += temporal.arrive(publication, self._seq)
        return MatchResult(atomic, tuple(completed))

    def advance(self, now: datetime) -> tuple[CompositeMatch, ...]:
        """Time passes without a publication: composites matched in timestamp order take
        ``now`` less their lateness as their watermark, and report the matches that completes
        (those waiting for a window to close without an absent publication)."""
        out: list[CompositeMatch] = []
        for temporal in self._temporal.values():
            out += temporal.advance(now)
        return tuple(out)

    @property
    def late(self) -> int:
        """Publications dropped by composites matched in timestamp order: they came later
        than the composite's lateness allows."""
        return sum(t.late for t in self._temporal.values())

    def _expire(self, state: _CompositeState) -> None:
        window = self.limits.window
        if window is None or self._newest is None:
            return
        oldest = self._newest - window
        for memory in state.memories:
            keep = [f for f in memory if f.pub.timestamp >= oldest]
            self._evicted += len(memory) - len(keep)
            memory[:] = keep

    def _match_composite(self, state: _CompositeState, new: _Fact) -> list[CompositeMatch]:
        self._expire(state)
        sub = state.sub
        hits = {
            leaf: b
            for leaf, flt in enumerate(sub.filters)
            if (b := filter_bindings(flt, new.pub)) is not None
        }
        if not hits:
            return []
        found: dict[object, tuple[tuple[object, ...], CompositeMatch]] = {}
        for index, pattern in enumerate(sub.patterns):
            for slot, leaf in enumerate(pattern):
                if leaf not in hits:
                    continue
                for facts, bindings in self._fill(state, pattern, {slot: new}, hits[leaf], new):
                    match = CompositeMatch(sub.id, tuple(f.pub for f in facts), bindings)
                    others = tuple(sorted(f.seq for f in facts if f is not new))
                    order = (others, index, tuple(f.seq for f in facts))
                    key = match.key()
                    if key not in found or order < found[key][0]:
                        found[key] = (order, match)
        if self.limits.policy is Policy.CONSUME and found:
            _, best = min(found.values(), key=lambda item: item[0])
            used = {p.id for p in best.publications}
            for memory in state.memories:
                memory[:] = [f for f in memory if f.pub.id not in used]
            return [best]
        for leaf in hits:
            memory = state.memories[leaf]
            memory.append(new)
            if len(memory) > self.limits.max_facts:
                del memory[0]
                self._evicted += 1
        return [m for _, m in sorted(found.values(), key=lambda item: item[0])]

    def _fill(
        self,
        state: _CompositeState,
        pattern: tuple[int, ...],
        chosen: dict[int, _Fact],
        bindings: Mapping[str, Value],
        new: _Fact,
    ) -> Iterator[tuple[list[_Fact], dict[str, Value]]]:
        """Every way to fill the remaining slots of ``pattern`` from the parts' memories (and
        with the new publication again, when parts need not be distinct publications)."""
        free = next((s for s in range(len(pattern)) if s not in chosen), None)
        if free is None:
            yield [chosen[s] for s in range(len(pattern))], dict(bindings)
            return
        distinct = self.limits.distinct
        used = {f.pub.id for f in chosen.values()} if distinct else set()
        flt = state.sub.filters[pattern[free]]
        candidates = state.memories[pattern[free]] + ([] if distinct else [new])
        for fact in candidates:
            if fact.pub.id in used:
                continue
            b = filter_bindings(flt, fact.pub, bindings)
            if b is not None:
                yield from self._fill(state, pattern, {**chosen, free: fact}, b, new)
