"""Durable subscriptions, and the recovery of guaranteed publications they missed.

A durable subscription lives at its edge broker, in the broker's journal: it outlasts its
client's connection and the broker's own restarts. What it matches is queued there, numbered
(``Notify.seq``), and sent to the client when it is connected, at most ``DURABLE_WINDOW``
deliveries and ``DURABLE_WINDOW_BYTES`` ahead of its acknowledgements (``Ack``; both in
``padres.model.protocol``, which the client reads them from); the rest waits on disk. The
latest deliveries queued are also kept in memory (``RECENT``, ``RECENT_BYTES``,
``RECENT_TOTAL_BYTES``), so that a client catching up is sent them without reading them back
from the journal. While the client is away the queue is bounded (``Quotas.durable_queued``
deliveries, ``Quotas.durable_queue_bytes``), and so are the queues of one client's durable
subscriptions together (``Quotas.durable_bytes``): past that the oldest deliveries are
discarded (of the queue over its bound, or the client's largest), counted, and the client is
told how many when it comes back.

Guaranteed publications carry their position in the journal of the broker where they were
published, the root of the tree they travel down. For each tree it follows, a durable
subscription remembers the position up to which it has everything (its *cursor*). Whenever its
route starts following a tree (when it is made, when the broker restarts, when a tree lost with
a link comes back along another path), it asks the tree's root for what it missed: a
``Recover`` request travels up the tree behind the subscription itself, the root answers from
its journal (``Recovered``, in rounds of at most ``Recover.limit``), and the answer travels back
down the same path. While it is on its way, guaranteed publications of that tree arriving live
are left to the answer, which holds them too; after it, anything at or below the cursor is a
duplicate and is dropped. A guaranteed publication of a tree whose root the subscription has
not asked (the tree is not, or no longer, known here, or the last request failed) moves no
cursor: it may come along a route left over from an earlier path of the tree, ahead of
publications that the recovery asked when the tree is followed again will bring, and these
would then be taken for duplicates; it is left to that recovery. On a tree it never
followed, a subscription asks for what was published since it was made, so that an
advertisement reaching it late, across an overlay still linking up, costs nothing: it sends
its age by its own broker's clock, which the root counts back on its own (``Recover.age``),
and every later round asks by position, so that no two brokers' clocks are compared. (The
time the request spends on its way is not counted: what the root accepted in those
milliseconds before it arrived is taken for older than the subscription.)

Every ``REFRESH`` seconds each durable subscription also asks every root it follows again
(``refresh``), so that a loss nothing else revealed is repaired within that time; a recovery
still unanswered after ``STALLED`` such rounds is asked again too (its answer is then ignored
if it comes), so that no tree waits for ever on an answer lost on the way.

A transaction's publications (``transactions``) are queued by the subscription's visibility
(``visibility``), with their transaction and outcome; committed ones are guaranteed
publications like any other, and keep their transaction through recovery (``Recovered``
carries it), so that what a subscription sees does not depend on how it came.

A durable composite subscription routes each of its parts (``<id>:<part>``) and matches what
they bring in a network of its own (``durable_composites``); its deliveries are its matches.
Its parts follow trees together: one cursor per tree, and one recovery per tree asking for what
matches any part (``Recover.also``), so that a publication several parts want is taken once.
While one of its recoveries is under way, and for ``HOLD`` seconds after a restart, it is
*paused*: what its parts bring waits in its inbox, to be matched in timestamp order once it is
over, and it does not take the broker's clock (which closes windows with no publication), so
that the guaranteed publications made while the broker was down, or lost with a link, are
matched in their place, before time closes a window they fall in.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from padres.broker.durable_composites import DurableComposite
from padres.broker.echoes import Echoes
from padres.broker.guard import routing_filter
from padres.broker.journal import Delivered, DurableRecord, Journal, Queued, Tag
from padres.broker.quotas import Quotas
from padres.broker.routes import Out, Routes, Sink
from padres.broker.trees import Trees
from padres.broker.visibility import delivery, visible
from padres.errors import JournalError
from padres.matching.matcher import matches
from padres.model.messages import CompositeSubscription, Filter, Origin, Publication, Subscription
from padres.model.producers import ranges_of, take
from padres.model.protocol import (
    DURABLE_WINDOW,
    DURABLE_WINDOW_BYTES,
    Ack,
    Error,
    Outcome,
    Recover,
    Recovered,
    Roam,
    Scope,
    Visibility,
)
from rete import CompositeLimits

__all__ = [
    "HOLD",
    "READ",
    "RECENT",
    "RECENT_BYTES",
    "RECENT_TOTAL_BYTES",
    "REFRESH",
    "STALLED",
    "Durables",
]

log = logging.getLogger("padres.broker")

READ: Final = 1_000
"""Deliveries read back from the journal at a time to be sent (the window may take fewer)."""
RECENT: Final = 10_000
"""Deliveries not yet sent that a durable subscription keeps in memory as well, at most: the
latest queued."""
RECENT_BYTES: Final = 4 << 20
"""Bytes (encoded) of deliveries not yet sent that a durable subscription keeps in memory, at
most."""
RECENT_TOTAL_BYTES: Final = 32 << 20
"""Bytes (encoded) of deliveries not yet sent that all the durable subscriptions of a broker
keep in memory, at most."""
REFRESH: Final = 10.0
"""Seconds between two rounds of asking every followed tree's root for what was missed."""
STALLED: Final = 6
"""Rounds of ``refresh`` after which a recovery still unanswered is asked again."""
HOLD: Final = 5.0
"""Seconds a durable composite subscription taken up after a restart stays paused (see the
module docstring): its broker links up again, and what the overlay redelivers comes first."""


