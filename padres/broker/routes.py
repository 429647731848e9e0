"""The publication routing table (PRT): where each subscription came from and where it was sent.

Every subscription a broker knows sits once in a Rete network (``rete.Network``), so matching a
publication against all of them is one ``match`` call. Beside it, each subscription's route says

- for a subscription made here, where its matches go (its ``Sink``): to the client that made
  it, under the id the client knows it by, to a durable subscription's queue, or to the watch
  of a historic or hybrid subscription;
- ``arrivals``: the neighbours that sent it here, and for which advertisement trees; a
  publication travelling down tree T goes to the neighbours that sent a matching subscription
  for T, which are T's children that asked for it;
- ``sent``: the (neighbour, tree) *slots* it was forwarded to, toward the roots of those trees.

Covering: a subscription is not forwarded to a slot where one covering it has been forwarded
(it is *hidden* behind that one); when the covering one leaves the slot, the hidden ones are
placed again (sent, or hidden behind another) *before* the covering one is withdrawn, so no
publication is missed in between. ``ACTIVE`` covering also withdraws, from the slot, the
subscriptions a newly sent one covers. The search for a covering subscription looks at
identical filters first and then at up to ``COVER_SCAN`` others of the same class: a missed
covering only makes a table larger, never changes a delivery.

A subscription made here may be *local* (``Scope.LOCAL``): it follows only the trees rooted at
this broker (the advertisements of its own clients), so it is never forwarded, and it matches
only the publications of this broker's clients, not those arriving from neighbours. Each
subscription made here has a *priority*: a publication matching several subscriptions of one
client (or several durable subscriptions) reaches them in priority order, higher first
(``Matches``). A client that gave none of its subscriptions a priority pays nothing for it: its
ids are not sorted, so equal priorities come in no promised order (in the order made, where a
client's priorities differ).

Merging (``padres.broker.merging``, when on): what is forwarded to a slot, or withdrawn from
it, is handed to ``Mergers``; at the end of each change (``Mergers.flush``) it sends each
neighbour fewer filters, each standing for one or more of the subscriptions forwarded there.
Covering works as before on the subscriptions themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import islice
from operator import attrgetter
from typing import Final, Literal, NamedTuple, TypeAlias

from padres.broker.groups import Groups
from padres.broker.merging import Mergers, Merging, Slot
from padres.broker.trees import Tree, Trees
from padres.matching.matcher import Checks, checks, passes
from padres.matching.relations import EqKey, covering, covers, eq_key, overlaps
from padres.matching.rete_matcher import to_conjunction
from padres.model.messages import Filter, Publication, Subscription
from padres.model.protocol import MAX_PRIORITY, Envelope, RouteSubscribe
from rete import Activation, Network

__all__ = ["COVER_SCAN", "Covering", "Matches", "Out", "Route", "Routes", "Sink", "Slot"]

COVER_SCAN: Final = 64
"""Routes (or local advertisements) of the same class tried as covers of a new one, at most."""

Out: TypeAlias = tuple[str, Envelope]
"""A message to send, and the hop to send it to."""


class Covering(StrEnum):
    """How subscriptions covered by others are handled (PADRES' modes)."""

    OFF = "off"
    """Every subscription is forwarded."""
    LAZY = "lazy"
    """A new subscription covered by one already forwarded is not forwarded."""
    ACTIVE = "active"
    """Also: forwarding a subscription withdraws the ones it covers from that slot."""


class Sink(StrEnum):
    """Where the publications a subscription made at this broker matches go."""

    CLIENT = "client"
    """To the client that made it (``Route.owner``), as ``Route.notify_as``."""
    DURABLE = "durable"
    """To the queue of the durable subscription whose route it is (``Durables``)."""
    HISTORY = "history"
    """To the watch of the historic or hybrid subscription (or part) whose route it is
    (``History``): the live stream of a subscription with a time window."""


class Matches(NamedTuple):
    """Where a publication goes (``Routes.match``)."""

    clients: dict[str, list[str]]
    """Per client hop, the ids it knows its matching subscriptions by, in priority order."""
    durables: list[str]
    """The route ids of the durable subscriptions it matches, in priority order."""
    watches: list[str]
    """The route ids of the watched subscriptions (or parts) it matches."""
    hops: set[str]
    """The neighbours to forward it to."""
    activations: list[Activation]
    """The composite subscriptions it completes."""
    found: dict[str, list[str]] | None
    """When asked for (``exact``): per neighbour in ``hops``, the ids of the subscriptions it
    sent here that the publication matches (its ``RoutePublish.matched``)."""


@dataclass(eq=False)
class Route:
    sub: Subscription
    sink: Sink | None = None
    """Where its matches go, for a subscription made at this broker; None for the others."""
    owner: str | None = None
    """For a client's subscription: the client's hop."""
    notify_as: str | None = None
    """For a client's subscription: the id the client knows it by; None for a part of a
    composite subscription (its matches go to the composite)."""
    trees: set[str] = field(default_factory=set)
    """For a subscription made here: the trees with an advertisement it overlaps (only those
    rooted here, for a ``local`` one)."""
    priority: int = 0
    """For a subscription made here: where its deliveries come among the others of its client
    matching the same publication (higher first)."""
    local: bool = False
    """For a subscription made here: whether it sees only the publications of this broker's
    clients (``Scope.LOCAL``)."""
    order: int = 0
    """For a subscription made here: where its delivery comes among several for one
    publication, smallest first (``_order``)."""
    arrivals: dict[str, set[str]] = field(default_factory=dict)
    sent: set[Slot] = field(default_factory=set)
    hidden_by: dict[Slot, str] = field(default_factory=dict)
    hides: dict[Slot, set[str]] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.sub.id


class Routes:
    """Subscriptions with their routes, and the Rete network that matches publications."""

    def __init__(
        self,
        trees: Trees,
        network: Network,
        covering: Covering,
        merging: Merging,
        new_id: Callable[[], str],
    ) -> None:
        """``new_id``: an overlay-wide id, for a merged filter."""
        self.trees = trees
        self.network = network
        self.covering = covering
        self.mergers = Mergers(merging, trees, new_id)
        """What each neighbour is sent, merged; every change here ends with its ``flush``."""
        self.unwanted = 0
        """Publications from neighbours that nothing here wanted: no subscription made here
        matched, and no neighbour was to have them (a merged filter's false positives, or a
        route withdrawn while they travelled)."""
        self.brokers: set[str] = set()
        """The hops that are neighbour brokers (subscriptions are never sent to clients)."""
        self._routes: dict[str, Route] = {}
        self._local: dict[str, dict[str, Route]] = {}
        self._scoped: set[str] = set()
        """The ids of the ``local`` routes (publications from neighbours skip them)."""
        self._made = 0
        """Subscriptions made here so far (the rank of each in ``Route.order``)."""
        self._orders: dict[str, dict[str, int]] = {}
        self._ranked: dict[str, int] = {}
        """Per client hop, how many of its subscriptions have a priority other than 0 (only
        those clients' ids are sorted)."""
        """Per client hop, the ``Route.order`` of its subscriptions by the ids it knows them
        by: a client's ids in one notify are sorted by it."""
        self._groups: dict[str, tuple[Route, int]] = {}
        """Per group (its owner and id), a route standing for all its members in ``match``,
        and how many members it has."""
        self._members = Groups(COVER_SCAN)
        """The ``grouped`` routes made here: each one's group (its key in ``_groups``: a
        publication matching several members goes to the group once, the members' own routes
        never looked at in ``match``), and which are matched (``padres.broker.groups``)."""
        self._unmatched: set[str] = set()
        """The ids of the members the routing network does not hold (hidden in their group)."""
        self.trusted = 0
        """Publications from neighbours routed by the neighbour's match (``known``)."""
        self._tried: dict[Slot, dict[str, tuple[tuple[str, Checks], ...]]] = {}
        """Per slot, what ``_uncovered`` tries behind each route there (``_behind``), until
        the routing changes."""
        self._on_tree: dict[str, set[str]] = {}
        self._sent_at: dict[Slot, dict[EqKey, dict[Filter, dict[str, None]]]] = {}
        """slot -> equality key -> filter -> ids of the subscriptions forwarded there."""

    def __len__(self) -> int:
        return len(self._routes)

    def __iter__(self) -> Iterator[Route]:
        return iter(list(self._routes.values()))

    def get(self, subscription_id: str) -> Route | None:
        return self._routes.get(subscription_id)

    def forwarded(self) -> int:
        """How many filters are forwarded, each to a slot: the size of upstream tables (a
        merged filter counts once)."""
        return sum(len(r.sent) for r in self._routes.values()) - self.mergers.saved()

    def carrier(self, route_id: str, slot: Slot) -> str:
        """The id of the subscription forwarded to ``slot`` that stands for route
        ``route_id`` there: its own, a merged one, or that of the one it is hidden behind."""
        route = self._routes.get(route_id)
        coverer = None if route is None else route.hidden_by.get(slot)
        return self.mergers.carrier(slot, coverer or route_id)

    # -- changes -----------------------------------------------------------------------------

    def add_local(
        self,
        sub: Subscription,
        owner: str,
        notify_as: str | None,
        *,
        priority: int = 0,
        local: bool = False,
        grouped: bool = False,
    ) -> list[Out]:
        """A subscription client hop ``owner`` made here (see ``Route.notify_as``), of
        ``priority``, ``local`` or not; ``grouped``: ``notify_as`` names the group it is a
        member of, which a publication matching several members names once
        (``Subscribe.group``)."""
        route = Route(sub, Sink.CLIENT, owner, notify_as)
        if grouped:
            key = f"{owner}\0{notify_as}"  # hop and id together: no client id holds a NUL
            group, members = self._groups.get(key, (None, 0))
            if group is None:
                group = Route(sub, Sink.CLIENT, owner, notify_as)
            self._groups[key] = (group, members + 1)
            if not self._members.add(key, sub.id, sub.filter):
                self._unmatched.add(sub.id)  # another member of its group covers it
        return self._add_local(route, priority, local)

    def add_own(
        self,
        sub: Subscription,
        sink: Literal[Sink.DURABLE, Sink.HISTORY],
        *,
        priority: int = 0,
        local: bool = False,
    ) -> list[Out]:
        """A subscription made here for ``sink``, not for a client: the queue of a durable
        subscription, or the watch of a historic or hybrid subscription."""
        return self._add_local(Route(sub, sink), priority, local)

    def _add_local(self, route: Route, priority: int, local: bool) -> list[Out]:
        sub = route.sub
        self._made += 1
        route.priority, route.local, route.order = priority, local, _order(priority, self._made)
        if route.owner is not None and route.notify_as is not None:
            self._orders.setdefault(route.owner, {})[route.notify_as] = route.order
            if priority:
                self._ranked[route.owner] = self._ranked.get(route.owner, 0) + 1
        self._insert(route)
        self._local.setdefault(sub.filter.class_name, {})[sub.id] = route
        if local:
            self._scoped.add(sub.id)
        route.trees = {t for t in self.trees.overlapping(sub.filter) if self._follows(route, t)}
        self._watch(route, route.trees)
        return self._refresh(route) + self.mergers.flush()

    def prioritize(self, subscription_id: str, priority: int) -> None:
        """Give a subscription made here another priority (a durable one resumed with it)."""
        route = self._routes[subscription_id]
        owner, notify_as = route.owner, route.notify_as
        if owner is not None and notify_as is not None:
            if route.priority:
                self._unrank(owner)
            if priority:
                self._ranked[owner] = self._ranked.get(owner, 0) + 1
        route.priority, route.order = priority, _order(priority, route.order & _RANKS)
        if owner is not None and notify_as is not None:
            self._orders[owner][notify_as] = route.order

    def _unrank(self, owner: str) -> None:
        left = self._ranked[owner] - 1
        if left:
            self._ranked[owner] = left
        else:
            del self._ranked[owner]

    def _follows(self, route: Route, tree_id: str) -> bool:
        """Whether ``route`` may follow tree ``tree_id``: any, unless it is ``local``, which
        follows only the trees rooted here."""
        if not route.local:
            return True
        tree = self.trees.get(tree_id)
        return tree is not None and len(tree.path) == 1

    def arrive(self, sub: Subscription, hop: str, trees: Iterable[str]) -> list[Out]:
        """``hop`` sent ``sub`` for ``trees``; trees unknown here are ignored. One from the
        tree's parent is kept too (this broker moved below it while it keeps its
        subscriptions here for a while, ``paths``): the publications this broker takes from
        elsewhere go to it, but the subscription is not forwarded back up to it."""
        valid = {t for t in trees if self.trees.get(t) is not None}
        if not valid:
            return []
        route = self._routes.get(sub.id)
        if route is None:
            route = Route(sub)
            self._insert(route)
        route.arrivals.setdefault(hop, set()).update(valid)
        self._watch(route, valid)
        return self._refresh(route) + self.mergers.flush()

    def depart(self, subscription_id: str, hop: str, trees: Iterable[str]) -> list[Out]:
        route = self._routes.get(subscription_id)
        if route is None or hop not in route.arrivals:
            return []
        route.arrivals[hop].difference_update(trees)
        if not route.arrivals[hop]:
            del route.arrivals[hop]
        return self._refresh(route) + self.mergers.flush()

    def remove_local(self, *subscription_ids: str) -> list[Out]:
        """Withdraw subscriptions made here. Several are let go of together (a client that
        leaves): none of them is placed again when another that hid it is withdrawn."""
        routes = [self._routes[sid] for sid in subscription_ids]
        for route in routes:
            key = self._members.group_of.get(route.id)
            if key is not None:
                group, members = self._groups[key]
                if members > 1:
                    self._groups[key] = (group, members - 1)
                else:
                    del self._groups[key]
                for member, flt in self._members.remove(route.id):  # matched in its place
                    self._unmatched.discard(member)
                    self.network.add(member, to_conjunction(flt))
            local = self._local[route.sub.filter.class_name]
            del local[route.id]
            if not local:
                del self._local[route.sub.filter.class_name]
            if route.owner is not None and route.notify_as is not None:
                orders = self._orders[route.owner]
                orders.pop(route.notify_as, None)  # the group's, once for all its members
                if not orders:
                    del self._orders[route.owner]
                if route.priority:
                    self._unrank(route.owner)
            route.sink = route.owner = route.notify_as = None
            route.trees.clear()
            self._scoped.discard(route.id)
        out = [out for route in routes for out in self._refresh(route)]
        return out + self.mergers.flush()

    def tree_grew(self, tree_id: str, flt: Filter) -> list[Out]:
        """An advertisement with filter ``flt`` joined a tree: local subscriptions follow it."""
        out: list[Out] = []
        for route in list(self._local.get(flt.class_name, {}).values()):
            if (
                tree_id not in route.trees
                and self._follows(route, tree_id)
                and overlaps(route.sub.filter, flt)
            ):
                route.trees.add(tree_id)
                self._watch(route, (tree_id,))
                out += self._refresh(route)
        return out + self.mergers.flush()

    def tree_shrank(self, tree_id: str) -> list[Out]:
        """An advertisement left a tree (or the tree is gone): re-check who still follows it."""
        out: list[Out] = []
        tree = self.trees.get(tree_id)
        for sid in sorted(self._on_tree.pop(tree_id, set())):
            route = self._routes.get(sid)
            if route is None:
                continue
            if tree is None:
                route.trees.discard(tree_id)
                for hop in [h for h, ts in route.arrivals.items() if tree_id in ts]:
                    route.arrivals[hop].discard(tree_id)
                    if not route.arrivals[hop]:
                        del route.arrivals[hop]
                self._forget_slots(route, lambda slot: slot[1] == tree_id)
            elif tree_id in route.trees and not self.trees.tree_overlaps(tree, route.sub.filter):
                route.trees.discard(tree_id)
            if tree is not None and self._involved(route, tree_id):
                self._on_tree.setdefault(tree_id, set()).add(sid)
            out += self._refresh(route)
        return out + self.mergers.flush()

    def tree_moved(self, tree_id: str) -> list[Out]:
        """The tree's parent changed: what is forwarded for it goes to the new parent and is
        withdrawn from the old one."""
        out: list[Out] = []
        for sid in sorted(self._on_tree.get(tree_id, set())):
            route = self._routes.get(sid)
            if route is not None:
                out += self._refresh(route)
        return out

    def forget(self, hop: str, tree_id: str) -> None:
        """``hop`` forgot what was forwarded to it for ``tree_id`` (it lost the tree)."""
        for sid in sorted(self._on_tree.get(tree_id, set())):
            route = self._routes.get(sid)
            if route is not None:
                self._forget_slots(route, lambda slot: slot == (hop, tree_id))

    def sends_to(self, hop: str, tree_id: str) -> bool:
        """Whether a subscription is forwarded to ``hop`` for ``tree_id``."""
        return (hop, tree_id) in self._sent_at

    def forwarded_to(self, hop: str, tree_id: str) -> list[str]:
        """The ids of the subscriptions forwarded to ``hop`` for ``tree_id``."""
        by_key = self._sent_at.get((hop, tree_id), {})
        return [sid for by_filter in by_key.values() for sids in by_filter.values() for sid in sids]

    def hop_down(self, hop: str) -> list[Out]:
        """A neighbour is gone: forget what it sent and what was sent to it."""
        self.brokers.discard(hop)
        self.mergers.drop(hop)
        touched: list[Route] = []
        for route in list(self._routes.values()):  # all of it first: see ``remove_local``
            arrived = route.arrivals.pop(hop, None) is not None
            if any(slot[0] == hop for slot in (*route.sent, *route.hidden_by)):
                self._forget_slots(route, lambda slot: slot[0] == hop)
                arrived = True
            if arrived:
                touched.append(route)
        out = [out for route in touched for out in self._refresh(route)]
        return out + self.mergers.flush()

    # -- matching ----------------------------------------------------------------------------

    def prefetch(self, pubs: Sequence[Publication]) -> None:
        """Match ``pubs`` against the routing network's alpha step together, ahead of their
        ``match`` one by one (see ``rete.Network.prefetch``)."""
        self.network.prefetch(pubs)

    def knows(self, hop: str, tree: Tree) -> bool:
        """Whether neighbour ``hop``, matching a publication that comes down ``tree`` from it,
        knew every subscription here that it could match, but for those hidden behind covering
        ones there: ``hop`` is the tree's parent here (not a former one, while the tree
        moves), nothing merges what is forwarded, and no composite subscription needs to see
        every publication. (Whether ``hop`` has taken in all that was forwarded to it is the
        echoes' to say.)"""
        return (
            tree.parent == hop and not self.mergers.settings.enabled and not self.network.composites
        )

    def match(
        self,
        pub: Publication,
        tree: str | None,
        source: str,
        *,
        composites: bool = True,
        known: Sequence[str] | None = None,
        exact: bool = False,
    ) -> Matches:
        """Where ``pub`` goes: the subscriptions made here it matches, by sink, the neighbours
        to forward it to (down ``tree``, never back to ``source``), and the composite
        activations (with ``composites`` false, composite subscriptions do not see it at all).
        Local subscriptions match it only if it comes from a client of this broker (``source``
        is no neighbour).

        ``known``: the ids of the subscriptions forwarded to ``source`` that it found ``pub``
        to match (``RoutePublish.matched``; only where ``knows`` says so): the routing network
        is not searched; of the routes hidden there behind covering ones, only those hidden
        behind a known one can match, and only they are tried (some known ids may be gone
        since). ``exact``: ``Matches.found`` says, per neighbour, which of its subscriptions
        ``pub`` matches (``pub`` conforms to ``tree``'s advertisement: those are all it may
        match there)."""
        matched: Sequence[str]
        if known is None:
            result = self.network.match(pub) if composites else self.network.peek(pub)
            matched, activations = result.conditions, result.activations
        else:
            matched, activations = self._uncovered(pub, (source, tree or ""), known), []
            self.trusted += 1
        clients: dict[str, list[str]] = {}
        crowded: list[str] = []
        durables: list[Route] = []
        watches: list[str] = []
        hops: set[str] = set()
        found: dict[str, list[str]] | None = {} if exact else None
        routes = self._routes
        client, durable, history = Sink.CLIENT, Sink.DURABLE, Sink.HISTORY  # as locals: faster
        skipped = self._scoped if self._scoped and source in self.brokers else None
        conditions: Iterable[str] = matched
        in_group = self._members.group_of
        if in_group:  # each group once, in place of its members
            conditions = dict.fromkeys(map(in_group.get, matched, matched))
        elif known is not None:
            conditions = dict.fromkeys(matched)  # a hidden route may be among the known
        groups = self._groups
        for sid in conditions:
            route = routes.get(sid)
            if route is None:
                group = groups.get(sid)
                if group is None:
                    continue  # withdrawn since the neighbour matched it
                route = group[0]
            if skipped is not None and sid in skipped:
                continue  # a local subscription: the publication comes from a neighbour
            sink = route.sink
            if sink is client:
                owner, notify_as = route.owner, route.notify_as
                if notify_as is not None and owner is not None:
                    ids = clients.get(owner)
                    if ids is None:
                        clients[owner] = [notify_as]
                    else:
                        if len(ids) == 1:
                            crowded.append(owner)
                        ids.append(notify_as)
            elif sink is durable:
                durables.append(route)
            elif sink is history:
                watches.append(sid)
            arrivals = route.arrivals  # from neighbours: where it goes down ``tree``
            if tree is None or not arrivals or (found is None and arrivals.keys() <= hops):
                continue
            for hop, trees in arrivals.items():
                if tree in trees:
                    hops.add(hop)
                    if found is not None:
                        found.setdefault(hop, []).append(sid)
        hops.discard(source)
        ranked = self._ranked
        for owner in crowded:  # in priority order, ties in the order they were made
            if owner in ranked:
                orders = self._orders[owner]
                clients[owner].sort(key=lambda ident: orders.get(ident, 0))
        if len(durables) > 1:
            durables.sort(key=_ORDER)
        if not (clients or durables or watches or hops) and source in self.brokers:
            # Nothing here wants it, unless a part of a composite subscription does.
            self.unwanted += not any(
                route.sink is not None for sid in matched if (route := routes.get(sid))
            )
        return Matches(clients, [r.id for r in durables], watches, hops, activations, found)

    # -- internals ---------------------------------------------------------------------------

    def _uncovered(self, pub: Publication, slot: Slot, known: Sequence[str]) -> Sequence[str]:
        """``known``, and the routes hidden at ``slot`` behind them that ``pub`` matches (a
        hidden route is matched only where the one covering it is); ``known`` itself when
        none is."""
        tried = self._tried.get(slot)
        if tried is None:
            tried = self._tried[slot] = {}
        matched: list[str] | None = None
        for sid in known:
            behind = tried.get(sid)
            if behind is None:
                behind = tried[sid] = self._behind(sid, slot)
            for hidden, tests in behind:
                if passes(tests, pub):
                    if matched is None:
                        matched = list(known)
                    matched.append(hidden)
        return known if matched is None else matched

    def _behind(self, sid: str, slot: Slot) -> tuple[tuple[str, Checks], ...]:
        """The routes hidden at ``slot`` behind route ``sid`` that may need trying, with the
        tests of their filters: not the members hidden in their group, whose group's matched
        members stand for them."""
        route = self._routes.get(sid)
        hidden = () if route is None else route.hides.get(slot, ())
        return tuple(
            (h, checks(self._routes[h].sub.filter)) for h in hidden if h not in self._unmatched
        )

    def _insert(self, route: Route) -> None:
        self._routes[route.id] = route
        if route.id not in self._unmatched:
            self.network.add(route.id, to_conjunction(route.sub.filter))

    def _watch(self, route: Route, trees: Iterable[str]) -> None:
        for t in trees:
            self._on_tree.setdefault(t, set()).add(route.id)

    @staticmethod
    def _involved(route: Route, tree_id: str) -> bool:
        return tree_id in route.trees or any(tree_id in ts for ts in route.arrivals.values())

    def _wanted(self, route: Route) -> set[Slot]:
        trees = set(route.trees)
        for hop, ts in route.arrivals.items():
            for t in ts:
                if t not in trees and (tree := self.trees.get(t)) and tree.parent != hop:
                    trees.add(t)  # not back up to the parent it came from
        out: set[Slot] = set()
        for t in trees:
            tree = self.trees.get(t)
            if tree is None:
                continue
            if tree.parent in self.brokers:
                out.add((tree.parent, t))
            for hop in tree.held:  # a former parent that stopped answering: kept for now
                if hop in self.brokers:
                    out.add((hop, t))
        return out

    def _refresh(self, route: Route) -> list[Out]:
        """Bring the route's forwarding in line with what it wants now; drop it when unused."""
        if self._tried:
            self._tried = {}
        wanted = self._wanted(route)
        out: list[Out] = []
        for slot in sorted(route.sent - wanted):
            out += self._unsend(route, slot)
        for slot in [s for s in route.hidden_by if s not in wanted]:
            self._unhide(route, slot)
        additions: list[Out] = []
        for slot in sorted(wanted - route.sent - route.hidden_by.keys()):
            additions += self._place(route, slot)
        out += _batched(additions)
        if route.sink is None and not route.arrivals:
            self._drop(route)
        return out

    def _drop(self, route: Route) -> None:
        del self._routes[route.id]
        if route.id in self._unmatched:
            self._unmatched.discard(route.id)
        else:
            self.network.remove(route.id)

    def _place(self, route: Route, slot: Slot) -> list[Out]:
        """Forward ``route`` to ``slot``, or hide it behind a subscription covering it there."""
        if self.covering is not Covering.OFF:
            coverer = self._coverer(route, slot)
            if coverer is not None:
                route.hidden_by[slot] = coverer.id
                coverer.hides.setdefault(slot, set()).add(route.id)
                return []
        route.sent.add(slot)
        flt = route.sub.filter
        self._sent_at.setdefault(slot, {}).setdefault(eq_key(flt), {}).setdefault(flt, {})[
            route.id
        ] = None
        out = self.mergers.send(slot, route.sub)
        if self.covering is Covering.ACTIVE:
            for other in self._covered_by(route, slot):
                self._unindex(other, slot)
                moved = other.hides.pop(slot, set())
                for sid in moved:
                    self._routes[sid].hidden_by[slot] = route.id
                route.hides.setdefault(slot, set()).update(moved | {other.id})
                other.hidden_by[slot] = route.id
                out += self.mergers.withdraw(slot, other.id)
        return out

    def _unsend(self, route: Route, slot: Slot) -> list[Out]:
        """Withdraw ``route`` from ``slot``, placing what it hid there first."""
        self._unindex(route, slot)
        out: list[Out] = []
        for sid in sorted(route.hides.pop(slot, set())):
            hidden = self._routes[sid]
            del hidden.hidden_by[slot]
            if slot in self._wanted(hidden):  # not when it is leaving too
                out += self._place(hidden, slot)
        return out + self.mergers.withdraw(slot, route.id)

    def _unhide(self, route: Route, slot: Slot) -> None:
        coverer = self._routes[route.hidden_by.pop(slot)]
        coverer.hides[slot].discard(route.id)
        if not coverer.hides[slot]:
            del coverer.hides[slot]

    def _unindex(self, route: Route, slot: Slot) -> None:
        route.sent.discard(slot)
        flt = route.sub.filter
        key = eq_key(flt)
        by_key = self._sent_at[slot]
        by_filter = by_key[key]
        same = by_filter[flt]
        del same[route.id]
        if not same:
            del by_filter[flt]
            if not by_filter:
                del by_key[key]
                if not by_key:
                    del self._sent_at[slot]

    def _forget_slots(self, route: Route, gone: Callable[[Slot], bool]) -> None:
        """Forget slots that no longer exist (their neighbour or tree is gone): nothing to send."""
        if self._tried:
            self._tried = {}
        for slot in [s for s in route.sent if gone(s)]:
            self._unindex(route, slot)
            self.mergers.forget(slot, route.id)
            for sid in route.hides.pop(slot, set()):
                self._routes[sid].hidden_by.pop(slot, None)
        for slot in [s for s in route.hidden_by if gone(s)]:
            self._unhide(route, slot)

    def _coverer(self, route: Route, slot: Slot) -> Route | None:
        """A subscription forwarded to ``slot`` that covers ``route``'s, if one is found."""
        sids = covering(self._sent_at.get(slot, {}), route.sub.filter, COVER_SCAN)
        return None if sids is None else self._routes[next(iter(sids))]

    def _covered_by(self, route: Route, slot: Slot) -> list[Route]:
        """Subscriptions forwarded to ``slot`` that ``route`` covers (among a bounded few)."""
        mine = route.sub.filter
        key = eq_key(mine)
        others = (
            (flt, sids)
            for other_key, by_filter in self._sent_at.get(slot, {}).items()
            if key <= other_key
            for flt, sids in by_filter.items()
            if flt != mine
        )
        return [
            self._routes[sid]
            for flt, sids in islice(others, COVER_SCAN)
            if covers(mine, flt)
            for sid in sids
        ]


_RANKS: Final = (1 << 64) - 1
"""The bits of ``Route.order`` that hold the order a route was made in."""
_ORDER: Final = attrgetter("order")


def _order(priority: int, rank: int) -> int:
    """The ``Route.order`` of a route of ``priority``, the ``rank``-th made: higher priority
    first, then the one made first (one integer: sorting by it is one comparison)."""
    return (MAX_PRIORITY - priority) << 64 | rank


def _batched(outs: list[Out]) -> list[Out]:
    """Merge one subscription's consecutive subscribes to one hop into one message."""
    merged: list[Out] = []
    for hop, msg in outs:
        if merged and isinstance(msg, RouteSubscribe):
            last_hop, last = merged[-1]
            if (
                last_hop == hop
                and isinstance(last, RouteSubscribe)
                and last.subscription.id == msg.subscription.id
            ):
                merged[-1] = (hop, RouteSubscribe(msg.subscription, last.trees + msg.trees))
                continue
        merged.append((hop, msg))
    return merged
