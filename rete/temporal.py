"""Temporal composites: sequences, windows and absences, matched in timestamp order.

A fact that passes the alpha tests of a part enters the node's *reorder buffer* (a heap on
timestamp, then arrival). The *watermark* is the newest timestamp seen less the lateness, or
the time ``advance`` was given less the lateness, whichever is later; a fact older than the
watermark when it arrives is late (dropped and counted). Facts older than the watermark leave
the buffer in timestamp order and are numbered; each is joined against the facts released
before it, held per part in timestamp order and hash-indexed on the part's variables, the join
plans those of ``rete.beta``. The window expires held facts from the front of each part's
memory: state is bounded by the window (and by ``max_facts`` per part) plus the buffer, which
holds at most the facts of the last ``lateness``.

A match whose pattern ends with an absence waits until its window closes; ``advance`` closes
windows when no fact comes.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rete.beta import Activation, _plan, _Step
from rete.conditions import Bind, Fact, TemporalComposite
from rete.limits import CompositeLimits, Consumption, Policy
from rete.operators import Value
from rete.snapshot import Buffered, Held, TemporalState, Waiting

__all__ = ["Inlet", "TemporalNode"]


@dataclass(eq=False, slots=True)
class _Held:
    """A released fact as one part holds it."""

    number: int
    ts: datetime
    fact: Any
    bindings: dict[str, Value]


class _Memory:
    """The released facts of one part, oldest first, indexed on each variable it binds."""

    __slots__ = ("held", "index")

    def __init__(self, variables: Iterable[str]) -> None:
        self.held: deque[_Held] = deque()
        self.index: dict[str, dict[Value, list[_Held]]] = {x: {} for x in variables}

    def store(self, held: _Held) -> None:
        self.held.append(held)
        for variable, table in self.index.items():
            table.setdefault(held.bindings[variable], []).append(held)

    def _unindex(self, held: _Held) -> None:
        for variable, table in self.index.items():
            value = held.bindings[variable]
            bucket = table[value]
            if bucket[0] is held:
                del bucket[0]
            else:
                bucket.remove(held)
            if not bucket:
                del table[value]

    def expire(self, alive: Callable[[_Held], bool]) -> int:
        """Drop held facts from the front while ``alive`` says they are not; how many."""
        held = self.held
        dropped = 0
        while held and not alive(held[0]):
            self._unindex(held.popleft())
            dropped += 1
        return dropped

    def drop_oldest(self) -> None:
        self._unindex(self.held.popleft())

    def forget(self, numbers: set[int]) -> None:
        gone = [h for h in self.held if h.number in numbers]
        for h in gone:
            self.held.remove(h)
            self._unindex(h)


class Inlet:
    """What the alpha network reports for a part of a temporal composite: the fact passed
    the part's tests; ``bindings`` says whether its variables bind."""

    __slots__ = ("binds", "entry", "kind", "leaf", "node")

    def __init__(self, node: TemporalNode, leaf: int, binds: tuple[Bind, ...]) -> None:
        self.node = node
        self.leaf = leaf
        self.binds = binds
        self.kind = 0
        """The same for inlets whose ``binds`` are equal: a fact binds them alike."""
        self.entry: Any = None

    def bindings(self, attributes: Mapping[str, Value]) -> dict[str, Value] | None:
        out: dict[str, Value] = {}
        for bind in self.binds:
            value = attributes.get(bind.attribute)
            if value is None or not bind.accepts(value):
                return None
            if out.setdefault(bind.variable, value) != value:
                return None
        return out


@dataclass(slots=True)
class _Waiting:
    pattern: int
    held: tuple[_Held, ...]
    bindings: dict[str, Value]
    closes_at: datetime | None
    closes_after: int | None


_Found = tuple[tuple[object, ...], int, tuple[_Held, ...], dict[str, Value]]