@dataclass(frozen=True)
class _Asked:
    request: str
    token: str
    """The echo token its answer completes."""
    hop: str
    """The neighbour it was sent to."""
    round: int
    """The round of ``refresh`` it was asked in."""


@dataclass(frozen=True)
class _Passage:
    back: str
    forward: str
    tree: str


@dataclass
class _Memory:
    """Bytes counted together by several durable subscriptions: those kept in memory by all of
    a broker's, or those in flight to one client."""

    used: int = 0


@dataclass
class _Durable:
    record: DurableRecord
    gid: str
    """The id of its route here (it changes with each run of the broker); a composite's parts
    are routed as ``<gid>:<part>``."""
    composite: DurableComposite | None = None
    """A composite subscription's matching."""
    hold: float | None = None
    """Until when its composite is paused after a restart (see the module docstring), by
    the broker's clock; negative: ``HOLD`` from the first reading of the clock on."""
    hop: str | None = None
    """The connected client's hop, if it is connected."""
    away: float | None = None
    """Since when its client has been away (the broker's time), once the broker noticed."""
    sent: int = 0
    """The last delivery number sent to the connected client."""
    contacted: set[str] = field(default_factory=set)
    """The trees its route follows whose root it has asked (or is asking) for what it missed."""
    recovering: dict[str, _Asked] = field(default_factory=dict)
    """Tree -> the recovery under way."""
    owner: _Memory = field(default_factory=_Memory)
    """The bytes queued for its client's durable subscriptions together."""
    queued: int = 0
    bytes: int = 0
    told: int = 0
    """How many discarded deliveries the client has been told of."""
    flight: deque[tuple[int, int]] = field(default_factory=deque)
    """The deliveries sent and not acknowledged: (number, bytes), in order."""
    flight_bytes: int = 0
    blocked: int = 0
    """The bytes of the next delivery to send, once it did not fit in the window (0: none
    waits so): nothing is read from the journal to be sent until it fits."""
    window: _Memory = field(default_factory=_Memory)
    """The bytes in flight to its client, counted with its client's other durable
    subscriptions."""
    recent: deque[Queued] = field(default_factory=deque)
    """The latest deliveries queued and not sent, in order, their numbers consecutive up to
    the last queued (``record.next - 1``): (number, publication, tag, bytes). The journal
    holds them too; those before the first are read back from it."""
    recent_bytes: int = 0
    memory: _Memory = field(default_factory=_Memory)

    @property
    def routes(self) -> tuple[str, ...]:
        """The ids of its routes: its own, or a composite's parts'."""
        sub = self.record.subscription
        if isinstance(sub, Subscription):
            return (self.gid,)
        return tuple(f"{self.gid}:{i}" for i in range(len(sub.filters)))

    @property
    def filters(self) -> tuple[Filter, ...]:
        """What its routes ask for: its filter, or a composite's parts (``route_ids``)."""
        sub = self.record.subscription
        if isinstance(sub, Subscription):
            return (sub.filter,)
        return tuple(routing_filter(flt) for flt in sub.filters)

    def grew(self, count: int, size: int) -> None:
        """``count`` deliveries of ``size`` bytes in all were queued (negative: left it)."""
        self.queued += count
        self.bytes += size
        self.owner.used += size

    def keep(self, seq: int, item: Delivered, tag: Tag | None, size: int) -> None:
        """Keep delivery ``seq``, just queued and not sent, in memory (``recent``), the oldest
        kept going first when over the bounds."""
        self.recent.append((seq, item, tag, size))
        self.recent_bytes += size
        self.memory.used += size
        recent = self.recent
        while recent and (
            len(recent) > RECENT
            or self.recent_bytes > RECENT_BYTES
            or self.memory.used > RECENT_TOTAL_BYTES
        ):
            self._forget_oldest()

    def _forget_oldest(self) -> None:
        size = self.recent.popleft()[3]
        self.recent_bytes -= size
        self.memory.used -= size

    def sending(self, seq: int, size: int) -> None:
        """Delivery ``seq`` goes to the client now."""
        self.sent = seq
        self.blocked = 0
        self.flight.append((seq, size))
        self.flight_bytes += size
        self.window.used += size
        while self.recent and self.recent[0][0] <= seq:
            self._forget_oldest()

    def skip(self, upto: int) -> None:
        """The deliveries up to ``upto`` are discarded: neither sent nor kept."""
        self.landed(upto)
        if upto > self.sent:
            self.sent, self.blocked = upto, 0

    def clear(self) -> None:
        """Keep nothing in memory (the subscription is dropped)."""
        while self.recent:
            self._forget_oldest()

    def landed(self, acked: int) -> tuple[int, int]:
        """The deliveries up to ``acked`` are no longer in flight nor kept (acknowledged, or
        discarded); returns how many of them were in flight, and their bytes."""
        flight = self.flight
        count = total = 0
        while flight and flight[0][0] <= acked:
            size = flight.popleft()[1]
            count += 1
            total += size
        self.flight_bytes -= total
        self.window.used -= total
        while self.recent and self.recent[0][0] <= acked:
            self._forget_oldest()
        return count, total

    def restart(self, window: _Memory | None = None) -> None:
        """The client resumes after its last acknowledgement: nothing is in flight (``window``:
        the bytes in flight to the client it resumes with, counted from now)."""
        self.sent = self.record.acked
        self.blocked = 0
        self.flight.clear()
        self.window.used -= self.flight_bytes
        self.flight_bytes = 0
        self.window = window or _Memory()

    def room(self, size: int) -> bool:
        """Whether a delivery of ``size`` bytes may go now, by the window."""
        if not self.flight:
            return True
        return (
            self.sent - self.record.acked < DURABLE_WINDOW
            and self.window.used + size <= DURABLE_WINDOW_BYTES
        )


