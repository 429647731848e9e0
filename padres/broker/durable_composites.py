"""The matching of a durable composite subscription: a Rete network of its own, whose partial
matches the journal keeps.

A durable composite subscription lives at its edge broker as any durable subscription does
(``durable``): its parts are routed as subscriptions, and the publications they bring, live or
recovered from the roots of their trees, are matched by a network holding this composite only
(``DurableComposite``). What the network holds (the publications in its windows and memories,
its reorder buffer and watermark, the matches waiting for a window to close, what a
consumption policy has used up) is written to the journal whole (``rete.snapshot``), when the
journal commits the frame that changed it, in the same transaction as the matches the frame
queued. After a crash the broker takes the composite up as the last commit left it: no match
is lost, and none is made twice.

While its broker is asking the roots of its trees for what it missed (after a restart, or a
lost link), what the trees bring comes out of order: the recovered publications of one tree
after the live ones of another. So the composite then keeps what its parts bring in an inbox
(``keep``), written down with its state, and matches it in timestamp order once the broker
has everything (``release``): a publication recovered late is not taken for late. The inbox
holds at most ``INBOX`` publications; past that its oldest are matched at once.

The state written is what the network holds, which its window bounds (and without a window,
``CompositeLimits.max_facts`` per part): its cost is one write of that state per frame that
brought the composite a publication, or in which time closed one of its windows.
"""

from __future__ import annotations

import heapq
from datetime import datetime, timedelta
from typing import Any, Final, NamedTuple

import msgspec

from padres.errors import JournalError
from padres.matching.rete_matcher import to_condition
from padres.model.codec import encode, from_dict
from padres.model.messages import CompositeSubscription, Publication
from padres.model.protocol import CompositeNotify
from rete import Activation, CompositeLimits, Network
from rete.snapshot import Snapshot

__all__ = ["INBOX", "DurableComposite"]

INBOX: Final = 100_000
"""Publications a durable composite keeps in its inbox while its broker recovers, at most."""


class _Kept(NamedTuple):
    """What the journal keeps of a durable composite: its network's partial matches, and its
    inbox in timestamp order (publications encoded as the wire has them)."""

    network: Snapshot
    inbox: list[Any]


class DurableComposite:
    """One durable composite subscription's network (see the module docstring)."""

    def __init__(self, sub: CompositeSubscription, limits: CompositeLimits) -> None:
        self.subscription = sub
        self.id = sub.id
        self.timed = sub.timing is not None
        """Whether it is matched in timestamp order: time passing may complete its matches."""
        self._network = Network(limits, share=False)
        self._network.add(sub.id, to_condition(sub))
        self._inbox: list[tuple[datetime, int, Publication]] = []
        """Publications kept to be matched later, a heap on (timestamp, arrival)."""
        self._arrivals = 0

    def match(self, pub: Publication) -> list[CompositeNotify]:
        """The matches ``pub``, which one of its parts' routes brought, completes."""
        return self._matches(self._network.match(pub).activations)

    def keep(self, pub: Publication) -> list[CompositeNotify]:
        """Keep ``pub`` in the inbox, to be matched by ``release``; the matches of those
        matched at once because the inbox is full (its oldest)."""
        self._arrivals += 1
        heapq.heappush(self._inbox, (pub.timestamp, self._arrivals, pub))
        out: list[CompositeNotify] = []
        while len(self._inbox) > INBOX:
            out += self.match(heapq.heappop(self._inbox)[2])
        return out

    @property
    def kept(self) -> int:
        """The publications in the inbox."""
        return len(self._inbox)

    def release(self) -> list[CompositeNotify]:
        """Match what the inbox holds, in timestamp order (and arrival order among equal
        timestamps); the matches it completes."""
        out: list[CompositeNotify] = []
        while self._inbox:
            out += self.match(heapq.heappop(self._inbox)[2])
        return out

    def advance(self, clock: datetime, ahead: timedelta) -> list[CompositeNotify]:
        """Time passes (``rete.Network.advance``): the matches waiting for a window to close
        that it completes."""
        return self._matches(self._network.advance(clock, ahead))

    def _matches(self, activations: list[Activation]) -> list[CompositeNotify]:
        return [CompositeNotify(self.id, a.facts, a.bindings) for a in activations]

    def held(self) -> int:
        """The publications it holds, its inbox's too (one held by two parts counts twice)."""
        stats = self._network.stats()
        return stats["composite_facts"] + stats["temporal_facts"] + len(self._inbox)

    def dump(self) -> bytes:
        """What it holds, as the journal keeps it (``_Kept``)."""
        snapshot = self._network.snapshot()
        facts = [msgspec.Raw(encode(fact)) for fact in snapshot.facts]
        inbox = [msgspec.Raw(encode(pub)) for _, _, pub in sorted(self._inbox)]
        return msgspec.json.encode(_Kept(snapshot._replace(facts=facts), inbox))

    def load(self, data: bytes) -> None:
        """Hold what ``dump`` wrote (it holds nothing yet); ``JournalError`` if that cannot be
        read, or is of another composite."""
        try:
            kept = msgspec.json.decode(data, type=_Kept)
            facts = [_publication(fact) for fact in kept.network.facts]
            self._network.restore(kept.network._replace(facts=facts))
            for item in kept.inbox:
                self.keep(_publication(item))
        except (msgspec.DecodeError, ValueError, IndexError) as exc:
            why = f"cannot read the partial matches of durable subscription {self.id!r}: {exc}"
            raise JournalError(why) from exc


def _publication(obj: Any) -> Publication:
    pub = from_dict(obj)
    if not isinstance(pub, Publication):
        raise ValueError(f"it holds a {type(pub).__name__}, not a publication")
    return pub