class TemporalNode:
    """One temporal composite: its buffer, the facts it holds per part, the matches waiting
    for their window to close."""

    def __init__(self, cid: Hashable, condition: TemporalComposite, limits: CompositeLimits):
        self.cid = cid
        self.condition = condition
        self.max_facts = limits.max_facts
        self.consume = condition.consume
        if self.consume is None and limits.policy is Policy.CONSUME:
            self.consume = Consumption.FIRST
        self.within = condition.within
        self.events = condition.events
        self.lateness = condition.lateness
        binds = [tuple(b for b in part if isinstance(b, Bind)) for part in condition.parts]
        self.inlets = [Inlet(self, leaf, b) for leaf, b in enumerate(binds)]
        names = [tuple(dict.fromkeys(b.variable for b in part)) for part in binds]
        variables = [frozenset(n) for n in names]
        self.memories = [_Memory(n) for n in names]
        self.starts: list[list[tuple[int, int, list[_Step]]]] = [[] for _ in condition.parts]
        """Per part: (pattern, slot, join plan from that slot) for every place it holds."""
        for p, pattern in enumerate(condition.patterns):
            for slot, leaf in enumerate(pattern):
                self.starts[leaf].append((p, slot, _plan(pattern, slot, names, variables)))
        self.open_ended = [
            any(x.right is None for x in order.absences) for order in condition.orders
        ]
        self.kept = [
            self.consume is not None or not _last_only(condition, leaf)
            for leaf in range(len(binds))
        ]
        """Per part, whether its facts are held once released. A part that is only ever the
        later side of a sequence (not strictly next, and no absence) is not: its facts
        complete matches as they come, and no later fact can use them (a fact released later
        is not older)."""
        self.joined = [
            not self.kept[leaf] and all(len(p) > 1 for p in condition.patterns if leaf in p)
            for leaf in range(len(binds))
        ]
        """Per part, whether its facts complete matches only joined with facts held before
        them, and are not held themselves."""
        self.buffer: list[tuple[datetime, int, Any, dict[int, dict[str, Value]]]] = []
        self.newest: datetime | None = None
        self.clock: datetime | None = None
        self.arrivals = 0
        self.numbered = 0
        self.waiting: list[_Waiting] = []
        self.ahead: datetime | None = None
        self.late = 0
        self.early = 0
        """Facts refused for a timestamp after ``ahead``."""
        self.evicted = 0

    # -- time ----------------------------------------------------------------------------------

    def watermark(self) -> datetime | None:
        newest, clock = self.newest, self.clock
        if newest is None:
            return None if clock is None else clock - self.lateness
        if clock is None or newest >= clock:
            return newest - self.lateness
        return clock - self.lateness

    def offer(self, fact: Fact, hits: dict[int, dict[str, Value]]) -> list[Activation]:
        """A fact that satisfies the parts ``hits`` (part -> its bindings there)."""
        ts = fact.timestamp
        mark = self.watermark()
        if mark is not None and ts < mark:
            self.late += 1
            return []
        if self.ahead is not None and ts > self.ahead:
            self.early += 1
            return []

        self.arrivals += 1
        heapq.heappush(self.buffer, (ts, self.arrivals, fact, hits))
        if self.newest is None or ts > self.newest:
            self.newest = ts
        return self._release()

    def advance(self, now: datetime, ahead: datetime | None = None) -> list[Activation]:
        """Take ``now`` as a lower bound of the newest timestamp; ``ahead``: refuse facts
        stamped after it from now on (one stamped far ahead would make every other late)."""
        if self.clock is None or now > self.clock:
            self.clock = now
        if ahead is not None:
            self.ahead = ahead
        return self._release()

    def _release(self) -> list[Activation]:
        mark = self.watermark()
        assert mark is not None
        buffer = self.buffer
        out: list[Activation] = []
        while buffer and buffer[0][0] < mark:
            ts, _, fact, hits = heapq.heappop(buffer)
            if self.waiting:
                out += self._close(before=ts)
            out += self._take(ts, fact, hits)
            if self.waiting:
                out += self._close(counted=self.numbered)
        if self.waiting:
            out += self._close(before=mark)
        return out

    # -- one released fact ---------------------------------------------------------------------

    def _take(self, ts: datetime, fact: Any, hits: dict[int, dict[str, Value]]) -> list[Activation]:
        self.numbered += 1
        number = self.numbered
        joined = self.joined
        if all(joined[leaf] for leaf in hits) and not any(m.held for m in self.memories):
            return []  # nothing to join it with, and it is not held: it leaves no trace
        self._expire(ts, number)
        entering = {leaf: _Held(number, ts, fact, b) for leaf, b in hits.items()}
        found: dict[object, _Found] = {}
        patterns = self.condition.patterns
        for leaf, first in entering.items():
            for p, _, plan in self.starts[leaf]:
                chosen: list[_Held] = [first] * len(patterns[p])
                results: list[tuple[list[_Held], dict[str, Value]]] = []
                self._join(plan, 0, chosen, first.bindings, {number}, results)
                for held, bindings in results:
                    facts = tuple(held)
                    if not self._ordered(p, facts, bindings):
                        continue
                    key = (frozenset(h.number for h in facts), tuple(sorted(bindings.items())))
                    rank = self._rank(facts, number, p)
                    if key not in found or rank < found[key][0]:
                        found[key] = (rank, p, facts, bindings)
        out: list[Activation] = []
        stored = True
        for _, p, facts, bindings in sorted(found.values(), key=lambda item: item[0]):
            if self.open_ended[p]:
                self.waiting.append(_Waiting(p, facts, bindings, *self._closing(facts)))
                continue
            out.append(Activation(self.cid, tuple(h.fact for h in facts), bindings))
            if self.consume is not None:
                self._forget({h.number for h in facts})
                stored = False
                break
        if stored:
            for leaf, entry in entering.items():
                if not self.kept[leaf]:
                    continue
                memory = self.memories[leaf]
                memory.store(entry)
                if len(memory.held) > self.max_facts:
                    memory.drop_oldest()
                    self.evicted += 1
        return out

    def _join(
        self,
        plan: list[_Step],
        step: int,
        chosen: list[_Held],
        bindings: dict[str, Value],
        used: set[int],
        out: list[tuple[list[_Held], dict[str, Value]]],
    ) -> None:
        if step == len(plan):
            out.append((chosen.copy(), bindings))
            return
        slot, part, probe, checks, fresh = plan[step]
        memory = self.memories[part]
        candidates: Iterable[_Held] = (
            memory.held if probe is None else memory.index[probe].get(bindings[probe], ())
        )
        for held in candidates:
            if held.number in used:
                continue
            values = held.bindings
            if any(bindings[x] != values[x] for x in checks):
                continue
            merged = bindings
            if fresh:
                merged = bindings.copy()
                for x in fresh:
                    merged[x] = values[x]
            chosen[slot] = held
            used.add(held.number)
            self._join(plan, step + 1, chosen, merged, used, out)
            used.discard(held.number)

    def _rank(self, facts: tuple[_Held, ...], number: int, p: int) -> tuple[object, ...]:
        others = sorted(h.number for h in facts if h.number != number)
        if self.consume is Consumption.LAST:
            return (tuple(-n for n in reversed(others)), p, tuple(h.number for h in facts))
        return (tuple(others), p, tuple(h.number for h in facts))

    def _expire(self, ts: datetime, number: int) -> None:
        within, events = self.within, self.events
        if within is None and events is None:
            return
        horizon = None if within is None else ts - within

        def alive(h: _Held) -> bool:
            return (horizon is None or h.ts >= horizon) and (
                events is None or number - h.number < events
            )

        for memory in self.memories:
            self.evicted += memory.expire(alive)

    def _forget(self, numbers: set[int]) -> None:
        for memory in self.memories:
            memory.forget(numbers)

    # -- the rules of order --------------------------------------------------------------------

    def _ordered(self, p: int, facts: tuple[_Held, ...], bindings: dict[str, Value]) -> bool:
        within, events = self.within, self.events
        if within is not None or events is not None:
            times = [h.ts for h in facts]
            if within is not None and max(times) - min(times) > within:
                return False
            numbers = [h.number for h in facts]
            if events is not None and max(numbers) - min(numbers) >= events:
                return False
        order = self.condition.orders[p]
        for gap in order.gaps:
            last = max(facts[s].ts for s in gap.left)
            first = min(facts[s].ts for s in gap.right)
            if last >= first:
                return False
            if gap.strict:
                numbers_in = {h.number for h in facts}
                pattern = self.condition.patterns[p]
                if self._any_between(pattern, last, first, bindings, numbers_in):
                    return False
        for absence in order.absences:
            if absence.right is None:
                continue
            last = max(facts[s].ts for s in absence.left)
            first = min(facts[s].ts for s in absence.right)
            if self._any_between((absence.part,), last, first, bindings, set()):
                return False
        return True

    def _any_between(
        self,
        parts: Iterable[int],
        after: datetime,
        before: datetime,
        bindings: Mapping[str, Value],
        exclude: set[int],
    ) -> bool:
        for part in parts:
            for held in reversed(self.memories[part].held):
                if held.ts <= after:
                    break
                if held.ts >= before or held.number in exclude:
                    continue
                if _agrees(held.bindings, bindings):
                    return True
        return False

    # -- matches waiting for their window to close ---------------------------------------------

    def _closing(self, facts: tuple[_Held, ...]) -> tuple[datetime | None, int | None]:
        first = min(h.ts for h in facts)
        at = None if self.within is None else first + self.within
        after = None if self.events is None else min(h.number for h in facts) + self.events - 1
        return at, after

    def _close(
        self, before: datetime | None = None, counted: int | None = None
    ) -> list[Activation]:
        """Close the windows of the waiting matches that end before ``before`` or at most at
        ``counted`` facts; report those no absent fact came for."""

        def closed(w: _Waiting) -> bool:
            if before is not None and w.closes_at is not None and w.closes_at < before:
                return True
            return counted is not None and w.closes_after is not None and counted >= w.closes_after

        done = [w for w in self.waiting if closed(w)]
        if not done:
            return []
        self.waiting = [w for w in self.waiting if not closed(w)]
        out = []
        for w in done:
            if self.consume is not None and not self._all_held(w.held):
                continue
            if self._absent_after(w):
                out.append(Activation(self.cid, tuple(h.fact for h in w.held), w.bindings))
                if self.consume is not None:
                    self._forget({h.number for h in w.held})
        return out

    def _all_held(self, facts: tuple[_Held, ...]) -> bool:
        held = {h.number for memory in self.memories for h in memory.held}
        return all(h.number in held for h in facts)

    def _absent_after(self, w: _Waiting) -> bool:
        for absence in self.condition.orders[w.pattern].absences:
            if absence.right is not None:
                continue
            last = max(w.held[s].ts for s in absence.left)
            for held in self.memories[absence.part].held:
                if held.ts <= last or not _agrees(held.bindings, w.bindings):
                    continue
                if (w.closes_at is None or held.ts <= w.closes_at) and (
                    w.closes_after is None or held.number <= w.closes_after
                ):
                    return False
        return True

    # -- state ---------------------------------------------------------------------------------

    def export(self, place: Callable[[Any], int]) -> TemporalState:
        """What the node holds (``rete.snapshot``), each fact as ``place`` numbers it."""

        def kept(h: _Held) -> Held:
            return Held(h.number, place(h.fact), h.bindings)

        return TemporalState(
            self.newest,
            self.clock,
            self.ahead,
            self.arrivals,
            self.numbered,
            self.late,
            self.early,
            self.evicted,
            [Buffered(arrival, place(fact), hits) for _, arrival, fact, hits in self.buffer],
            [[kept(h) for h in memory.held] for memory in self.memories],
            [
                Waiting(
                    w.pattern, [kept(h) for h in w.held], w.bindings, w.closes_at, w.closes_after
                )
                for w in self.waiting
            ],
        )

    def restore(self, state: TemporalState, facts: Sequence[Any]) -> None:
        """Hold what ``state`` says (taken of a node of the same condition), its facts placed
        in ``facts``; the node holds nothing yet."""
        if len(state.memories) != len(self.memories):
            raise ValueError("the snapshot is of a composite with other parts")

        def held(h: Held) -> _Held:
            fact = facts[h.fact]
            return _Held(h.number, fact.timestamp, fact, h.bindings)

        self.newest, self.clock, self.ahead = state.newest, state.clock, state.ahead
        self.arrivals, self.numbered = state.arrivals, state.numbered
        self.late, self.early, self.evicted = state.late, state.early, state.evicted
        self.buffer = [
            (facts[b.fact].timestamp, b.arrival, facts[b.fact], b.hits) for b in state.buffer
        ]
        heapq.heapify(self.buffer)
        for memory, kept in zip(self.memories, state.memories, strict=True):
            for h in kept:
                memory.store(held(h))
        self.waiting = [
            _Waiting(
                w.pattern, tuple(held(h) for h in w.held), w.bindings, w.closes_at, w.closes_after
            )
            for w in state.waiting
        ]

    def held(self) -> int:
        """Facts held: per part, in the buffer, and in waiting matches."""
        return (
            sum(len(m.held) for m in self.memories)
            + len(self.buffer)
            + sum(len(w.held) for w in self.waiting)
        )


