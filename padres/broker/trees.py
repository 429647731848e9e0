"""The subscription routing table (SRT): advertisements, grouped in the trees they flood along.

An advertisement floods the overlay from the broker where its publisher is attached. Each broker
keeps the first copy it receives and remembers the hop it came from (the tree's *parent*); the
copies arriving from other hops are kept as *offers*, the other ways to the root (their paths,
versions and costs), among which the broker may take another parent later
(``padres.broker.paths``). The parent pointers form a spanning tree rooted at the publisher's
broker, whatever cycles the overlay has. Subscriptions travel up a tree toward its root, and
publications down it, so a publication reaches each broker at most once (while a broker moves
a tree to another parent, by both, and it keeps the first: ``Seen``).

Several advertisements may share one tree (an advertisement hidden by covering at its own
broker joins the tree of the one covering it), so a tree lives as long as any of its
advertisements does. Overlap between a subscription and the advertisements is looked up by class
first, then decided exactly by ``padres.matching.relations.overlaps``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from padres.matching.relations import overlaps
from padres.model.messages import Advertisement, Filter
from padres.model.protocol import Span

__all__ = ["SEEN", "Offer", "Seen", "Tree", "Trees"]

SEEN: Final = 100_000
"""Publications a broker remembers by identity across the trees that move to other parents,
at most."""


@dataclass
class Offer:
    """A neighbour's way to the root of a tree, as it last said (``RouteAdvertise``,
    ``RoutePath``)."""

    path: tuple[str, ...]
    """The brokers from the root down to the neighbour."""
    version: int
    cost: float
    """Its cost to the root, in seconds."""


class Seen:
    """Publications taken, by identity, so that a second copy (by another way) is dropped:
    at most ``most`` of them, the oldest forgotten first, and with ``within``, none taken
    longer ago than that (seconds)."""

    def __init__(self, most: int = SEEN, within: float | None = None) -> None:
        self.most = most
        self.within = within
        self._ids: OrderedDict[tuple[str, ...], float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ids)

    def first(self, key: tuple[str, ...], now: float) -> bool:
        """Whether ``key`` is taken for the first time (it is remembered)."""
        ids = self._ids
        if self.within is not None:
            before = now - self.within
            while ids and next(iter(ids.values())) < before:
                ids.popitem(last=False)
        if key in ids:
            return False
        ids[key] = now
        if len(ids) > self.most:
            ids.popitem(last=False)
        return True


@dataclass
class Tree:
    """One advertisement tree as this broker sees it."""

    id: str
    parent: str
    """The hop toward the root: a neighbour broker, or the advertising client at the root."""
    path: tuple[str, ...]
    """The brokers from the root down to this one, this one included."""
    advertisements: dict[str, Advertisement] = field(default_factory=dict)
    replay: str = ""
    """For a tree of replay offers: the database offering them."""
    period: Span | None = None
    """For a tree of replay offers: the publication times they hold (any when None)."""
    version: int = 0
    """The version of the tree this broker holds: its root's, passed down (``paths``)."""
    cost: float = 0.0
    """This broker's cost to the root, in seconds, as it last told its neighbours."""
    feasible: int = 0
    """The fewest brokers between the root and this one it has had at ``version`` (its
    feasibility distance, ``paths``)."""
    offers: dict[str, Offer] = field(default_factory=dict)
    """The neighbours' ways to the root, by hop (the parent's among them)."""
    held: set[str] = field(default_factory=set)
    """Former parents that stopped answering, where the subscriptions for the tree are kept
    until they answer again (what they held back then still comes)."""
    draining: dict[str, str] = field(default_factory=dict)
    """Former parents whose publications are still taken, until they answer ``RouteDrain``:
    hop -> the request's token ("" while ``held``)."""
    switched: float = float("-inf")
    """When this broker last took another parent for the tree (its time)."""
    settled: float | None = None
    """Since when what this broker forwards for the tree has settled at its new parent (None
    until it has, after a move)."""
    until: float = 0.0
    """Until when its publications are told apart by identity, once nothing drains: while
    it moves to another parent and a little after, a second copy may come by the other way
    (``paths``)."""

    @property
    def depth(self) -> int:
        """Brokers between the root and this one."""
        return len(self.path) - 1


class Trees:
    """Every advertisement tree this broker knows, with an index of advertisements by class."""

    def __init__(self) -> None:
        self._trees: dict[str, Tree] = {}
        self._tree_of: dict[str, str] = {}
        self._by_class: dict[str, dict[str, Advertisement]] = {}

    def __len__(self) -> int:
        return len(self._tree_of)

    def __iter__(self) -> Iterator[Tree]:
        return iter(list(self._trees.values()))

    def get(self, tree_id: str) -> Tree | None:
        return self._trees.get(tree_id)

    def tree_of(self, advertisement_id: str) -> Tree | None:
        tid = self._tree_of.get(advertisement_id)
        return None if tid is None else self._trees[tid]

    def of_class(self, class_name: str) -> Iterator[str]:
        """The ids of the advertisements of class ``class_name``, oldest first."""
        return iter(self._by_class.get(class_name, ()))

    def holding(self, advertisement_id: str) -> Tree:
        """The tree of a known advertisement (``KeyError`` if unknown)."""
        return self._trees[self._tree_of[advertisement_id]]

    def add(
        self,
        adv: Advertisement,
        tree_id: str,
        parent: str,
        path: tuple[str, ...],
        replay: str = "",
        period: Span | None = None,
    ) -> Tree:
        """Record ``adv`` in its tree, creating the tree with ``parent`` if it is new."""
        tree = self._trees.get(tree_id)
        if tree is None:
            tree = self._trees[tree_id] = Tree(tree_id, parent, path, replay=replay, period=period)
        tree.advertisements[adv.id] = adv
        self._tree_of[adv.id] = tree_id
        self._by_class.setdefault(adv.filter.class_name, {})[adv.id] = adv
        return tree

    def remove(self, advertisement_id: str) -> None:
        """Forget an advertisement; its tree goes too when it was the last one."""
        tree = self._trees[self._tree_of.pop(advertisement_id)]
        adv = tree.advertisements.pop(advertisement_id)
        same_class = self._by_class[adv.filter.class_name]
        del same_class[advertisement_id]
        if not same_class:
            del self._by_class[adv.filter.class_name]
        if not tree.advertisements:
            del self._trees[tree.id]

    def overlapping(self, flt: Filter) -> set[str]:
        """The trees holding an advertisement that overlaps ``flt``."""
        return {
            self._tree_of[adv.id]
            for adv in self._by_class.get(flt.class_name, {}).values()
            if overlaps(flt, adv.filter)
        }

    def tree_overlaps(self, tree: Tree, flt: Filter) -> bool:
        return any(overlaps(flt, adv.filter) for adv in tree.advertisements.values())
