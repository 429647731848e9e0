"""The subscription routing table (SRT): advertisements, grouped in the trees they flood along.

An advertisement floods the overlay from the broker where its publisher is attached. Each broker
keeps the first copy it receives and remembers the hop it came from (the tree's *parent*);
copies arriving from other hops are dropped. The parent pointers form a spanning tree rooted at
the publisher's broker, whatever cycles the overlay has. Subscriptions travel up a tree toward
its root, and publications down it, so a publication reaches each broker at most once.

Several advertisements may share one tree (an advertisement hidden by covering at its own
broker joins the tree of the one covering it), so a tree lives as long as any of its
advertisements does. Overlap between a subscription and the advertisements is looked up by class
first, then decided exactly by ``padres.matching.relations.overlaps``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from padres.matching.relations import overlaps
from padres.model.messages import Advertisement, Filter
from padres.model.protocol import Span

__all__ = ["Tree", "Trees"]


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