def _last_only(condition: TemporalComposite, leaf: int) -> bool:
    """Whether part ``leaf``, in every pattern holding it, comes after every other part of the
    pattern (by its sequence gaps, none of them strict: ``;;`` looks for facts of every part
    in between), and is absent from no pattern: then no fact released after one of its facts
    can use it."""
    if any(x.part == leaf for order in condition.orders for x in order.absences):
        return False
    found = False
    for pattern, order in zip(condition.patterns, condition.orders, strict=True):
        if leaf not in pattern:
            continue
        found = True
        if any(gap.strict for gap in order.gaps):
            return False
        before: dict[int, set[int]] = {}
        for gap in order.gaps:
            for right in gap.right:
                before.setdefault(right, set()).update(gap.left)
        for slot, part in enumerate(pattern):
            if part != leaf:
                continue
            earlier: set[int] = set()
            todo = [slot]
            while todo:
                for other in before.get(todo.pop(), ()):
                    if other not in earlier:
                        earlier.add(other)
                        todo.append(other)
            if len(earlier) < len(pattern) - 1:
                return False
    return found


def _agrees(values: Mapping[str, Value], bindings: Mapping[str, Value]) -> bool:
    for variable, value in values.items():
        bound = bindings.get(variable)
        if bound is not None and bound != value:
            return False
    return True
