"""Alpha memories: the facts that satisfied a composite part, shared by every composite using it.

Under consume-and-remain, identical parts (the same tests and bindings) of different composites
share one memory: a fact is stored once, whatever the number of composites. A composite ignores
facts older than itself, so what it sees is what a memory of its own would hold, eviction by
``max_facts`` included (the last N facts overall, filtered by age, are the last N it saw).
Under consume, composites forget facts on their own: each part then has a private memory.

A fact entering a memory activates only the composites that can use it. Each composite part
has a *guard* where possible: a partner part that every completion needs and that binds a
shared variable. The composite is activated only if the partner's memory holds a fact with the
new fact's value for that variable; ``Holders`` answers that for every memory at once.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from rete.conditions import Bind, Fact
from rete.operators import Value

if TYPE_CHECKING:
    from rete.beta import CompositeNode

__all__ = ["AlphaMemory", "Expiry", "Holders", "Stored"]


@dataclass(eq=False, slots=True)
class Stored:
    seq: int
    fact: Any
    bindings: dict[str, Value]


class Holders:
    """Which memories hold a fact binding variable ``x`` to value ``v``."""

    def __init__(self) -> None:
        self.by_value: dict[tuple[str, Value], set[AlphaMemory]] = {}

    def __len__(self) -> int:
        return len(self.by_value)


User = tuple["CompositeNode", int]
"""A composite and the number of its part that this memory serves."""


class AlphaMemory:
    """The facts of one part (shared or private), hash-indexed on each variable it binds."""

    def __init__(self, binds: tuple[Bind, ...], holders: Holders, private: bool) -> None:
        self.binds = binds
        self.private = private
        self.holders = holders
        self.entries: dict[int, Stored] = {}
        self.index: dict[str, dict[Value, list[Stored]]] = {b.variable: {} for b in binds}
        """variable -> value -> the facts binding it, oldest first."""
        self.users: list[User] = []
        """The join nodes (and their part) a new fact here may activate."""
        self.added: list[int] = []
        """When each composite part reading this memory was added (increasing): a forgotten
        fact counts once for each part that had seen it."""
        self.unguarded: list[User] = []
        self.guarded: dict[str, dict[AlphaMemory, list[User]]] = {}
        """variable -> guard memory -> the users to activate when it holds the value."""
        self.entry: Any = None
        """The alpha network entry that reports facts for this memory."""

    # -- users ---------------------------------------------------------------------------------

    def count_from(self, added: int) -> None:
        self.added.append(added)

    def uncount(self, added: int) -> None:
        self.added.remove(added)

    def attach(self, user: User, guard: tuple[str, AlphaMemory] | None) -> None:
        self.users.append(user)
        if guard is None:
            self.unguarded.append(user)
        else:
            variable, memory = guard
            self.guarded.setdefault(variable, {}).setdefault(memory, []).append(user)

    def detach(self, user: User, guard: tuple[str, AlphaMemory] | None) -> None:
        self.users.remove(user)
        if guard is None:
            self.unguarded.remove(user)
        else:
            variable, memory = guard
            group = self.guarded[variable]
            group[memory].remove(user)
            if not group[memory]:
                del group[memory]
                if not group:
                    del self.guarded[variable]

    def activated(self, bindings: dict[str, Value]) -> list[User]:
        """The users a new fact with ``bindings`` may complete a match for."""
        if not self.guarded:
            return self.unguarded
        out = self.unguarded.copy()
        by_value = self.holders.by_value
        for variable, by_memory in self.guarded.items():
            holding = by_value.get((variable, bindings[variable]))
            if holding is None:
                continue
            if len(holding) < len(by_memory):
                for memory in holding:
                    users = by_memory.get(memory)
                    if users is not None:
                        out += users
            else:
                for memory, users in by_memory.items():
                    if memory in holding:
                        out += users
        return out

    # -- facts ---------------------------------------------------------------------------------

    def bindings(self, fact: Fact) -> dict[str, Value] | None:
        """The values ``fact`` binds here, or None if its bindings do not hold."""
        out: dict[str, Value] = {}
        attributes = fact.attributes
        for bind in self.binds:
            value = attributes.get(bind.attribute)
            if value is None or not bind.accepts(value):
                return None
            previous = out.setdefault(bind.variable, value)
            if previous != value:
                return None
        return out

    def store(self, stored: Stored) -> None:
        seq = stored.seq
        bindings = stored.bindings
        by_value = self.holders.by_value
        self.entries[seq] = stored
        for variable, table in self.index.items():
            value = bindings[variable]
            bucket = table.get(value)
            if bucket is None:
                table[value] = [stored]
                holding = by_value.get((variable, value))
                if holding is None:
                    by_value[variable, value] = {self}
                else:
                    holding.add(self)
            else:
                bucket.append(stored)

    def forget(self, seq: int) -> int:
        """Drop a fact; returns how many users had seen it (0 if it was not here)."""
        stored = self.entries.pop(seq, None)
        if stored is None:
            return 0
        bindings = stored.bindings
        by_value = self.holders.by_value
        for variable, table in self.index.items():
            value = bindings[variable]
            bucket = table[value]
            if len(bucket) > 1:
                if bucket[0] is stored:
                    del bucket[0]
                else:
                    bucket.remove(stored)
            else:
                del table[value]
                key = (variable, value)
                holding = by_value[key]
                if len(holding) > 1:
                    holding.discard(self)
                else:
                    del by_value[key]
        return bisect_left(self.added, seq)

    def clear(self) -> None:
        for seq in list(self.entries):
            self.forget(seq)

    def oldest(self) -> int:
        return next(iter(self.entries))


class Expiry:
    """Stored facts in timestamp order, for the composite time window: one entry per fact,
    with the memories holding it."""

    def __init__(self) -> None:
        self.heap: list[tuple[datetime, int, list[AlphaMemory]]] = []
        self.newest: datetime | None = None
        self.horizon: datetime | None = None
        """The newest timestamp less the window: anything older is forgotten."""

    def advance(self, timestamp: datetime, window: timedelta) -> int:
        """See a fact's timestamp and forget the facts older than the newest timestamp seen
        less ``window``; returns how many (user, fact) pairs went."""
        newest = self.newest
        if newest is None or timestamp > newest:
            self.newest = timestamp
            self.horizon = timestamp - window
        heap = self.heap
        horizon = self.horizon
        assert horizon is not None
        dropped = 0
        while heap and heap[0][0] < horizon:
            _, seq, memories = heapq.heappop(heap)
            for memory in memories:
                dropped += memory.forget(seq)
        return dropped

    def push(self, timestamp: datetime, seq: int, memories: list[AlphaMemory]) -> None:
        heapq.heappush(self.heap, (timestamp, seq, memories))
