"""Telling publishers of the plain publications a link dropped.

A plain publication (not guaranteed) has no journal behind it: when the queue of a link to a
neighbour ends with it unsent (the queue overflowed, a write failed, the neighbour stopped
answering or died), it is gone. The runtime summarises what a link dropped per tree and
publisher (``Tally``) and hands it to ``Broker.lost``; the broker sends each summary up its
tree toward the root (``RouteLoss``), every broker on the way passing it to its parent there,
and the root, the publisher's broker, tells the publisher (``Lost``) if it is connected. A
report that cannot go on (the tree is gone, the publisher has left) is logged and dropped: it
is news for the publisher, not a guarantee.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from msgspec.structs import asdict

from padres.broker.routes import Out
from padres.broker.session import Session
from padres.broker.trees import Tree, Trees
from padres.model.protocol import MAX_REASON, Lost, RouteLoss

__all__ = ["PUBLISHERS", "Dropped", "Losses", "Tally"]

log = logging.getLogger("padres.broker")

PUBLISHERS: Final = 10_000
"""Pairs of a tree and a publisher that one ``Tally`` tells apart, at most; the publications
of more are counted (``Tally.others``), not reported."""


@dataclass
class Dropped:
    """The publications of one publisher on one tree that a link dropped: how many, and the
    ids of the first and the last, in the order they were queued."""

    tree: str
    publisher: str
    count: int
    first: str
    last: str


class Tally:
    """Plain publications a link dropped, summarised per tree and publisher as they are added
    (in the order they were queued): its size is bounded by ``PUBLISHERS``, not by how many
    were dropped."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, str], Dropped] = {}
        self.total = 0
        """Publications added, ``others`` included."""
        self.others = 0
        """Publications added past ``PUBLISHERS`` pairs of tree and publisher: not reported."""

    def __len__(self) -> int:
        return len(self._runs)

    def __iter__(self) -> Iterator[Dropped]:
        return iter(self._runs.values())

    def add(self, tree: str, publisher: str, publication: str) -> None:
        """Publication ``publication`` of ``publisher``, sent down ``tree``, was dropped."""
        self.total += 1
        run = self._runs.get((tree, publisher))
        if run is not None:
            run.count += 1
            run.last = publication
        elif len(self._runs) < PUBLISHERS:
            self._runs[tree, publisher] = Dropped(tree, publisher, 1, publication, publication)
        else:
            self.others += 1

    def extend(self, later: Tally) -> None:
        """Add what ``later`` holds, all of it queued after what this one holds."""
        self.total += later.total
        self.others += later.others
        for key, dropped in later._runs.items():
            run = self._runs.get(key)
            if run is not None:
                run.count += dropped.count
                run.last = dropped.last
            elif len(self._runs) < PUBLISHERS:
                self._runs[key] = Dropped(**vars(dropped))
            else:
                self.others += dropped.count


class Losses:
    """One broker's part in telling publishers what links dropped of theirs."""

    def __init__(
        self,
        broker_id: str,
        trees: Trees,
        peers: Mapping[str, str],
        sessions: Mapping[str, Session],
    ) -> None:
        """``peers``: the neighbour brokers by hop; ``sessions``: the connected clients by
        hop (both read, never changed)."""
        self.id = broker_id
        self.trees = trees
        self._peers = peers
        self._sessions = sessions

    def report(self, neighbour: str, tally: Tally, reason: str) -> list[Out]:
        """This broker's link to ``neighbour`` ended for ``reason`` with the publications of
        ``tally`` unsent: a report for each publisher, toward it."""
        out: list[Out] = []
        told = 0
        reason = reason[:MAX_REASON]
        for dropped in tally:
            message = RouteLoss(
                dropped.tree,
                dropped.publisher,
                dropped.count,
                dropped.first,
                dropped.last,
                self.id,
                neighbour,
                reason,
            )
            sent = self._up(message, self.trees.get(dropped.tree))
            told += bool(sent)
            out += sent
        others = f" ({tally.others:,} of them by publishers past the first {PUBLISHERS:,})"
        log.warning(
            "%s: %s plain publications dropped on the link to %s (%s)%s; %d of %d publishers told",
            self.id,
            f"{tally.total:,}",
            neighbour,
            reason,
            others if tally.others else "",
            told,
            len(tally),
        )
        return out

    def arrive(self, message: RouteLoss, hop: str) -> list[Out]:
        """A report from the neighbour on ``hop``, below this broker in its tree: passed on
        toward the root."""
        tree = self.trees.get(message.tree)
        if tree is not None and tree.parent == hop:
            log.info(
                "%s: a report of publications lost came down tree %s from %s, not up: dropped",
                self.id,
                message.tree,
                hop,
            )
            return []
        return self._up(message, tree)

    def _up(self, message: RouteLoss, tree: Tree | None) -> list[Out]:
        """``message`` one step up ``tree``: to the parent broker, or at the root to the
        publisher's session; nothing (logged) when neither is there."""
        what = f"{message.count:,} publications of {message.publisher} dropped at {message.broker}"
        if tree is None:
            log.warning("%s: not told: %s (tree %s is unknown here)", self.id, what, message.tree)
            return []
        if tree.parent in self._peers:
            return [(tree.parent, message)]
        session = next((s for s in self._sessions.values() if s.name == message.publisher), None)
        if session is None:
            log.warning("%s: not told: %s (it is not connected here)", self.id, what)
            return []
        return [(session.hop, Lost(**asdict(message)))]
