"""Advertising: the advertisements made at a broker, and the trees they flood along.

A client's advertisement floods the overlay (``RouteAdvertise``) along a tree rooted at its
broker (``trees``), unless an advertisement made there already covers it: it then joins that
one's tree unflooded, and is flooded in it when its cover is withdrawn. A database's replay
offer floods the same way, into the trees of offers (``Broker.archives``). The client's ``ok``
comes once the flood has settled (``echoes``).

With merging on (``BrokerConfig.merging``), an advertisement neither covered nor covering
may merge with advertisements made here before, as subscriptions do
(``padres.matching.merging``): they join the tree of the one they merge with, and one
advertisement of an id of its own, matching what they all match, is flooded in it, then the
ones it stands for are withdrawn from the flood. When one of them is withdrawn, the others
merge again and are flooded anew (under new ids: a withdrawn id is remembered, and ignored,
for a while) before the merged one is withdrawn. The tree, and every route along it, stays.

An advertisement from a neighbour is kept from its tree's parent only, and flooded on; a copy
from another neighbour is that neighbour's offer of another way to the root (``paths``). A
withdrawn one is remembered for ``BrokerConfig.memory`` seconds, so that a late copy still
travelling a longer path of a cyclic overlay is not taken for a new one. A lost link, or a
parent that lost a tree, moves the tree to another feasible way if one is offered (``paths``);
else the tree is withdrawn from the neighbours as lost, and one that still reaches it by
another way offers it back.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import islice

from padres.broker.durable import Durables
from padres.broker.echoes import Echoes
from padres.broker.history import History
from padres.broker.journal import Journal
from padres.broker.merging import MERGE_SCAN, MOST_MEMBERS
from padres.broker.paths import CEILING, Paths
from padres.broker.routes import COVER_SCAN, Covering, Out, Routes
from padres.broker.session import LocalAdvertisement, Session
from padres.broker.transactions import Transactions
from padres.broker.trees import Tree, Trees
from padres.matching.matcher import conforms
from padres.matching.merging import Merged, group, merge
from padres.matching.relations import covers
from padres.model.messages import Advertisement, Filter, Unadvertise
from padres.model.protocol import Error, Ok, ReplayOffer, RouteAdvertise, RouteUnadvertise

__all__ = ["Advertising"]


@dataclass(eq=False)
class _Merged:
    """An advertisement flooded for several made here (or one, once the others have gone)."""

    filter: Filter
    tree: str
    members: set[str]
    useful: float


class Advertising:
    """A broker's advertisement trees: those of its clients' advertisements and replay
    offers, which it floods, and those its neighbours flooded to it."""

    def __init__(
        self,
        broker_id: str,
        trees: Trees,
        archives: Trees,
        routes: Routes,
        echoes: Echoes,
        journal: Journal,
        durables: Durables,
        transactions: Transactions,
        history: History,
        paths: Paths,
        peers: Mapping[str, str],
        tagged: Callable[[list[Out]], list[Out]],
        new_id: Callable[[], str],
        memory: float,
    ) -> None:
        """``archives``: the trees of replay offers; ``peers``: the neighbour brokers by hop
        (read, never changed); ``tagged``: the messages given, routing messages to neighbours
        with their echo tokens; ``new_id``: a new overlay-wide id; ``memory``: seconds a
        withdrawn advertisement's id is remembered."""
        self.id = broker_id
        self.trees = trees
        self.archives = archives
        self.routes = routes
        self.echoes = echoes
        self.journal = journal
        self.durables = durables
        self.transactions = transactions
        self.history = history
        self.paths = paths
        self._peers = peers
        self._tagged = tagged
        self._new_id = new_id
        self._memory = memory
        self._local: dict[str, LocalAdvertisement] = {}
        """The advertisements made here, by overlay-wide id."""
        self._merged: dict[str, _Merged] = {}
        """The merged advertisements flooded for them (their members are hidden by them)."""
        self._offers: dict[str, str] = {}
        """Replay offers made here: id -> the offering client's hop."""
        self._withdrawn: dict[str, float] = {}
        """Withdrawn advertisements' ids -> when they were withdrawn."""
        self._withdrawals: deque[tuple[float, str]] = deque()
        """The same, oldest first."""

    def __len__(self) -> int:
        """How many advertisements were made here (replay offers are in ``archives``), and
        merged ones flooded for them."""
        return len(self._local) + len(self._merged)

    def expire(self, now: float) -> None:
        """Forget the withdrawn advertisements remembered for longer than ``memory``."""
        while self._withdrawals and self._withdrawals[0][0] < now - self._memory:
            self._withdrawn.pop(self._withdrawals.popleft()[1], None)

    # -- clients -----------------------------------------------------------------------------

    def advertise(self, adv: Advertisement, session: Session) -> list[Out]:
        if adv.id in session.advertisements:
            return [(session.hop, Error(f"advertisement {adv.id!r} already exists", adv.id))]
        # Each advertising gets an id of its own (a withdrawn one is not taken again), but an
        # advertisement made again by the same publisher keeps its tree: positions in the
        # journal stay meaningful to the durable subscriptions that follow it, and what they
        # were recovering when the publisher left is asked for again when it is back.
        gid = self._new_id()
        tree_id = self.journal.tree_of(session.name, adv.id) or gid
        session.advertised(adv, gid)
        self.journal.remember_tree(session.name, adv.id, tree_id)
        mine = Advertisement(gid, adv.filter)
        hider = self._local_coverer(mine)
        partner = None if hider is not None else self._merge_partner(mine)
        out: list[Out] = []
        if partner is not None:
            other, merged = partner
            tree = self._home(other).id
            self._local[gid] = LocalAdvertisement(session.hop, tree)
            self.trees.add(mine, tree, session.hop, (self.id,))
            hider, flood = self._merge_with(other, gid, merged)
            out += flood
        elif hider is None:
            self._local[gid] = LocalAdvertisement(session.hop, tree_id)
            self.trees.add(mine, tree_id, session.hop, (self.id,))
            out += self._flood(RouteAdvertise(mine, tree_id, (self.id,)))
        elif hider in self._merged:
            joined = self._merged[hider]
            joined.members.add(gid)
            self._local[gid] = LocalAdvertisement(session.hop, joined.tree, hidden_by=hider)
            self.trees.add(mine, joined.tree, session.hop, (self.id,))
        else:
            tree = self._local[hider].tree
            self._local[gid] = LocalAdvertisement(session.hop, tree, hidden_by=hider)
            self._local[hider].hides.add(gid)
            self.trees.add(mine, tree, session.hop, (self.id,))
        out = self._tagged(out + self.routes.tree_grew(self._local[gid].tree, adv.filter))
        tokens = self._flood_tokens(hider or gid)
        return out + self.echoes.ok(tokens, session.hop, adv.id)

    def _home(self, flooded: str) -> Tree:
        """The tree of an advertisement flooded from here, merged or not."""
        merged = self._merged.get(flooded)
        return self.trees.holding(flooded if merged is None else next(iter(merged.members)))

    def _merge_partner(self, adv: Advertisement) -> tuple[str, Merged] | None:
        """An advertisement flooded from here (merged or not) that ``adv`` merges with, and
        their merge: a perfect one first, else the one with the fewest false positives."""
        settings = self.routes.mergers.settings
        if not settings.enabled:
            return None
        best: tuple[str, Merged] | None = None
        for flooded, flt, useful, size in self._flooded_here(adv.filter.class_name):
            if size >= MOST_MEMBERS:
                continue
            merged = merge(flt, adv.filter, (useful, 1.0), settings.imperfect)
            if merged is not None and (best is None or merged.useful > best[1].useful):
                best = (flooded, merged)
                if merged.useful >= 1.0:
                    break
        return best

    def _flooded_here(self, class_name: str) -> Iterable[tuple[str, Filter, float, int]]:
        """The advertisements of ``class_name`` flooded from here, merged ones first, the
        latest first: id, filter, useful share (``padres.matching.merging.Merged``) and
        members. The search is bounded, as covering's is: a merge missed only leaves the
        overlay one more advertisement to hold."""
        merged = [
            (mid, m.filter, m.useful, len(m.members))
            for mid, m in islice(reversed(self._merged.items()), MERGE_SCAN)
            if m.filter.class_name == class_name
        ]
        plain = [
            (gid, adv.filter, 1.0, 1 + len(local.hides))
            for gid, local in islice(reversed(self._local.items()), MERGE_SCAN)
            if local.hidden_by is None
            and (adv := self.trees.holding(gid).advertisements[gid]).filter.class_name == class_name
        ]
        return merged + plain

    def _merge_with(self, flooded: str, gid: str, merged: Merged) -> tuple[str, list[Out]]:
        """The new local advertisement ``gid`` merged with the one flooded as ``flooded``
        (merged or not): the merged one is flooded, then ``flooded`` withdrawn. Returns the
        merged one's id, and the floods."""
        tree = self._home(flooded)
        old = self._merged.get(flooded)
        if old is not None and old.filter == merged.filter:  # it matches no more than before
            old.members.add(gid)
            self._local[gid].hidden_by = flooded
            return flooded, []
        if old is not None:
            del self._merged[flooded]
            members = old.members
        else:
            local = self._local[flooded]
            members = {flooded, *local.hides}  # what it covered, it merges for
            local.hides = set()
        members.add(gid)
        mid = self._new_id()
        self._merged[mid] = _Merged(merged.filter, tree.id, members, merged.useful)
        for member in members:
            self._local[member].hidden_by = mid
        out = self._flood(RouteAdvertise(Advertisement(mid, merged.filter), tree.id, tree.path))
        return mid, out + self._flood(RouteUnadvertise(flooded, tree.id))

    def _local_coverer(self, adv: Advertisement) -> str | None:
        """A flooded advertisement made here that covers ``adv``: a merged one, or one
        flooded as itself."""
        if self.routes.covering is Covering.OFF:
            return None
        # Only one of the same class can cover it; covering saves routing state but is never
        # needed, so the search is bounded: advertising stays linear in the advertisements.
        for mid, merged in islice(self._merged.items(), COVER_SCAN):
            if len(merged.members) < MOST_MEMBERS and covers(merged.filter, adv.filter):
                return mid
        for gid in islice(self.trees.of_class(adv.filter.class_name), COVER_SCAN):
            local = self._local.get(gid)
            if local is not None and local.hidden_by is None:
                tree = self.trees.get(local.tree)
                if tree is not None and covers(tree.advertisements[gid].filter, adv.filter):
                    return gid
        return None

    def unadvertise(self, unadv: Unadvertise, session: Session, now: float) -> list[Out]:
        aid = unadv.advertisement_id
        held = session.advertisements.get(aid)
        bound = None if held is None else self._bound(held)
        if bound is not None:
            why = f"advertisement {aid!r} cannot be withdrawn now: {bound}"
            return [(session.hop, Error(why, aid))]
        gid = session.unadvertised(aid)
        if gid is None:
            return [(session.hop, Error(f"no advertisement {aid!r}", aid))]
        self.journal.forget_tree(session.name, aid)
        return [*self.withdraw(gid, now), (session.hop, Ok(aid))]

    def offers_from(self, hop: str) -> bool:
        """Whether the client on ``hop`` has a replay offer standing."""
        return hop in self._offers.values()

    def offer(self, offer: ReplayOffer, session: Session) -> list[Out]:
        adv = offer.advertisement
        if adv.id in session.advertisements:
            return [(session.hop, Error(f"advertisement {adv.id!r} already exists", adv.id))]
        gid = session.advertisements[adv.id] = self._new_id()
        self._offers[gid] = session.hop
        tree = self.archives.add(
            Advertisement(gid, adv.filter), gid, session.hop, (self.id,), session.name, offer.period
        )
        out = self._tagged(self._offer_tree(tree))
        tokens = self._flood_tokens(gid)
        return out + self.echoes.ok(tokens, session.hop, adv.id)

    def withdraw(self, gid: str, now: float) -> list[Out]:
        """Withdraw a local advertisement; the ones it hid are flooded (in its tree) first."""
        if self._offers.pop(gid, None) is not None:
            self.archives.remove(gid)
            self._forget(gid, now)
            return self._flood(RouteUnadvertise(gid, gid))
        out = self._strand(gid)
        local = self._local.pop(gid)
        if local.hidden_by in self._merged:
            out += self._unmerge(local.hidden_by, gid)
        elif local.hidden_by is not None:
            self._local[local.hidden_by].hides.discard(gid)
        else:
            tree = self.trees.holding(gid)
            for hidden in sorted(local.hides):
                self._local[hidden].hidden_by = None
                adv = tree.advertisements[hidden]
                out += self._flood(_copy(adv, tree))
            out += self._flood(RouteUnadvertise(gid, local.tree))
        self._forget(gid, now)
        self.trees.remove(gid)
        return out + self.routes.tree_shrank(local.tree)

    def _bound(self, gid: str) -> str | None:
        """Why the local advertisement ``gid`` cannot be withdrawn now: a prepared part of a
        transaction needs its tree (``Transactions.bound``); None if it can."""
        if gid in self._offers:
            return None
        tree = self.trees.holding(gid)
        rest = [a.filter for aid, a in tree.advertisements.items() if aid != gid]
        return self.transactions.bound(tree.id, lambda pub: any(conforms(flt, pub) for flt in rest))

    def _unmerge(self, mid: str, gid: str) -> list[Out]:
        """``gid`` leaves the merged advertisement ``mid``: the others are merged again and
        flooded, under new ids, before ``mid`` is withdrawn (unless they make the same
        filter)."""
        merged = self._merged[mid]
        merged.members.discard(gid)
        tree = self.trees.holding(gid)
        flood: list[Out] = []
        if merged.members:
            groups = group(
                ((m, tree.advertisements[m].filter) for m in sorted(merged.members)),
                self.routes.mergers.settings.imperfect,
                scan=MERGE_SCAN,
                most=MOST_MEMBERS,
            )
            if len(groups) == 1 and groups[0].filter == merged.filter:
                merged.useful = groups[0].useful
                return []
            for g in groups:
                nid = self._new_id()
                self._merged[nid] = _Merged(g.filter, tree.id, set(g.members), g.useful)
                for member in g.members:
                    self._local[member].hidden_by = nid
                adv = Advertisement(nid, g.filter)
                flood += self._flood(RouteAdvertise(adv, tree.id, tree.path))
        del self._merged[mid]
        return flood + self._flood(RouteUnadvertise(mid, tree.id))

    def _strand(self, gid: str) -> list[Out]:
        """Abort the open transactions that hold a publication only the local advertisement
        ``gid`` takes down its tree: once it is withdrawn, their commit would go nowhere."""
        tree = self.trees.holding(gid)
        rest = [a.filter for aid, a in tree.advertisements.items() if aid != gid]
        return self.transactions.withdrawing(
            tree.id, lambda pub: any(conforms(flt, pub) for flt in rest)
        )

    # -- neighbours --------------------------------------------------------------------------

    def arrive(self, message: RouteAdvertise, hop: str, now: float) -> list[Out]:
        """An advertisement flooded by the neighbour on ``hop``: kept and flooded on if it
        comes from its tree's parent, else taken as an offer of another way; the echo goes
        back once the flood below has settled."""
        # Durable subscriptions ask for what they missed before the echo goes back.
        out = self._tagged(self._arrive(message, hop, now) + self.durables.sync())
        if not message.echo:
            return out
        # Wait only for the flood below a copy from the tree's parent: waiting on copies that
        # crossed a cycle could wait in a circle.
        tree = self._tree_of(message.advertisement.id)
        below = tree is not None and tree.parent == hop
        tokens = self._flood_tokens(message.advertisement.id) if below else set()
        return out + self.echoes.relay(tokens, hop, message.echo)

    def _arrive(self, message: RouteAdvertise, hop: str, now: float) -> list[Out]:
        adv = message.advertisement
        trees = self.archives if message.replay else self.trees
        tree = trees.get(message.tree)
        if tree is not None and tree.parent != hop:
            # The copy from the tree's parent is the one that counts; this one offers a way.
            return [] if message.replay else self.paths.offered(tree, message, hop, now)
        if self.id in message.path or adv.id in self._withdrawn or self._tree_of(adv.id):
            return []
        path = (*message.path, self.id)
        fresh = tree is None
        tree = trees.add(adv, message.tree, hop, path, message.replay, message.period)
        if fresh and not message.replay:
            self.paths.arrived(tree, message, hop)
        self.history.tree_found(tree)
        out = self._flood(_copy(adv, tree), hop)
        if message.replay:
            return out
        return out + self.routes.tree_grew(tree.id, adv.filter)

    def depart(self, message: RouteUnadvertise, hop: str, now: float) -> list[Out]:
        """An advertisement withdrawn by the neighbour on ``hop``."""
        tree = self._tree_of(message.advertisement_id)
        if tree is None:
            return []
        if tree.parent != hop:
            if message.lost and not tree.replay:
                self.paths.withdrawn(tree, hop, now)
            if message.lost and self._peers[hop] not in tree.path:
                # The neighbour lost the tree with a failed link; it can have it through us.
                return self._offer_tree(tree, hop)
            return []
        if message.lost and not tree.replay:
            moved = self.paths.parent_lost(tree, now)
            if moved is not None:  # kept, along another way; the parent may have it back
                self._found_again(tree)
                return moved + self._offer_tree(tree, hop)
            self.history.tree_lost(tree)
        (self.archives if tree.replay else self.trees).remove(message.advertisement_id)
        if not message.lost:
            self._forget(message.advertisement_id, now)
        out = self._flood(message, hop)
        return out if tree.replay else out + self.routes.tree_shrank(tree.id)

    def link_opened(self, hop: str, name: str) -> list[Out]:
        """The trees the new neighbour ``name`` on ``hop`` does not have, offered to it."""
        out: list[Out] = []
        for tree in [*self.trees, *self.archives]:
            if tree.parent != hop and name not in tree.path:
                out += self._offer_tree(tree, hop)
        return out

    def link_lost(self, hop: str, now: float) -> list[Out]:
        """The link on ``hop`` is gone: the trees it was the parent of move to another
        feasible way if one is offered (``paths``); the others are withdrawn from the other
        neighbours, as lost (one that still reaches them by another path offers them back)."""
        out, kept = self.paths.link_lost(hop, now)
        for tree in kept:
            self._found_again(tree)
        for trees in (self.trees, self.archives):
            for tree in trees:
                if tree.parent == hop:
                    if trees is self.trees:
                        self.history.tree_lost(tree)
                    for aid in list(tree.advertisements):
                        trees.remove(aid)
                        out += self._flood(RouteUnadvertise(aid, tree.id, lost=True), hop)
                    if trees is self.trees:
                        out += self.routes.tree_shrank(tree.id)
        return out

    # -- internals ---------------------------------------------------------------------------

    def _tree_of(self, advertisement_id: str) -> Tree | None:
        return self.trees.tree_of(advertisement_id) or self.archives.tree_of(advertisement_id)

    def _forget(self, advertisement_id: str, now: float) -> None:
        self._withdrawn[advertisement_id] = now
        self._withdrawals.append((now, advertisement_id))

    def _found_again(self, tree: Tree) -> None:
        """``tree`` moved to another way after its parent's: what was on its way along the
        old one is lost, and the hybrid subscriptions following it ask for it again."""
        self.history.tree_lost(tree)
        self.history.tree_found(tree)

    def _offer_tree(self, tree: Tree, hop: str | None = None) -> list[Out]:
        """The tree's advertisements, to ``hop`` or flooded to every neighbour."""
        out: list[Out] = []
        for adv in self._flooded(tree):
            message = _copy(adv, tree)
            out += [(hop, message)] if hop is not None else self._flood(message)
        return out

    def _flooded(self, tree: Tree) -> Iterable[Advertisement]:
        """The tree's advertisements that went out (not those hidden here by covering, or
        merged: the merged ones instead)."""
        for aid, adv in tree.advertisements.items():
            local = self._local.get(aid)
            if local is None or local.hidden_by is None:
                yield adv
        for mid, merged in self._merged.items():
            if merged.tree == tree.id:
                yield Advertisement(mid, merged.filter)

    def _flood(self, message: RouteAdvertise | RouteUnadvertise, source: str = "") -> list[Out]:
        path = message.path if isinstance(message, RouteAdvertise) else ()
        peers = self._peers.items()
        return [(hop, message) for hop, name in peers if hop != source and name not in path]

    def _flood_tokens(self, advertisement_id: str) -> set[str]:
        """The echoes an advertisement's flood still waits for."""
        pending = (self.echoes.pending((advertisement_id, hop)) for hop in self._peers)
        return {token for token in pending if token is not None}


def _copy(adv: Advertisement, tree: Tree) -> RouteAdvertise:
    """``adv`` as this broker floods or offers it, with its way to the tree's root."""
    return RouteAdvertise(
        adv,
        tree.id,
        tree.path,
        tree.replay,
        period=tree.period,
        version=tree.version,
        cost=min(tree.cost, CEILING),
    )
