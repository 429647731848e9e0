"""Adaptive paths: each broker takes, for each tree, the better of the ways its neighbours offer
to the tree's root, measured, and moves to another when its parent stops answering or is
clearly slower.

The runtime measures every link to a neighbour (``LinkState``: a one-way cost in seconds from
pings that wait in the send queues, and whether the neighbour's answer is overdue: *suspect*)
and hands the measures to ``Broker.measured``. A broker's cost to a tree's root is its
parent's, as the parent said, plus its link to the parent; it tells its neighbours its path,
version and cost (``RouteAdvertise`` when the tree arrives, ``RoutePath`` when they change,
the cost only when it changed by much), and keeps what each neighbour told it (``Offer``).

A broker moves the tree to another parent (``_move``) when its parent is suspect or
unreachable (at once), or when another way is clearly cheaper: ``Switching.ratio`` times and
``Switching.gain`` seconds cheaper, at most once per ``Switching.hold`` seconds. Moving:

- its subscriptions for the tree are sent to the new parent (``Routes.tree_moved``) and kept
  at the old one (``Tree.held``) until they have settled along the new way (their echoes are
  back: every publication the root sends from then on takes it) ``Switching.hold`` seconds
  ago (what the root sent before may still be on its way along the old one), and the old
  parent has been answering for as long (one that stopped answering may still hold
  publications from before). Then they are withdrawn from the old parent, which is asked to
  say when it has handled that (``RouteDrain``). Until it has, the tree's plain publications
  are taken from both, the second copy of each dropped by identity (``accepts``, which also
  remembers them for a few seconds before a move): none sent along either way is lost, none
  is taken twice, as long as the brokers on the old way do not move meanwhile;
- its new path goes to every neighbour (``RoutePath``): those below follow, the others update
  their offer;
- guaranteed publications are taken from the parent only, and the durable subscriptions
  following the tree here and below ask its root again for what they may have missed
  (``Durables.resync``, on the path's change), behind their subscriptions along the new way:
  what only the old way carried is in the answer, which comes down the new way ahead of
  what the root sends after it, so guaranteed publications stay exactly once and in order.

Loops are never made, whatever the timing of the messages (the feasibility condition of
distance-vector protocols such as Babel, RFC 8966, on the number of brokers to the root): a
broker takes a neighbour as its parent only if the neighbour's path does not hold it and the
neighbour is *feasible*, its version of the tree newer, or the same and its path shorter than
the shortest this broker has had at that version (``Tree.feasible``). Along every parent link
the version grows or the feasibility distance shrinks toward the root, so no chain of parents
closes on itself. A broker whose only other ways are not feasible while its parent is unusable
asks the root for a newer version (``RouteVersion``, along a neighbour's parents): the root
raises it and says so down the tree, and every way is feasible again.

Costs: an offer per tree per neighbour; a ``RoutePath`` per tree to each neighbour when a
path changes (its subtree follows); per move, the tree's subscriptions sent again and a
recovery per durable subscription below; the identities of publications on trees with other
ways (``RECENT``, ``SEEN``: bounded); the runtime's pings (``padres.runtime.probe``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from padres.broker.durable import Durables
from padres.broker.echoes import Echoes
from padres.broker.routes import Out, Routes
from padres.broker.trees import SEEN, Offer, Seen, Tree, Trees
from padres.model.protocol import (
    RouteAdvertise,
    RouteDrain,
    RoutePath,
    RoutePublish,
    RouteTxPublish,
    RouteVersion,
)

__all__ = ["CEILING", "LinkState", "Paths", "Switching"]

CEILING: Final = 3600.0
"""The cost of a way that carries nothing (its parent or a link on it stopped answering)."""
SEEN_FOR: Final = 5.0
"""Seconds the publications of a tree are still told apart by identity once it has moved and
its former parents have drained: a copy along the slower way may still come."""
RECENT: Final = 50_000
"""Publications a broker remembers by identity, at most, across the trees that have other
ways to their roots: a copy of one taken just before a move may come by the new way."""
RECENT_FOR: Final = 5.0
"""Seconds such a publication is remembered."""
ASK_EVERY: Final = 1.0
"""Seconds between two requests for a newer version of one tree, from one broker."""
SIGNIFICANT: Final = 0.25
"""A cost that changed by this fraction (and by ``NOTICED`` seconds) is told to neighbours."""
NOTICED: Final = 0.005
"""Seconds a cost must change by, at least, to be told or to count as a change of a link."""


@dataclass(frozen=True, slots=True)
class LinkState:
    """A link to a neighbour as the runtime measured it."""

    cost: float = 0.0
    """What a message pays to cross it, in seconds: half the ping's smoothed round trip, which
    waits in the send queues of both sides."""
    suspect: bool = False
    """The neighbour's answer to a ping is overdue: it carries nothing now, although the
    link is open."""


@dataclass(frozen=True, slots=True)
class Switching:
    """When a broker moves a tree to another parent (``BrokerConfig.switching``)."""

    adaptive: bool = True
    """Move trees to the better ways as links are measured; off: a tree keeps its parent until
    the link to it is lost."""
    ratio: float = 2.0
    """Another way is taken when the parent's costs this many times more, and more by the
    gain; a parent that stopped answering is left for any way that carries something."""
    gain: float = 0.05
    """Seconds another way must save, at least, to be taken instead of a parent that answers."""
    hold: float = 2.0
    """Seconds a tree keeps a parent it moved to before it moves again for a cost (not for a
    parent that stopped answering)."""


class Paths:
    """A broker's ways to the roots of its trees, and its moves between them."""

    def __init__(
        self,
        broker_id: str,
        trees: Trees,
        routes: Routes,
        durables: Durables,
        echoes: Echoes,
        peers: Mapping[str, str],
        new_id: Callable[[], str],
        switching: Switching,
    ) -> None:
        """``peers``: the neighbour brokers by hop (read, never changed)."""
        self.id = broker_id
        self.trees = trees
        self.routes = routes
        self.durables = durables
        self.echoes = echoes
        self.switching = switching
        self._peers = peers
        self._new_id = new_id
        self.links: dict[str, LinkState] = {}
        """The latest measures of the links to neighbours, by hop."""
        self._used: dict[str, LinkState] = {}
        """The measures the trees were last weighed with."""
        self._asked: dict[str, tuple[int, float]] = {}
        """Per tree, the version this broker last asked its root to pass, and when."""
        self._since: dict[str, float] = {}
        """Per neighbour that answers, since when it has (this broker's time)."""
        self._holding: set[str] = set()
        """The trees with a former parent ``held``."""
        self._waiting: set[str] = set()
        """The trees with a clearly cheaper way they may take once their hold is over."""
        self._recent = Seen(RECENT, RECENT_FOR)
        """The publications taken lately down trees with other ways (``accepts``)."""
        self._moving = Seen(SEEN)
        """The publications taken down trees moving to other parents (``accepts``)."""
        self.moves = 0
        """How many times a tree moved to another parent here."""
        self.bumps = 0
        """How many times a tree rooted here got a newer version."""

    # -- what neighbours say -----------------------------------------------------------------

    def arrived(self, tree: Tree, message: RouteAdvertise, hop: str) -> None:
        """A new tree, from its first copy (``hop`` is its parent): its version and cost."""
        tree.version = message.version
        tree.feasible = tree.depth
        tree.offers[hop] = Offer(message.path, message.version, message.cost)
        tree.cost = self._via(hop, tree.offers[hop])

    def offered(
        self, tree: Tree, message: RouteAdvertise | RoutePath, hop: str, now: float
    ) -> list[Out]:
        """A neighbour's way to the root of ``tree`` (not from its parent): kept, unless it
        goes through this broker, and weighed."""
        if self.id in message.path:
            tree.offers.pop(hop, None)
            return []
        tree.offers[hop] = Offer(message.path, message.version, message.cost)
        return self._weigh(tree, now)

    def withdrawn(self, tree: Tree, hop: str, now: float) -> None:
        """``hop`` lost ``tree``: it no longer offers it, and, a former parent still held, it
        forgot the subscriptions this broker kept there."""
        tree.offers.pop(hop, None)
        if hop in tree.held:
            tree.held.discard(hop)
            self.routes.forget(hop, tree.id)
        if tree.draining.pop(hop, None) is not None:
            self._drained(tree, now)

    def path(self, message: RoutePath, hop: str, now: float) -> list[Out]:
        """A neighbour's new way to the root of a tree: this broker's own, if it is the
        tree's parent (told on to the neighbours when it changed), else an offer."""
        tree = self.trees.get(message.tree)
        if tree is None or tree.parent not in self._peers:
            return []  # unknown here, or rooted here
        if hop != tree.parent:
            return self.offered(tree, message, hop, now)
        tree.offers[hop] = Offer(message.path, message.version, message.cost)
        path = (*message.path, self.id)
        moved = path != tree.path or message.version != tree.version
        if message.version > tree.version:
            tree.version, tree.feasible = message.version, len(path) - 1
        tree.path = path
        tree.feasible = min(tree.feasible, tree.depth)
        out: list[Out] = []
        if moved:
            self.durables.resync(tree.id)
            out += self._tell(tree)
        return out + self._weigh(tree, now, told=moved)

    def drain(self, message: RouteDrain, hop: str, now: float) -> list[Out]:
        """A neighbour that left this broker as its parent withdrew its subscriptions: the
        answer goes back behind every publication of the tree sent to it before. Or the
        answer to this broker's own request: the former parent is done with."""
        if not message.done:
            return [(hop, RouteDrain(message.tree, message.token, done=True))]
        tree = self.trees.get(message.tree)
        if tree is not None and tree.draining.get(hop) == message.token:
            del tree.draining[hop]
            self._drained(tree, now)
        return []

    def version(self, message: RouteVersion, hop: str, now: float) -> list[Out]:
        """A broker asks for a version of a tree newer than ``message.version``: the root
        raises it and tells every neighbour; another broker passes the request to its parent
        (once a second per tree)."""
        tree = self.trees.get(message.tree)
        if tree is None or message.version < tree.version:
            return []  # gone, or already newer
        if tree.parent not in self._peers:  # the root
            tree.version += 1
            self.bumps += 1
            return self._tell(tree)
        if hop == tree.parent:
            return []
        return self._ask(tree, tree.parent, message.version, now)

    # -- publications ------------------------------------------------------------------------

    def accepts(
        self, tree: Tree, hop: str, message: RoutePublish | RouteTxPublish, now: float
    ) -> bool:
        """Whether a publication coming down ``tree`` from ``hop`` is taken: from the tree's
        parent, or a former one not yet drained; the second copy of one is dropped while the
        tree moves, and for ``RECENT_FOR`` seconds on a tree that has other ways (a copy taken
        before a move may be on its way along the new one). One with a position in the root's
        journal (guaranteed) is taken from the parent only: the durable subscriptions here and
        below ask the root for what the move made them miss, and the answer comes along the
        parent's way, ahead of what follows it there."""
        if hop != tree.parent and (message.position > 0 or hop not in tree.draining):
            return False
        moving = bool(tree.draining) or now < tree.until
        if not moving and len(tree.offers) < 2:
            return True  # no other way: no second copy
        pub = message.publication
        key: tuple[str, ...] = (pub.publisher, pub.id)
        if isinstance(message, RouteTxPublish):  # each outcome of it is a publication of its own
            key += (message.outcome.value,)
        fresh = self._recent.first(key, now)
        if moving:
            fresh = self._moving.first(key, now) and fresh
        return fresh

    # -- measures and time -------------------------------------------------------------------

    def measured(self, states: Mapping[str, LinkState], now: float) -> list[Out]:
        """The runtime's latest measures of the links; the trees are weighed again when one
        changed by much (a neighbour became suspect or answered again, a cost moved)."""
        self.links = {hop: states[hop] for hop in states if hop in self._peers}
        for hop, state in self.links.items():
            if state.suspect:
                self._since.pop(hop, None)
            else:
                self._since.setdefault(hop, now)
        out = self._release(now)
        changed = [hop for hop, state in self.links.items() if _changed(self._used.get(hop), state)]
        if not changed:
            return out + self._held_over(now)
        self._used.update((hop, self.links[hop]) for hop in changed)
        self._waiting.clear()
        for tree in self.trees:
            if tree.parent in self._peers:
                out += self._weigh(tree, now)
        return out

    def tick(self, now: float) -> list[Out]:
        """Let go of former parents done with (``_release``), and move trees that waited for
        their hold to be over."""
        out = self._release(now) + self._held_over(now)
        for tid in [tid for tid in self._asked if self.trees.get(tid) is None]:
            del self._asked[tid]
        return out

    def link_lost(self, hop: str, now: float) -> tuple[list[Out], list[Tree]]:
        """The link on ``hop`` is gone: each tree it was the parent of moves to the best other
        feasible way, if there is one; returns what that sends and the trees kept (the others
        are lost, ``Advertising.link_lost``). What the link had not delivered is lost with it."""
        self.links.pop(hop, None)
        self._used.pop(hop, None)
        self._since.pop(hop, None)
        out: list[Out] = []
        kept: list[Tree] = []
        for tree in self.trees:
            tree.offers.pop(hop, None)
            tree.held.discard(hop)
            if tree.draining.pop(hop, None) is not None:
                self._drained(tree, now)
            if tree.parent != hop or not self.switching.adaptive:
                continue
            best = self._best(tree)
            if best is not None:
                out += self._move(tree, best[0], now, drain=False)
                kept.append(tree)
        return out, kept

    def parent_lost(self, tree: Tree, now: float) -> list[Out] | None:
        """``tree``'s parent lost it: what moving it to the best other feasible way sends, or
        None if there is none."""
        tree.offers.pop(tree.parent, None)
        if not self.switching.adaptive:
            return None
        best = self._best(tree)
        return None if best is None else self._move(tree, best[0], now, drain=False)

    def statistics(self, names: Mapping[str, str]) -> dict[str, object]:
        """The links as measured (by neighbour), how many trees come through each neighbour,
        how many are moving (a former parent not yet let go of), and the moves made."""
        parents = Counter(names[t.parent] for t in self.trees if t.parent in names)
        return {
            "parents": dict(sorted(parents.items())),
            "moving": sum(1 for t in self.trees if t.held or t.draining),
            "links": {
                names.get(hop, hop): {
                    "cost_ms": round(state.cost * 1000, 3),
                    "suspect": state.suspect,
                }
                for hop, state in sorted(self.links.items())
            },
            "moves": self.moves,
            "versions": self.bumps,
        }

    # -- internals ---------------------------------------------------------------------------

    def _via(self, hop: str, offer: Offer | None) -> float:
        """The cost to the root through ``hop``, as it offered."""
        link = self.links.get(hop)
        if offer is None or offer.cost >= CEILING or (link is not None and link.suspect):
            return CEILING
        return min(CEILING, offer.cost + (link.cost if link is not None else 0.0))

    def _feasible(self, tree: Tree, offer: Offer) -> bool:
        if self.id in offer.path:
            return False
        if offer.version != tree.version:
            return offer.version > tree.version
        return len(offer.path) - 1 < tree.feasible

    def _best(self, tree: Tree) -> tuple[str, float] | None:
        """The cheapest feasible way other than the parent's that carries something."""
        best: tuple[str, float] | None = None
        for hop, offer in tree.offers.items():
            if hop == tree.parent or hop not in self._peers or not self._feasible(tree, offer):
                continue
            cost = self._via(hop, offer)
            if cost < CEILING and (best is None or cost < best[1]):
                best = (hop, cost)
        return best

    def _weigh(self, tree: Tree, now: float, *, told: bool = False) -> list[Out]:
        """Move ``tree`` if another way is clearly better; else tell the neighbours a cost
        that changed by much (unless ``told`` already), and ask for a newer version if no
        way is usable."""
        if tree.parent not in self._peers:
            return []
        current = self._via(tree.parent, tree.offers.get(tree.parent))
        switching = self.switching
        best = self._best(tree) if switching.adaptive else None
        if best is not None:
            hop, cost = best
            better = current > switching.ratio * cost and current - cost > switching.gain
            if current >= CEILING or (better and now - tree.switched >= switching.hold):
                return self._move(tree, hop, now, drain=True)
            if better:
                self._waiting.add(tree.id)
        out: list[Out] = []
        if current >= CEILING and best is None and switching.adaptive:
            out += self._starved(tree, now)
        if not told and _significant(tree.cost, current):
            tree.cost = current
            out += self._tell(tree)
        else:
            tree.cost = current
        return out

    def _held_over(self, now: float) -> list[Out]:
        """Weigh again the trees that waited for their hold to be over."""
        out: list[Out] = []
        for tid in sorted(self._waiting):
            tree = self.trees.get(tid)
            if tree is None or now - tree.switched >= self.switching.hold:
                self._waiting.discard(tid)
                if tree is not None:
                    out += self._weigh(tree, now)
        return out

    def _starved(self, tree: Tree, now: float) -> list[Out]:
        """No usable feasible way: ask the root for a newer version, through the cheapest
        neighbour whose way does not go through this broker."""
        usable = [
            (self._via(hop, offer), hop)
            for hop, offer in tree.offers.items()
            if hop != tree.parent and hop in self._peers and self.id not in offer.path
        ]
        usable = [(cost, hop) for cost, hop in usable if cost < CEILING]
        if not usable:
            return []
        return self._ask(tree, min(usable)[1], tree.version, now)

    def _ask(self, tree: Tree, hop: str, version: int, now: float) -> list[Out]:
        asked = self._asked.get(tree.id)
        if asked is not None and asked[0] >= version and now - asked[1] < ASK_EVERY:
            return []
        self._asked[tree.id] = (version, now)
        return [(hop, RouteVersion(tree.id, version))]

    def _move(self, tree: Tree, hop: str, now: float, *, drain: bool) -> list[Out]:
        """Take ``hop`` as ``tree``'s parent (see the module docstring); ``drain``: the old
        parent is still linked, and keeps the subscriptions until ``_release`` lets it go
        (without, it lost the tree or its link: nothing more comes from it)."""
        old = tree.parent
        offer = tree.offers[hop]
        tree.held.discard(hop)
        tree.draining.pop(hop, None)
        if drain and self.routes.sends_to(old, tree.id):
            tree.held.add(old)
            tree.draining[old] = ""
            self._holding.add(tree.id)
        tree.parent = hop
        tree.path = (*offer.path, self.id)
        if offer.version > tree.version:
            tree.version, tree.feasible = offer.version, tree.depth
        tree.feasible = min(tree.feasible, tree.depth)
        tree.cost = self._via(hop, offer)
        tree.switched = now
        tree.settled = None
        self.moves += 1
        out = self.routes.tree_moved(tree.id)
        self.durables.resync(tree.id)
        return out + self._tell(tree)

    def _release(self, now: float) -> list[Out]:
        """Former parents held while the subscriptions settle along the new way: once they
        have, ``Switching.hold`` seconds ago, those answering for as long (or gone) lose the
        subscriptions, and are asked to drain."""
        out: list[Out] = []
        hold = self.switching.hold
        for tid in sorted(self._holding):
            tree = self.trees.get(tid)
            if tree is None or not tree.held:
                self._holding.discard(tid)
                continue
            if tree.settled is None:
                if not self._settled(tree):
                    continue
                tree.settled = now
            if now - tree.settled < hold:
                continue  # what the root sent before may be on its way along the old one
            done = {hop for hop in tree.held if self._answering(hop, now)}
            if not done:
                continue
            tree.held -= done
            out += self.routes.tree_moved(tid)
            for hop in sorted(done):
                if hop in self._peers:
                    token = self._new_id()
                    tree.draining[hop] = token
                    out.append((hop, RouteDrain(tid, token)))
                elif tree.draining.pop(hop, None) is not None:
                    self._drained(tree, now)
        return out

    def _settled(self, tree: Tree) -> bool:
        """Whether what this broker forwards for ``tree`` has settled at its parent."""
        slot = (tree.parent, tree.id)
        return all(
            self.echoes.pending((sid, slot)) is None
            for sid in self.routes.forwarded_to(tree.parent, tree.id)
        )

    def _answering(self, hop: str, now: float) -> bool:
        """Whether ``hop`` is gone, or has answered for ``Switching.hold`` seconds."""
        if hop not in self._peers:
            return True
        if hop not in self.links:
            return True  # not measured (a broker driven without a runtime)
        since = self._since.get(hop)
        return since is not None and now - since >= self.switching.hold

    def _drained(self, tree: Tree, now: float) -> None:
        if not tree.draining:
            tree.until = now + SEEN_FOR

    def _tell(self, tree: Tree) -> list[Out]:
        """The tree's path, version and cost, to every neighbour (those on the path drop
        their offer of this broker's way)."""
        message = RoutePath(tree.id, tree.path, tree.version, min(tree.cost, CEILING))
        return [(hop, message) for hop in self._peers]


def _significant(told: float, now: float) -> bool:
    if (told >= CEILING) != (now >= CEILING):
        return True
    return abs(now - told) > max(SIGNIFICANT * told, NOTICED)


def _changed(used: LinkState | None, state: LinkState) -> bool:
    """Whether a link's measure moved enough to weigh the trees again."""
    if used is None or used.suspect != state.suspect:
        return True
    return abs(state.cost - used.cost) > max(SIGNIFICANT * used.cost, NOTICED)
