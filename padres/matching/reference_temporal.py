"""The reference semantics of composites matched in timestamp order (sequences, windows,
absences), by brute force: every combination of the publications kept, checked against every
rule. See docs/language.md, "Sequences and windows".

* A publication that satisfies a part of the composite (absent parts included) enters a
  *reorder buffer*. The composite's *watermark* is the newest timestamp it has seen less its
  lateness (``late``), or the time given to ``advance`` less the lateness, whichever is later.
  A publication older than the watermark when it arrives is *late*: dropped and counted.
* Publications leave the buffer once older than the watermark, in timestamp order (arrival
  order among equal timestamps), and are numbered 1, 2, ... in that order (for count windows).
* When a publication leaves the buffer, the matches it completes are those made of it and
  publications that left before it: one per part of a pattern, distinct, bindings agreeing,
  within the window (``within 10s``: the last at most 10 s after the first; ``within 5
  events``: at most 5 numbers apart, both counted), each gap ordered (every publication on
  the left strictly before every one on the right; strictly next, ``;;``: and no publication
  satisfying a part of the pattern with agreeing bindings in between) and no absent part
  satisfied, with agreeing bindings, between its neighbours.
* A match whose pattern ends with an absence waits until its window closes (time passes its
  first timestamp plus the window, or the count reaches its first number plus the window less
  one), and is reported then if no publication satisfied the absent part in between.
* Under a consuming policy (``consume first`` / ``consume last``, or the matcher's ``consume``
  policy), a publication completing several matches reports one, the one whose other
  publications came first (last), and the publications of a reported match are forgotten.

Over stored publications (a historic or hybrid composite, docs/historic.md), ``over_range``
says what the composite matches: those in its time range, in timestamp order, then time passed
to the range's end, so that the windows closing within the range close and those still open
at its end do not.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import product

from padres.matching.matcher import CompositeMatch, filter_bindings
from padres.model.messages import CompositeSubscription, Filter, Publication, Temporal
from rete.conditions import Order
from rete.limits import CompositeLimits, Consumption, Policy
from rete.operators import Value

__all__ = ["TemporalState", "over_range"]


@dataclass(eq=False)
class _Fact:
    arrival: int
    pub: Publication
    number: int = 0
    """Its number in timestamp order, once released."""

    @property
    def ts(self) -> datetime:
        return self.pub.timestamp


@dataclass
class _Waiting:
    """A match held until its window closes: reported then unless an absent part showed up."""

    pattern: int
    facts: tuple[_Fact, ...]
    bindings: dict[str, Value]
    closes_at: datetime | None
    closes_after: int | None


@dataclass
class TemporalState:
    """One temporal composite subscription and what it holds."""

    sub: CompositeSubscription
    timing: Temporal
    limits: CompositeLimits
    buffer: list[_Fact] = field(default_factory=list)
    memories: list[list[_Fact]] = field(default_factory=list)
    waiting: list[_Waiting] = field(default_factory=list)
    newest: datetime | None = None
    clock: datetime | None = None
    numbered: int = 0
    late: int = 0
    evicted: int = 0

    def __post_init__(self) -> None:
        self.memories = [[] for _ in self.sub.filters]

    @property
    def lateness(self) -> timedelta:
        return timedelta(seconds=self.timing.late)

    @property
    def watermark(self) -> datetime | None:
        marks = [t - self.lateness for t in (self.newest, self.clock) if t is not None]
        return max(marks) if marks else None

    @property
    def consume(self) -> Consumption | None:
        if self.timing.consume is not None:
            return Consumption(self.timing.consume)
        return Consumption.FIRST if self.limits.policy is Policy.CONSUME else None

    def arrive(self, pub: Publication, arrival: int) -> list[CompositeMatch]:
        if not any(filter_bindings(f, pub) is not None for f in self.sub.filters):
            return []
        mark = self.watermark
        if mark is not None and pub.timestamp < mark:
            self.late += 1
            return []
        self.buffer.append(_Fact(arrival, pub))
        if self.newest is None or pub.timestamp > self.newest:
            self.newest = pub.timestamp
        return self._release()

    def advance(self, now: datetime) -> list[CompositeMatch]:
        if self.clock is None or now > self.clock:
            self.clock = now
        return self._release()

    def _release(self) -> list[CompositeMatch]:
        mark = self.watermark
        assert mark is not None
        ready = sorted((f for f in self.buffer if f.ts < mark), key=lambda f: (f.ts, f.arrival))
        self.buffer = [f for f in self.buffer if f.ts >= mark]
        out: list[CompositeMatch] = []
        for fact in ready:
            out += self._close(lambda w, ts=fact.ts: w.closes_at is not None and w.closes_at < ts)
            out += self._take(fact)
            number = self.numbered
            out += self._close(
                lambda w, n=number: w.closes_after is not None and n >= w.closes_after
            )
        out += self._close(lambda w: w.closes_at is not None and w.closes_at < mark)
        return out

    # -- one released publication --------------------------------------------------------------

    def _take(self, new: _Fact) -> list[CompositeMatch]:
        self.numbered += 1
        new.number = self.numbered
        self._expire(new)
        sub = self.sub
        found: dict[object, tuple[tuple[object, ...], int, tuple[_Fact, ...], dict[str, Value]]]
        found = {}
        for index, pattern in enumerate(sub.patterns):
            for facts, bindings in self._combinations(pattern, new):
                if not self._ordered(index, facts, bindings, new):
                    continue
                key = (frozenset(f.pub.id for f in facts), tuple(sorted(bindings.items())))
                rank = self._rank(facts, new, index)
                if key not in found or rank < found[key][0]:
                    found[key] = (rank, index, facts, bindings)
        ranked = sorted(found.values(), key=lambda item: item[0])
        consume = self.consume
        out: list[CompositeMatch] = []
        stored = True
        for _, index, facts, bindings in ranked:
            if self._ends_open(index):
                self.waiting.append(_Waiting(index, facts, bindings, *self._closing(facts)))
                continue
            out.append(CompositeMatch(sub.id, tuple(f.pub for f in facts), bindings))
            if consume is not None:
                self._forget(facts)
                stored = False
                break
        if stored:
            self._store(new)
        return out

    def _rank(self, facts: tuple[_Fact, ...], new: _Fact, index: int) -> tuple[object, ...]:
        others = sorted(f.number for f in facts if f is not new)
        if self.consume is Consumption.LAST:
            return (tuple(-n for n in reversed(others)), index, tuple(f.number for f in facts))
        return (tuple(others), index, tuple(f.number for f in facts))

    def _store(self, new: _Fact) -> None:
        for leaf, flt in enumerate(self.sub.filters):
            if filter_bindings(flt, new.pub) is None:
                continue
            memory = self.memories[leaf]
            memory.append(new)
            if len(memory) > self.limits.max_facts:
                del memory[0]
                self.evicted += 1

    def _forget(self, facts: tuple[_Fact, ...]) -> None:
        for memory in self.memories:
            memory[:] = [f for f in memory if f not in facts]

    def _expire(self, new: _Fact) -> None:
        """Forget what no match with ``new`` or a later publication can use."""
        seconds, events = self.timing.seconds, self.timing.events
        for memory in self.memories:
            keep = [
                f
                for f in memory
                if (seconds is None or f.ts >= new.ts - timedelta(seconds=seconds))
                and (events is None or new.number - f.number < events)
            ]
            self.evicted += len(memory) - len(keep)
            memory[:] = keep

    def _combinations(
        self, pattern: tuple[int, ...], new: _Fact
    ) -> Iterator[tuple[tuple[_Fact, ...], dict[str, Value]]]:
        """Every filling of the pattern's slots with distinct kept publications and ``new``
        (in at least one slot), bindings agreeing."""
        filters = self.sub.filters
        choices = [[*self.memories[leaf], new] for leaf in pattern]
        for facts in product(*choices):
            if new not in facts or len(set(map(id, facts))) < len(facts):
                continue
            bindings: dict[str, Value] | None = {}
            for leaf, fact in zip(pattern, facts, strict=True):
                bindings = filter_bindings(filters[leaf], fact.pub, bindings)
                if bindings is None:
                    break
            if bindings is not None:
                yield facts, bindings

    # -- the rules of order --------------------------------------------------------------------

    def _in_window(self, facts: tuple[_Fact, ...]) -> bool:
        seconds, events = self.timing.seconds, self.timing.events
        times = [f.ts for f in facts]
        numbers = [f.number for f in facts]
        if seconds is not None and max(times) - min(times) > timedelta(seconds=seconds):
            return False
        return events is None or max(numbers) - min(numbers) < events

    def _ordered(
        self, index: int, facts: tuple[_Fact, ...], bindings: dict[str, Value], new: _Fact
    ) -> bool:
        if not self._in_window(facts):
            return False
        order: Order = self.sub.orders[index]
        pattern = self.sub.patterns[index]
        for gap in order.gaps:
            last = max(facts[s].ts for s in gap.left)
            first = min(facts[s].ts for s in gap.right)
            if last >= first:
                return False
            if gap.strict and self._any_between(pattern, last, first, bindings, facts):
                return False
        for absence in order.absences:
            if absence.right is None:
                continue
            last = max(facts[s].ts for s in absence.left)
            first = min(facts[s].ts for s in absence.right)
            if self._any_between((absence.part,), last, first, bindings, ()):
                return False
        return True

    def _any_between(
        self,
        leaves: tuple[int, ...],
        after: datetime,
        before: datetime,
        bindings: Mapping[str, Value],
        exclude: tuple[_Fact, ...],
    ) -> bool:
        """Whether a publication kept for one of the parts ``leaves`` (not one of ``exclude``),
        with a timestamp strictly between ``after`` and ``before``, satisfies the part under
        ``bindings``."""
        for leaf in leaves:
            flt = self.sub.filters[leaf]
            for fact in self.memories[leaf]:
                if fact in exclude or not after < fact.ts < before:
                    continue
                if _agrees(flt, fact.pub, bindings):
                    return True
        return False

    # -- matches waiting for their window to close ---------------------------------------------

    def _ends_open(self, index: int) -> bool:
        return any(x.right is None for x in self.sub.orders[index].absences)

    def _closing(self, facts: tuple[_Fact, ...]) -> tuple[datetime | None, int | None]:
        seconds, events = self.timing.seconds, self.timing.events
        first = min(f.ts for f in facts)
        at = None if seconds is None else first + timedelta(seconds=seconds)
        after = None if events is None else min(f.number for f in facts) + events - 1
        return at, after

    def _close(self, closed: object) -> list[CompositeMatch]:
        """Report (or drop) the waiting matches whose window ``closed`` says has closed."""
        done = [w for w in self.waiting if closed(w)]  # type: ignore[operator]
        if not done:
            return []
        self.waiting = [w for w in self.waiting if w not in done]
        out = []
        kept = {id(f) for memory in self.memories for f in memory}
        for w in done:
            if self.consume is not None and not all(id(f) in kept for f in w.facts):
                continue  # a publication of it was used by a match reported before
            if self._absent_after(w):
                out.append(CompositeMatch(self.sub.id, tuple(f.pub for f in w.facts), w.bindings))
                if self.consume is not None:
                    self._forget(w.facts)
                    kept = {id(f) for memory in self.memories for f in memory}
        return out

    def _absent_after(self, w: _Waiting) -> bool:
        """Whether no publication satisfied an absent part at the end of ``w``'s pattern
        within its window."""
        for absence in self.sub.orders[w.pattern].absences:
            if absence.right is not None:
                continue
            last = max(w.facts[s].ts for s in absence.left)
            flt = self.sub.filters[absence.part]
            for fact in self.memories[absence.part]:
                if fact.ts <= last or not _agrees(flt, fact.pub, w.bindings):
                    continue
                if (w.closes_at is None or fact.ts <= w.closes_at) and (
                    w.closes_after is None or fact.number <= w.closes_after
                ):
                    return False
        return True


def _agrees(flt: Filter, pub: Publication, bindings: Mapping[str, Value]) -> bool:
    """Whether ``pub`` satisfies ``flt`` with its variables agreeing with ``bindings`` (those
    the filter binds and ``bindings`` does not are free)."""
    return filter_bindings(flt, pub, bindings) is not None


def over_range(
    sub: CompositeSubscription,
    publications: Iterable[Publication],
    until: datetime | None = None,
    limits: CompositeLimits | None = None,
) -> list[CompositeMatch]:
    """What ``sub`` (a composite matched in timestamp order, its parts sharing one time range)
    matches over ``publications``, those a database stored say: the ones in its range, in
    timestamp order (the order given between equal timestamps), then time passed to ``until``.
    By default that is the range's end plus the lateness (the watermark is then the end: the
    windows closing within the range close, those still open at its end never do); a range
    with no end is not passed at all unless ``until`` is given."""
    timing = sub.timing
    if timing is None:
        raise ValueError(f"composite subscription {sub.id!r} is matched in arrival order")
    window = sub.filters[0].window
    state = TemporalState(sub, timing, limits or CompositeLimits())
    chosen = (p for p in publications if window is None or p.timestamp in window)
    out: list[CompositeMatch] = []
    for arrival, pub in enumerate(sorted(chosen, key=lambda p: p.timestamp)):
        out += state.arrive(pub, arrival)
    if until is None and window is not None and window.end is not None:
        until = window.end + state.lateness
    if until is not None:
        out += state.advance(until)
    return out
