"""Joined parts: a consumer's reaction made part of the transaction that triggered it.

X²TS calls it a *shared context*: a consumer that received publications of a producer's open
transaction (``TxNotify.tx``) begins a transaction that *joins* it (``TxBegin.join``); what it
publishes in that part is the producer's transaction's, tagged with its id, seen by each
subscription by its visibility, committed or aborted with it. ``padres.broker.transactions``
keeps both sides; this module holds what each side knows of the other, and the ways their
messages travel.

The protocol, between the part's broker P and the transaction's broker T (a two-phase commit
with T as coordinator, presumed abort):

1. **join**: P sends ``RouteTxPart(join)`` along the path of the tree the transaction's
   publications came down to it, to the tree's root (a part's broker there, holding a part of
   the same transaction, passes it on along that part's path). T takes the part while the
   transaction is open, or while its commit waits for this very consumer (one of its vital
   consumers that has not reported ready), and answers along the path
   (``RouteTxOutcome``, ``pending`` or ``committing``); otherwise it refuses it, saying why.
   The client's ``tx_begin`` is answered then. A part's publications go down the consumer's own
   trees at once, ``pending``, tagged with the transaction's id.
2. **prepared**: the client commits its part: P writes it to its journal (``PreparedPart``),
   in the frame that answers the client, and tells T. T's commit waits until every part it
   took is prepared, ``wait`` seconds at most, as it waits for its vital consumers (a vital
   consumer's prepared part is its ``ready``); a part aborted before it is prepared (by its
   client, a limit, its client away longer than the linger) aborts the transaction.
3. **decision**: T commits (its own publications in its journal, in one frame: a transaction
   with parts has some, since its parts joined on seeing them) or aborts, and tells every part
   along its path. P then
   journals the part's publications as guaranteed ones of the transaction and sends them down
   as ``committed``, or sends them down as ``aborted``, and forgets the part. When T's commit
   starts to wait, parts are told (``committing``) for ``deferred`` subscriptions.

Crashes: nothing is decided at P. A part not yet prepared lives in P's memory: if P dies,
T's commit waits for it in vain and aborts at its ``wait``. A prepared part is on P's disk: P,
restarted, asks T (``ask``, every ``ASK_EVERY`` seconds, along the path) until it learns the
outcome; T answers from what it remembers, or its journal (committed, as long as it keeps the
transaction's publications), or else aborted (a transaction T does not know was lost with a
restart of T before it committed). Lost messages
are covered the same way: a part that asks again, a commit that times out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

__all__ = ["ASK_EVERY", "MAX_PARTS", "Joined", "Link", "Ways", "extended"]

MAX_PARTS: Final = 100
"""Parts one transaction takes, at most."""
ASK_EVERY: Final = 2.0
"""Seconds between two questions of a prepared part's broker to its transaction's."""


@dataclass
class Link:
    """What a part knows of the transaction it joined."""

    joins: str
    """The transaction's overlay-wide id."""
    tree: str
    """The tree its publications came down here (votes on it go up that tree)."""
    path: tuple[str, ...]
    """The brokers from here to the transaction's: up that tree at first, then as the
    transaction's broker answered."""
    taken: bool = False
    """Whether the transaction's broker took the part."""
    committing: bool = False
    """Whether the transaction's commit has started."""
    prepared: bool = False
    """Whether the part is done and on disk: it ends as the transaction does."""
    asked: float = 0.0
    """When its broker last asked how the transaction ended."""


@dataclass
class Joined:
    """A part that joined a transaction, as the transaction's broker knows it."""

    voter: str
    """Its client's name in the overlay (``<client>@<broker>``)."""
    path: tuple[str, ...]
    """The brokers from the part's to this one."""
    prepared: bool = False


def extended(path: tuple[str, ...], more: tuple[str, ...]) -> tuple[str, ...]:
    """``path`` going on along ``more`` (which starts where ``path`` ends); a broker met again
    cuts out the loop between its two visits."""
    for broker in more:
        path = path[: path.index(broker) + 1] if broker in path else (*path, broker)
    return path


class Ways:
    """How the messages of parts travel: along a path of broker ids."""

    def __init__(self, broker_id: str, peers: Mapping[str, str]) -> None:
        """``peers``: the neighbour brokers, hop -> broker id (a live view)."""
        self.id = broker_id
        self._peers = peers

    def along(self, path: tuple[str, ...], forward: bool) -> str | None:
        """The hop to the next broker of ``path``, toward its last one (``forward``) or its
        first; ``""`` if this broker is that one; None if the way is lost (this broker is not
        on the path, or has no link to the next)."""
        if self.id not in path:
            return None
        index = path.index(self.id) + (1 if forward else -1)
        if not 0 <= index < len(path):
            return ""
        target = path[index]
        return next((hop for hop, broker in self._peers.items() if broker == target), None)
