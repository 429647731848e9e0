"""Merging the subscriptions a broker forwards to one neighbour.

``Routes`` decides which subscriptions go to each *slot*, a neighbour and a tree (covering
hides some); with merging on, the neighbour is sent fewer filters. Each *output* stands for
one or more of the subscriptions forwarded to that neighbour for the same trees (its
*members*) and matches every publication any member matches (``padres.matching.merging``);
it is sent for those trees. A lone member is sent as itself; a merged output under an id of
its own, which this broker makes. Since members of one output go to the same trees, a
perfect merge is exact tree by tree. Publications the neighbour sends down for an output
are matched here against the members' own routes, so an imperfect merge's false positive
costs traffic on this link and ends here: no client ever receives what it did not subscribe
to.

``send``, ``withdraw`` and ``forget`` only record which members changed. ``flush``, at the end
of each change of the routing (``Routes``), brings the outputs in line:

- a member that left an output makes the rest merge again among themselves; if they make
  the same filter, the output stays as it is;
- a changed member joins an output of its key and trees that already matches all it
  matches, or merges with the outputs of its key and trees, one after another while some
  merges, or goes alone;
- then the neighbour is sent what it lacks, *before* what it no longer needs is withdrawn:
  it never lacks a route it needs, and no publication is missed while the change travels.
  Each output is sent one message per tree: what waits for a member's routing to settle
  waits for the trees it is forwarded for, not for others (which could wait for it in turn,
  across the overlay's cycles).

Bounds: an output holds at most ``MOST_MEMBERS`` members, and a merge tries at most
``MERGE_SCAN`` outputs of its key and trees (the latest first): a merge missed only leaves a
larger table. Filters with a time window are never merged.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Final, NamedTuple, TypeAlias

from padres.broker.trees import Trees
from padres.matching import merging
from padres.matching.merging import (
    Domain,
    Interval,
    best_merge,
    contains,
    intervals,
    merge_key,
)
from padres.model.messages import Filter, Subscription
from padres.model.protocol import Envelope, RouteSubscribe, RouteUnsubscribe

__all__ = ["MERGE_SCAN", "MOST_MEMBERS", "MergeStatistics", "Mergers", "Merging", "Slot"]

MERGE_SCAN: Final = 16
"""Outputs of one key and trees a member (or a merged output) tries to merge with, at most."""
MOST_MEMBERS: Final = 64
"""Members of one output, at most: what a member's leaving merges again is bounded."""

Slot: TypeAlias = tuple[str, str]
"""(neighbour hop, tree id): one place a subscription can be forwarded to."""
_Out: TypeAlias = tuple[str, Envelope]
_Group: TypeAlias = tuple[Hashable, frozenset[str]]
"""A merge key and a set of trees: the outputs that may merge with each other."""