class Durables:
    """A broker's durable subscriptions and the recoveries passing through it."""

    def __init__(
        self,
        journal: Journal,
        routes: Routes,
        trees: Trees,
        echoes: Echoes,
        new_id: Callable[[], str],
        now: Callable[[], float],
        quotas: Quotas,
        limits: CompositeLimits,
        expiry: float = 0.0,
    ) -> None:
        """``now``: the broker's time (Unix seconds, by its own clock); ``quotas``: the
        deliveries and bytes one subscription's queue keeps, and the bytes one client's
        subscriptions keep together; ``limits``: the bounds of a composite's partial matches;
        ``expiry``: seconds a subscription whose client is away is kept (0 or less: for
        ever)."""
        self.journal = journal
        self.limits = limits
        self.max_queued = quotas.durable_queued
        self.max_queue_bytes = quotas.durable_queue_bytes
        self.owner_bytes = quotas.durable_bytes
        self.expiry = expiry
        self.routes = routes
        self.trees = trees
        self.echoes = echoes
        self._new_id = new_id
        self._now = now
        self._durables: dict[tuple[str, str], _Durable] = {}
        self._owned: Counter[str] = Counter()
        """How many durable subscriptions each client keeps."""
        self._owners: dict[str, _Memory] = {}
        """Per client, the bytes queued for its durable subscriptions together."""
        self._by_gid: dict[str, _Durable] = {}
        """By the id of each of their routes, and by ``_Durable.gid``."""
        self._passages: dict[str, _Passage] = {}
        """Recoveries on their way through this broker, by request id."""
        self._round = 0
        """How many rounds of ``refresh`` have been."""
        self._memory = _Memory()
        self._windows: dict[str, _Memory] = {}
        """Per connected client's hop, the bytes in flight to it."""

    def __len__(self) -> int:
        return len(self._durables)

    def restore(self) -> None:
        """Take up the durable subscriptions of the journal (at start: with no neighbour yet,
        routing them sends nothing; they follow trees as the links bring them)."""
        for record in sorted(self.journal.durables(), key=lambda r: r.created):
            durable = self._take(record)  # in the order they were made: ties of priority
            durable.grew(*self.journal.backlog(record))
            durable.restart()
            if durable.composite is not None:
                self._load(durable, durable.composite)
                durable.hold = -1.0
            self._route(durable)

    def _load(self, durable: _Durable, composite: DurableComposite) -> None:
        """Take up a durable composite's partial matches from the journal; one that cannot
        be read (a journal of another version, a damaged disk) is started afresh, logged."""
        state = self.journal.partial(durable.record)
        if state is None:
            return
        try:
            composite.load(state)
        except JournalError as exc:
            log.error("%s; it starts afresh, its queued matches kept", exc)
            durable.composite = DurableComposite(composite.subscription, self.limits)

    def _take(self, record: DurableRecord) -> _Durable:
        owner = self._owners.setdefault(record.owner, _Memory())
        durable = _Durable(record, self._new_id(), owner=owner, memory=self._memory)
        sub = record.subscription
        if isinstance(sub, CompositeSubscription):
            durable.composite = DurableComposite(sub, self.limits)
        self._durables[record.owner, record.name] = durable
        self._owned[record.owner] += 1
        for rid in (durable.gid, *durable.routes):
            self._by_gid[rid] = durable
        return durable

    def route_ids(self, gid: str) -> tuple[str, ...]:
        """The ids of the routes of durable subscription ``gid``: its own, or its parts'."""
        durable = self._by_gid.get(gid)
        return () if durable is None else durable.routes

    def _route(self, durable: _Durable) -> list[Out]:
        """Route the subscription (a composite's parts) for its queue, by its options."""
        record = durable.record
        local = record.scope is Scope.LOCAL
        out: list[Out] = []
        for rid, flt in zip(durable.routes, durable.filters, strict=True):
            sub = Subscription(rid, flt)
            out += self.routes.add_own(sub, Sink.DURABLE, priority=record.priority, local=local)
        return out

    def statistics(self) -> list[dict[str, Any]]:
        """Each durable subscription: whose, how far along, what waits for its client (and
        since when its client has been away, in seconds, if it is)."""
        now = self._now()
        return [
            {
                "owner": d.record.owner,
                "name": d.record.name,
                "connected": d.hop is not None,
                "away": None if d.hop is not None or d.away is None else round(now - d.away, 3),
                "next": d.record.next,
                "acked": d.record.acked,
                "sent": d.sent,
                "queued": d.queued,
                "queued_bytes": d.bytes,
                "discarded": d.record.discarded,
                "trees": len(d.contacted),
                "recovering": len(d.recovering),
                "held": None if d.composite is None else d.composite.held(),
            }
            for d in self._durables.values()
        ]

    def records(self) -> list[DurableRecord]:
        """The durable subscriptions, as the journal keeps them."""
        return [d.record for d in self._durables.values()]

    def has(self, owner: str, name: str) -> bool:
        return (owner, name) in self._durables

    def owned(self, owner: str) -> int:
        """How many durable subscriptions client ``owner`` keeps here."""
        return self._owned.get(owner, 0)

    def hop_of(self, owner: str, name: str) -> str | None:
        """The hop of the client connected to durable subscription ``name``, if one is."""
        durable = self._durables.get((owner, name))
        return None if durable is None else durable.hop

    def acked(self, owner: str, name: str) -> int:
        """The last delivery of durable subscription ``name`` acknowledged (0 if none)."""
        durable = self._durables.get((owner, name))
        return 0 if durable is None else durable.record.acked

    def delivery(self, owner: str, name: str, seq: int) -> Delivered | None:
        """Delivery ``seq`` of durable subscription ``name``, as queued here, if it is still
        queued (not acknowledged)."""
        durable = self._durables.get((owner, name))
        if durable is None or seq <= durable.record.acked:
            return None
        queued = self.journal.queued(durable.record, seq - 1, 1)
        return queued[0][1] if queued and queued[0][0] == seq else None

    # -- the client --------------------------------------------------------------------------

    def attach(
        self,
        owner: str,
        hop: str,
        sub: Subscription | CompositeSubscription,
        acked: int,
        now: float,
        visibility: Visibility = Visibility.ON_COMMIT,
        roam: Roam | None = None,
        priority: int = 0,
        scope: Scope = Scope.GLOBAL,
    ) -> tuple[list[Out], str]:
        """The client ``owner`` on ``hop`` makes or resumes durable subscription ``sub``
        (seeing transactional publications by ``visibility``, of ``priority`` and ``scope``),
        or brings it from another broker (``roam``: it is made anew, as old as it says and
        with what its client has taken; a composite one starts afresh); returns what to send,
        and its id (its routes: ``route_ids``), or raises ``ValueError`` saying why not. One
        resumed with another priority takes it."""
        durable = self._durables.get((owner, sub.id))
        out: list[Out] = []
        if roam is not None and durable is not None:  # from an earlier stay here: stale
            out += self.drop(owner, sub.id)
            durable = None
        if durable is None:  # new, moved here, or forgotten by a broker that lost its journal
            if roam is None or isinstance(sub, CompositeSubscription):
                record = DurableRecord(
                    owner, sub, next=acked + 1, acked=acked, created=now, visibility=visibility
                )
            else:
                taken = ranges_of(roam.taken)
                record = DurableRecord(
                    owner, sub, created=now - roam.age, visibility=visibility, producers=taken
                )
            record.priority, record.scope = priority, scope
            durable = self._take(record)
            self.journal.save(durable.record)
            out += self._route(durable)
        elif durable.record.subscription != sub:
            what = "filter" if isinstance(sub, Subscription) else "expression"
            raise ValueError(f"durable subscription {sub.id!r} exists with another {what}")
        elif durable.record.visibility is not visibility:
            raise ValueError(
                f"durable subscription {sub.id!r} exists with visibility "
                f"{durable.record.visibility.value}, not {visibility.value}"
            )
        elif durable.record.scope is not scope:
            raise ValueError(
                f"durable subscription {sub.id!r} exists with scope "
                f"{durable.record.scope.value}, not {scope.value}"
            )
        elif durable.record.priority != priority:
            durable.record.priority = priority
            self.routes.prioritize(durable.gid, priority)
            self.journal.save(durable.record)
        record = durable.record
        durable.hop, durable.away = hop, None
        if acked > record.acked:
            self._acked(durable, min(acked, record.next - 1))
        durable.restart(self._windows.setdefault(hop, _Memory()))
        if record.discarded > durable.told:
            lost = record.discarded - durable.told
            durable.told = record.discarded
            text = (
                f"durable subscription {sub.id!r}: {lost} deliveries were discarded while you "
                f"were away (the queue keeps {self.max_queued} deliveries, {self.max_queue_bytes} "
                f"bytes; "
                f"a client's durable subscriptions together, {self.owner_bytes} bytes)"
            )
            out.append((hop, Error(text)))  # a notice: the request itself succeeds
        return out + self._pump(durable), durable.gid

    def detach(self, hop: str) -> None:
        self._windows.pop(hop, None)
        for durable in self._durables.values():
            if durable.hop == hop:
                durable.hop, durable.away = None, self._now()
                durable.restart()

    def expire(self) -> list[Out]:
        """Drop the subscriptions whose client has been away longer than ``expiry``."""
        if self.expiry <= 0:
            return []
        now = self._now()
        out: list[Out] = []
        for (owner, name), durable in list(self._durables.items()):
            if durable.hop is not None:
                continue
            if durable.away is None:  # away since before this broker started
                durable.away = now
            elif now - durable.away > self.expiry:
                log.warning(
                    "durable subscription %r of %s dropped with %d deliveries: its client was "
                    "away for more than %g s",
                    name,
                    owner,
                    durable.queued,
                    self.expiry,
                )
                out += self.drop(owner, name)
        return out

    def drop(self, owner: str, name: str) -> list[Out]:
        """The client ends durable subscription ``name`` for good."""
        durable = self._durables.pop((owner, name))
        durable.grew(-durable.queued, -durable.bytes)
        self._owned[owner] -= 1
        if not self._owned[owner]:
            del self._owned[owner]
            del self._owners[owner]
        routes = durable.routes
        for rid in {durable.gid, *routes}:
            del self._by_gid[rid]
        durable.restart()  # what it had in flight no longer counts against its client's window
        durable.clear()
        self.journal.forget(durable.record)
        return self.routes.remove_local(*routes)

    def ack(self, owner: str, ack: Ack) -> list[Out]:
        durable = self._durables.get((owner, ack.subscription))
        if durable is None:
            return []
        self._acked(durable, min(ack.seq, durable.sent))
        return self._pump(durable)

    def _acked(self, durable: _Durable, seq: int) -> None:
        record = durable.record
        if seq <= record.acked:
            return
        in_flight, flown = durable.landed(seq)
        # Every delivery after the last acknowledged one is queued: when all those now
        # acknowledged were in flight, their count and bytes are known without reading them.
        known = (in_flight, flown) if in_flight == seq - record.acked else None
        record.acked = seq
        count, size = self.journal.dequeue(record, seq, known)
        durable.grew(-count, -size)
        self.journal.save(record)

    def _pump(self, durable: _Durable) -> list[Out]:
        """Send what the client may have now (up to the window ahead of its acks): what is
        kept in memory, and before it what only the journal holds."""
        hop = durable.hop
        record = durable.record
        out: list[Out] = []
        if hop is None:
            return out
        recent = durable.recent
        while durable.sent < record.next - 1:
            if not durable.room(durable.blocked):
                break
            if recent and recent[0][0] == durable.sent + 1:
                seq, item, tag, size = recent[0]
                if not durable.room(size):
                    durable.blocked = size
                    break
                durable.sending(seq, size)
                out.append((hop, delivery(item, (record.name,), seq, tag)))
                continue
            until = recent[0][0] if recent else record.next
            count = min(
                DURABLE_WINDOW - (durable.sent - record.acked), until - durable.sent - 1, READ
            )
            rows = self.journal.queued(record, durable.sent, max(1, count))
            if not rows:
                break
            for seq, item, tag, size in rows:
                if not durable.room(size):
                    durable.blocked = size
                    return out
                durable.sending(seq, size)
                out.append((hop, delivery(item, (record.name,), seq, tag)))
        return out

    # -- publications ------------------------------------------------------------------------

    def arrived(
        self,
        routes: list[str],
        pub: Publication,
        tree: str | None,
        position: int,
        tag: Tag | None = None,
    ) -> list[Out]:
        """A publication (of a transaction: ``tag``) matched the durable ``routes`` (those of
        a composite's parts may be several: it takes the publication once)."""
        out: list[Out] = []
        seen: set[str] = set()
        for rid in routes:
            durable = self._by_gid[rid]
            if durable.gid not in seen:
                seen.add(durable.gid)
                out += self._arrived(durable, pub, tree, position, tag)
        return out

    def _arrived(
        self, durable: _Durable, pub: Publication, tree: str | None, position: int, tag: Tag | None
    ) -> list[Out]:
        if position and tree is not None:
            if tree not in durable.contacted or self.trees.get(tree) is None:
                return []  # not followed: the recovery asked when it is will bring it
            if tree in durable.recovering:
                return []  # the recovery's answer holds it
            cursors = durable.record.cursors
            if position <= cursors.get(tree, 0):
                return []  # a duplicate
            cursors[tree] = position
        if tag is not None and not visible(durable.record.visibility, tag[1]):
            return []
        return self._take_in(durable, pub, tag)

    def _take_in(self, durable: _Durable, pub: Publication, tag: Tag | None = None) -> list[Out]:
        """Queue ``pub`` (a composite matches it, and queues its matches), unless its producer
        sent it again and it was taken already."""
        record = durable.record
        origin = pub.origin
        if isinstance(origin, Origin) and not take(record.producers, origin.producer, origin.seq):
            return []  # sent again by its producer, through another broker: had already
        composite = durable.composite
        if composite is None:
            return self._queue(durable, pub, tag)
        self.journal.keep_partial(record, composite.dump)
        self.journal.save(record)  # what it took (``producers``), even with no match
        found = composite.keep(pub) if self._paused(durable) else composite.match(pub)
        out: list[Out] = []
        for match in found:
            out += self._queue(durable, match)
        return out

    @staticmethod
    def _paused(durable: _Durable) -> bool:
        """Whether a durable composite waits for what it missed (see the module docstring)."""
        return durable.hold is not None or bool(durable.recovering)

    def _resume(self, durable: _Durable) -> list[Out]:
        """A durable composite no longer paused matches what waits in its inbox."""
        composite = durable.composite
        if composite is None or not composite.kept or self._paused(durable):
            return []
        self.journal.keep_partial(durable.record, composite.dump)
        out: list[Out] = []
        for match in composite.release():
            out += self._queue(durable, match)
        return out

    def advance(self, clock: datetime, ahead: timedelta) -> list[Out]:
        """Time passes: the durable composites matched in timestamp order take ``clock`` as a
        lower bound of their watermark (``rete.Network.advance``), unless held back after a
        restart (``HOLD``) or by a recovery under way; the matches that completes are
        queued."""
        now = self._now()
        out: list[Out] = []
        for durable in self._durables.values():
            composite = durable.composite
            if composite is None:
                continue
            if durable.hold is not None:
                if durable.hold < 0:
                    durable.hold = now + HOLD
                if now >= durable.hold:
                    durable.hold = None
            if self._paused(durable):
                continue
            out += self._resume(durable)
            if not composite.timed:
                continue
            found = composite.advance(clock, ahead)
            if found:  # else what it changed is written with the next publication it takes
                self.journal.keep_partial(durable.record, composite.dump)
            for match in found:
                out += self._queue(durable, match)
        return out

    def _queue(self, durable: _Durable, item: Delivered, tag: Tag | None = None) -> list[Out]:
        record = durable.record
        seq = record.next
        record.next += 1
        size = self.journal.enqueue(record, seq, item, tag)
        durable.grew(1, size)
        if durable.queued > self.max_queued or durable.bytes > self.max_queue_bytes:
            self._discard(durable)
        elif durable.owner.used > self.owner_bytes:  # its client's largest queue gives way
            mine = (d for (owner, _), d in self._durables.items() if owner == record.owner)
            self._discard(max(mine, key=lambda d: d.bytes))
        self.journal.save(record)
        if durable.hop is not None and durable.sent == seq - 1 and durable.room(size):
            durable.sending(seq, size)
            return [(durable.hop, delivery(item, (record.name,), seq, tag))]
        if durable.sent < seq:
            durable.keep(seq, item, tag, size)
        return self._pump(durable)

    def _discard(self, durable: _Durable) -> None:
        """The queue is over its limits: the oldest tenth goes."""
        record = durable.record
        count = max(1, durable.queued // 10)
        upto = self.journal.oldest(record, count)
        self.journal.dequeue(record, upto)
        record.discarded += upto - record.acked
        record.acked = upto
        durable.skip(upto)
        count, size = self.journal.backlog(record)
        durable.grew(count - durable.queued, size - durable.bytes)
        self.journal.save(record)

    # -- recovery ----------------------------------------------------------------------------

    def sync(self) -> list[Out]:
        """Ask for what was missed on every tree a durable route has started to follow."""
        out: list[Out] = []
        for durable in self._durables.values():
            trees: set[str] = set()
            for rid in durable.routes:
                route = self.routes.get(rid)
                if route is not None:
                    trees |= route.trees
            durable.contacted &= trees
            for tree in sorted(trees - durable.contacted):
                durable.contacted.add(tree)
                out += self._ask(durable, tree, durable.record.cursors.get(tree))
        return out

    def resync(self, tree_id: str) -> None:
        """The tree came here along another way: the subscriptions following it ask its root
        again for what they may have missed (at the next ``sync``), behind their routes along
        the new way; guaranteed publications arriving meanwhile are left to the answer."""
        for durable in self._durables.values():
            durable.contacted.discard(tree_id)

    def refresh(self) -> list[Out]:
        """Ask again, for every tree followed, what was missed: where no recovery is under
        way, or where one has waited ``STALLED`` rounds."""
        self._round += 1
        out: list[Out] = []
        for durable in self._durables.values():
            for tree in sorted(durable.contacted):
                asked = durable.recovering.get(tree)
                if asked is not None and self._round - asked.round < STALLED:
                    continue
                cursor = durable.record.cursors.get(tree)
                if asked is not None or cursor is not None:
                    out += self._ask(durable, tree, cursor)
        return out

    def pending(self, gid: str) -> set[str]:
        """The echo tokens of the recoveries under way for durable route ``gid``."""
        durable = self._by_gid.get(gid)
        return set() if durable is None else {a.token for a in durable.recovering.values()}

    def _ask(self, durable: _Durable, tree_id: str, after: int | None) -> list[Out]:
        """Ask the root of ``tree_id`` for what was missed after position ``after``; None: a
        first contact, which asks for what was published since the subscription was made."""
        tree = self.trees.get(tree_id)
        if tree is None:
            return []
        filters = durable.filters
        request = Recover(
            f"{durable.gid}/{self._new_id()}",
            Subscription(durable.gid, filters[0]),
            tree_id,
            after or 0,
            age=max(0.0, self._now() - durable.record.created) if after is None else None,
            also=filters[1:],
        )
        # A recovery still under way (along an earlier path of the tree) is replaced: what
        # waits for it (a client's acknowledgement) waits for this one instead.
        replaced = durable.recovering.pop(tree_id, None)
        if tree.parent not in self.routes.brokers:  # the tree's root is here
            done = [] if replaced is None else self.echoes.echo(replaced.token, replaced.hop)
            return done + self._recovered(durable, self._answer(request))
        token = self.echoes.sent(tree.parent)
        if replaced is not None:
            self.echoes.supersede(replaced.token, token)
        durable.recovering[tree_id] = _Asked(request.request, token, tree.parent, self._round)
        return [(tree.parent, request)]

    def _answer(self, request: Recover) -> Recovered:
        """Answer ``request`` from this broker's journal (it is the tree's root)."""
        since = 0.0 if request.age is None else self._now() - request.age
        rows, lost = self.journal.since(request.tree, request.after, request.limit, since)
        more = len(rows) == request.limit
        last = rows[-1][0] if more else self.journal.head
        filters = (request.subscription.filter, *request.also)
        found = [(pos, pub, tx) for pos, pub, tx in rows if any(matches(f, pub) for f in filters)]
        return Recovered(
            request.request,
            request.tree,
            tuple(pub for _, pub, _ in found),
            tuple(pos for pos, _, _ in found),
            last,
            more=more,
            lost=lost,
            transactions=tuple(tx for _, _, tx in found) if any(f[2] for f in found) else (),
        )

    def forward(self, request: Recover, hop: str) -> list[Out]:
        """A recovery from a neighbour: answer it if the tree's root is here, else pass it on."""
        tree = self.trees.get(request.tree)
        if tree is None or tree.parent == hop:
            why = f"no tree {request.tree} at this broker"
            return [(hop, Recovered(request.request, request.tree, (), (), 0, error=why))]
        if tree.parent not in self.routes.brokers:
            return [(hop, self._answer(request))]
        self._passages[request.request] = _Passage(hop, tree.parent, request.tree)
        return [(tree.parent, request)]

    def answered(self, answer: Recovered, hop: str) -> list[Out]:
        """An answer coming back from ``hop``: pass it on toward its requester, or take it."""
        passage = self._passages.get(answer.request)
        if passage is not None:
            if passage.forward != hop:
                return []
            del self._passages[answer.request]
            return [(passage.back, answer)]
        gid = answer.request.rsplit("/", 1)[0]
        durable = self._by_gid.get(gid)
        if durable is None:
            return []
        asked = durable.recovering.get(answer.tree)
        if asked is None or asked.request != answer.request or asked.hop != hop:
            return []
        del durable.recovering[answer.tree]
        out = self.echoes.echo(asked.token, hop) + self._recovered(durable, answer)
        return out + self._resume(durable)

    def _recovered(self, durable: _Durable, answer: Recovered) -> list[Out]:
        if answer.error:
            durable.contacted.discard(answer.tree)  # asked again at the next tick
            return []
        cursors = durable.record.cursors
        out: list[Out] = []
        transactions = answer.transactions or ("",) * len(answer.publications)
        rows = zip(answer.positions, answer.publications, transactions, strict=True)
        for pos, pub, tx in rows:
            if pos > cursors.get(answer.tree, 0):
                cursors[answer.tree] = pos
                tag = (tx, Outcome.COMMITTED) if tx else None
                if tag is None or visible(durable.record.visibility, tag[1]):
                    out += self._take_in(durable, pub, tag)
        cursors[answer.tree] = max(cursors.get(answer.tree, 0), answer.head)
        if answer.lost:
            durable.record.discarded += 1
        self.journal.save(durable.record)
        if answer.more:
            out += self._ask(durable, answer.tree, cursors[answer.tree])
        return out

    def hop_down(self, hop: str) -> list[Out]:
        """Recoveries through ``hop`` end (their requesters ask again); a client on it leaves."""
        self.detach(hop)
        out: list[Out] = []
        for rid, passage in list(self._passages.items()):
            if hop in (passage.back, passage.forward):
                del self._passages[rid]
            if passage.forward == hop:
                why = f"the link to {hop} was lost"
                out.append((passage.back, Recovered(rid, passage.tree, (), (), 0, error=why)))
        for durable in self._durables.values():
            for tree, asked in list(durable.recovering.items()):
                if asked.hop == hop:
                    del durable.recovering[tree]
                    durable.contacted.discard(tree)
        return out
