"""Consumers' votes on producers' transactions: how they travel to the producer's broker.

A consumer that received publications of a transaction (``pending`` or ``committing``) may vote
on it (``TxVote``): its reaction is ``ready`` or ``failed`` (the producer named it vital), or it
marks the transaction ``rollback`` only. Its broker sends the vote up the tree the transaction's
publications came down (``RouteTxVote``), whose root is the producer's broker, which counts it
(``padres.broker.transactions``). So each broker remembers, for the transactions whose
publications it delivered to its clients and that have not ended, the tree they travel
and which of its clients (plain subscribers) received them: one whose connection ends before it
voted is ``gone``, which its broker says in its place. At most ``MAX_REMEMBERED`` transactions
are remembered, the oldest forgotten first (a vote on one forgotten is refused, and its
producer's commit times out). What a broker remembers also tells where a client that joins a
transaction (``padres.broker.parts``) sends its join: up the same tree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

from padres.broker.routes import Out
from padres.broker.session import Session
from padres.broker.trees import Trees
from padres.model.protocol import Error, Ok, RouteTxVote, TxVote, Vote

__all__ = ["MAX_REMEMBERED", "Count", "Votes"]

MAX_REMEMBERED: Final = 10_000
"""Transactions a broker remembers the tree and the receivers of."""

Count = Callable[[RouteTxVote], list[Out]]
"""Counts a vote that reached the producer's broker (``Transactions.vote``)."""


class Votes:
    """The votes passing through a broker (see the module docstring)."""

    def __init__(self, trees: Trees, peers: Iterable[str], count: Count) -> None:
        """``peers``: the hops of the neighbour brokers (a live view); ``count``: what takes
        a vote at the producer's broker."""
        self.trees = trees
        self._peers = peers
        self._count = count
        self._open: dict[str, tuple[str, set[str]]] = {}
        """Transaction -> the tree its publications came down, and the clients' hops that
        received them and have not voted; oldest first."""

    def statistics(self) -> dict[str, int]:
        """Transactions remembered here, and the votes their receivers owe."""
        return {
            "transactions": len(self._open),
            "owed": sum(len(hops) for _, hops in self._open.values()),
        }

    def delivered(self, tx: str, tree: str, hops: Iterable[str]) -> None:
        """Publications of ``tx`` (open or committing), down ``tree``, reached clients ``hops``
        (and maybe durable subscriptions). The first tree is kept: the producer's, mostly
        (those of its parts' lead there too)."""
        first, owing = self._open.pop(tx, (tree, set()))
        owing.update(hops)
        self._open[tx] = (first, owing)
        if len(self._open) > MAX_REMEMBERED:
            del self._open[next(iter(self._open))]

    def tree_of(self, tx: str) -> str | None:
        """The tree publications of open transaction ``tx`` came down to this broker, if any
        did (and it remembers)."""
        known = self._open.get(tx)
        return None if known is None else known[0]

    def discharge(self, tx: str, hop: str) -> None:
        """The client on ``hop`` owes no vote on ``tx`` any more: its part of it is done."""
        known = self._open.get(tx)
        if known is not None:
            known[1].discard(hop)

    def ended(self, tx: str) -> None:
        """``tx`` is over: no vote on it can change anything."""
        self._open.pop(tx, None)

    def vote(self, session: Session, message: TxVote) -> list[Out]:
        """A client's vote: sent on toward the producer's broker, and acknowledged."""
        hop = session.hop
        if message.vote is Vote.GONE:
            return [(hop, Error("a client votes ready, failed or rollback", message.tx))]
        known = self._open.get(message.tx)
        if known is None:
            why = f"no open transaction {message.tx!r} whose publications reached this broker"
            return [(hop, Error(why, message.tx))]
        tree, owing = known
        owing.discard(hop)
        vote = RouteTxVote(message.tx, tree, session.name, message.vote, message.reason)
        return [*self.route(vote, hop), (hop, Ok(message.tx))]

    def gone(self, session: Session) -> list[Out]:
        """The client's connection ended: it is gone for the transactions it owes a vote."""
        out: list[Out] = []
        for tx, (tree, owing) in list(self._open.items()):
            if session.hop in owing:
                owing.discard(session.hop)
                why = f"{session.name} disconnected"
                out += self.route(RouteTxVote(tx, tree, session.name, Vote.GONE, why), "")
        return out

    def route(self, vote: RouteTxVote, hop: str) -> list[Out]:
        """Send ``vote`` (from ``hop``) up its tree, or count it if the tree's root is here."""
        tree = self.trees.get(vote.tree)
        if tree is None or tree.parent == hop:
            return []  # the tree is gone (its producer left): so is the transaction
        if tree.parent in self._peers:
            return [(tree.parent, vote)]
        return self._count(vote)