@dataclass(frozen=True, slots=True)
class Merging:
    """Whether a broker merges the subscriptions it forwards to a neighbour, and how far."""

    enabled: bool = False
    """Merge the subscriptions forwarded to one neighbour into fewer filters that match
    exactly what they match."""
    imperfect: float = 0.0
    """Also merge them into a more general filter when its estimated false-positive rate is
    at most this (0: never; needs merging on)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.imperfect < 1.0:
            raise ValueError("the imperfect merging bound is a rate from 0 up to (not) 1")
        if self.imperfect > 0.0 and not self.enabled:
            raise ValueError("imperfect merging needs merging on")


class MergeStatistics(NamedTuple):
    """What merging saves at one broker, counting each filter once per tree it is sent for."""

    members: int
    """Subscriptions forwarded to neighbours, before merging."""
    outputs: int
    """Filters the neighbours hold for them, after merging."""
    merged: int
    """Those of ``outputs`` that stand for several subscriptions."""
    inexact: int
    """Those of ``merged`` that match more than their members (imperfect merges)."""


@dataclass(eq=False)
class _Output:
    """One filter sent to a neighbour, for its members, for the trees they go to."""

    filter: Filter
    members: dict[str, Subscription]
    useful: float
    """See ``padres.matching.merging.Merged.useful``."""
    group: _Group
    id: str = ""
    """The id the neighbour knows it by, once it has one: a lone member's own, else one of
    its own. Members that join an output later leave its id as it is."""

    @property
    def trees(self) -> frozenset[str]:
        return self.group[1]


@dataclass
class _Neighbour:
    """The outputs for one neighbour, and what it holds."""

    subs: dict[str, Subscription] = field(default_factory=dict)
    """The members, by id."""
    trees_of: dict[str, set[str]] = field(default_factory=dict)
    """Member -> the trees it is forwarded for."""
    of: dict[str, _Output] = field(default_factory=dict)
    """Member -> its output (as of the last flush)."""
    outputs: dict[str, _Output] = field(default_factory=dict)
    """By id."""
    groups: dict[_Group, dict[str, _Output]] = field(default_factory=dict)
    """The mergeable outputs of each group, oldest first."""
    held: dict[str, tuple[Filter, set[str]]] = field(default_factory=dict)
    """What the neighbour was sent: id -> filter and trees."""
    dirty: dict[str, None] = field(default_factory=dict)
    """Members changed since the last flush, in order."""


class Mergers:
    """The outputs sent to every neighbour (see the module docstring); with merging off,
    each subscription forwarded is sent as itself and nothing is kept."""

    def __init__(self, settings: Merging, trees: Trees, new_id: Callable[[], str]) -> None:
        """``new_id``: an overlay-wide id, for a merged output."""
        self.settings = settings
        self.trees = trees
        self._new_id = new_id
        self._neighbours: dict[str, _Neighbour] = {}

    def __len__(self) -> int:
        """Neighbours with merging state."""
        return len(self._neighbours)

    def statistics(self) -> MergeStatistics:
        outputs = [o for n in self._neighbours.values() for o in n.outputs.values()]
        merged = [o for o in outputs if len(o.members) > 1]
        return MergeStatistics(
            sum(len(o.members) * len(o.trees) for o in outputs),
            sum(len(o.trees) for o in outputs),
            sum(len(o.trees) for o in merged),
            sum(len(o.trees) for o in merged if o.useful < 1.0),
        )

    def saved(self) -> int:
        """Forwarded subscriptions (per tree) the neighbours need not hold, thanks to
        merging."""
        stats = self.statistics()
        return stats.members - stats.outputs

    def carrier(self, slot: Slot, sid: str) -> str:
        """The id the slot's neighbour knows the forwarded subscription ``sid`` by."""
        state = self._neighbours.get(slot[0])
        output = None if state is None else state.of.get(sid)
        return sid if output is None else output.id

    # -- changes -----------------------------------------------------------------------------

    def send(self, slot: Slot, sub: Subscription) -> list[_Out]:
        """Forward ``sub`` to ``slot``: with merging off, the message to send; else
        recorded for ``flush``."""
        hop, tree = slot
        if not self.settings.enabled:
            return [(hop, RouteSubscribe(sub, (tree,)))]
        state = self._neighbours.setdefault(hop, _Neighbour())
        state.subs[sub.id] = sub
        state.trees_of.setdefault(sub.id, set()).add(tree)
        state.dirty[sub.id] = None
        return []

    def withdraw(self, slot: Slot, sid: str) -> list[_Out]:
        """Stop forwarding ``sid`` to ``slot``: with merging off, the message to send; else
        recorded for ``flush``."""
        hop, tree = slot
        if not self.settings.enabled:
            return [(hop, RouteUnsubscribe(sid, (tree,)))]
        state = self._neighbours[hop]
        state.trees_of[sid].discard(tree)
        state.dirty[sid] = None
        return []

    def forget(self, slot: Slot, sid: str) -> None:
        """The slot's tree is gone (its neighbour has let go of it already): ``sid`` is no
        longer forwarded there, and nothing is sent for it."""
        hop, tree = slot
        state = self._neighbours.get(hop)
        if state is None or sid not in state.trees_of:
            return
        state.trees_of[sid].discard(tree)
        state.dirty[sid] = None
        output = state.of.get(sid)
        if output is not None and output.id in state.held:
            state.held[output.id][1].discard(tree)

    def drop(self, hop: str) -> None:
        """The neighbour on ``hop`` is gone, with all it was sent."""
        self._neighbours.pop(hop, None)

    def flush(self) -> list[_Out]:
        """What to send the neighbours so that each holds the outputs of what is forwarded
        to it now (see the module docstring)."""
        out: list[_Out] = []
        for hop in sorted(self._neighbours):
            state = self._neighbours[hop]
            if state.dirty:
                out += self._flush(hop, state)
        return out

    # -- internals ---------------------------------------------------------------------------

    def _flush(self, hop: str, state: _Neighbour) -> list[_Out]:
        dirty = list(state.dirty)
        state.dirty.clear()
        touched: set[str] = set()
        # Filters withdrawn in this flush -> their id, which an output of the same filter may
        # take again (the neighbour then changes only the trees it holds it for).
        vanished: dict[Filter, str] = {}
        shrunk: dict[str, _Output] = {}
        for sid in dirty:
            output = state.of.pop(sid, None)
            if output is not None:
                del output.members[sid]
                shrunk[output.id] = output
            if not state.trees_of.get(sid, True):
                del state.trees_of[sid], state.subs[sid]
        for output in shrunk.values():
            self._unregister(state, output)
            touched.add(output.id)
            if not output.members:
                vanished[output.filter] = output.id
                continue
            regrouped = self._regroup(list(output.members.values()), output.group)
            if len(regrouped) == 1 and _same(regrouped[0], output):
                output.members, output.useful = regrouped[0].members, regrouped[0].useful
                self._register(state, output, vanished)
                continue
            vanished[output.filter] = output.id
            for new in regrouped:
                self._register(state, new, vanished)
                touched.add(new.id)
        for sid in dirty:
            if sid in state.subs and sid not in state.of:
                touched |= self._place(state, state.subs[sid], vanished)
        return self._changes(hop, state, touched)

    def _place(self, state: _Neighbour, sub: Subscription, vanished: dict[Filter, str]) -> set[str]:
        """Place the member ``sub`` in an output; returns the ids of the outputs made or
        changed."""
        group: _Group = (merge_key(sub.filter), frozenset(state.trees_of[sub.id]))
        home = next(
            (
                o
                for o in self._candidates(state, group)
                if len(o.members) < MOST_MEMBERS and contains(o.filter, sub.filter)
            ),
            None,
        )
        if home is not None:
            home.members[sub.id] = sub
            state.of[sub.id] = home
            return set()
        lone = _Output(sub.filter, {sub.id: sub}, 1.0, group)
        grown, replaced = self._grow(lone, lambda: self._candidates(state, group))
        touched = set()
        for output in replaced:
            self._unregister(state, output)
            vanished[output.filter] = output.id
            touched.add(output.id)
        self._register(state, grown, vanished)
        return touched | {grown.id}

    def _changes(self, hop: str, state: _Neighbour, touched: set[str]) -> list[_Out]:
        """The messages that bring what the neighbour holds, for the outputs ``touched``, in
        line with the outputs: what it lacks first."""
        subscribe: list[_Out] = []
        unsubscribe: list[_Out] = []
        for oid in sorted(touched):
            output = state.outputs.get(oid)
            _, had = state.held.pop(oid, (None, set()))
            now = set() if output is None else set(output.trees)
            if output is not None:
                state.held[oid] = (output.filter, now)
                sub = Subscription(oid, output.filter)
                subscribe += [(hop, RouteSubscribe(sub, (t,))) for t in sorted(now - had)]
            if had - now:
                unsubscribe.append((hop, RouteUnsubscribe(oid, tuple(sorted(had - now)))))
        if not state.outputs and not state.subs:
            del self._neighbours[hop]
        return subscribe + unsubscribe

    def _candidates(self, state: _Neighbour, group: _Group) -> Iterator[_Output]:
        """The outputs of ``group``, the latest first, at most ``MERGE_SCAN``."""
        if group[0] is None:
            return iter(())
        return islice(reversed(state.groups.get(group, {}).values()), MERGE_SCAN)

    def _grow(
        self, current: _Output, candidates: Callable[[], Iterator[_Output]]
    ) -> tuple[_Output, list[_Output]]:
        """``current`` merged with candidates while one merges (perfectly or within the
        bound; the best first); returns it and the outputs it took in."""
        replaced: list[_Output] = []
        if current.group[0] is None:
            return current, replaced
        bound = self.settings.imperfect
        domain = self._domain(current.trees, current.filter.class_name) if bound else None
        while True:
            best = best_merge(
                current.filter,
                current.useful,
                len(current.members),
                (
                    (other, other.filter, other.useful, len(other.members))
                    for other in candidates()
                    if other is not current and other not in replaced
                ),
                bound,
                domain,
                MOST_MEMBERS,
            )
            if best is None:
                return current, replaced
            merged, other = best
            replaced.append(other)
            members = current.members | other.members
            current = _Output(merged.filter, members, merged.useful, current.group)

    def _regroup(self, members: list[Subscription], group: _Group) -> list[_Output]:
        """``members`` (of one group) merged anew among themselves."""
        bound = self.settings.imperfect
        domain = self._domain(group[1], members[0].filter.class_name) if bound else None
        by_id = {sub.id: sub for sub in members}
        grouped = merging.group(
            ((sub.id, sub.filter) for sub in members),
            bound,
            domain,
            scan=MERGE_SCAN,
            most=MOST_MEMBERS,
        )
        return [
            _Output(g.filter, {sid: by_id[sid] for sid in g.members}, g.useful, group)
            for g in grouped
        ]

    def _register(self, state: _Neighbour, output: _Output, vanished: dict[Filter, str]) -> None:
        """Record ``output``, giving it its id if it has none yet: one of the same filter
        withdrawn in this flush, else a lone member's own unless an output goes by it, else
        a new one."""
        if not output.id:
            lone = next(iter(output.members)) if len(output.members) == 1 else None
            again = vanished.pop(output.filter, None)
            if again is not None and again not in state.outputs:
                output.id = again
            elif (
                lone is not None
                and lone not in state.outputs
                and (lone not in state.held or state.held[lone][0] == output.filter)
            ):
                output.id = lone
            else:
                output.id = self._new_id()
        state.outputs[output.id] = output
        for sid in output.members:
            state.of[sid] = output
        if output.group[0] is not None:
            state.groups.setdefault(output.group, {})[output.id] = output

    def _unregister(self, state: _Neighbour, output: _Output) -> None:
        del state.outputs[output.id]
        if output.group[0] is not None:
            same = state.groups[output.group]
            del same[output.id]
            if not same:
                del state.groups[output.group]

    def _domain(self, tree_ids: Iterable[str], class_name: str) -> Domain:
        """The numbers the advertisements of the trees ``tree_ids`` (of ``class_name``)
        allow, per attribute: the hull of their intervals (None: one of them allows any)."""
        advertised = [
            adv.filter
            for tree_id in tree_ids
            if (tree := self.trees.get(tree_id)) is not None
            for adv in tree.advertisements.values()
            if adv.filter.class_name == class_name
        ]

        def domain(attribute: str) -> Interval | None:
            hull: Interval | None = None
            for flt in advertised:
                iv = intervals(flt).get(attribute)
                if iv is None or not iv.numeric:
                    return None
                hull = iv if hull is None else hull.hull(iv)
            return hull

        return domain


def _same(a: _Output, b: _Output) -> bool:
    """Whether two outputs match the same publications (by their intervals)."""
    return a.filter == b.filter or (contains(a.filter, b.filter) and contains(b.filter, a.filter))
