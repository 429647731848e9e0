"""Historic and hybrid subscriptions: asking the databases, carrying their answers back.

A database offers replay with an advertisement of what it stores; the offer floods the overlay
like any advertisement, in its own set of trees (``Broker.archives``). A subscription with a
time window reaching into the past is *watched* at its edge broker: for each of its filters
(one, or one per part of a composite) the edge broker sends a ``ReplayRequest`` up the tree of
every database whose offer overlaps it, one request per database. Each broker on the way
remembers the request's *passage* (the hop back and the hop forward), so the answers
(``ReplayBatch``, then ``ReplayEnd``) travel back to the requester only, and a lost link or a
vanished database ends the request with an error instead of leaving it waiting; so does a
database that stops answering (see ``History`` for the timeout).

At the edge, a ``Feed`` per filter merges the answers and the live stream (see ``replay``);
the watch turns what comes out into deliveries, and tells the client with ``ReplayDone`` when
the past is complete. A composite matched in timestamp order (a sequence, a window) merges
its feeds into one stream in timestamp order (``timeline``) for its temporal network, past
and live alike, and follows the broker's clock once its past is complete (``advance``).

A hybrid subscription's live stream misses what was published while a tree it followed was
cut off from this broker (a link or a broker on the way failed). When the tree comes back (or
a database offering its past does), the edge broker asks the databases again for the past
since the loss, less ``REPAIR_MARGIN`` for what was on its way, and merges the answer in as
before (``Feed.reopen``): the gap is filled, and nothing the feed passed on comes twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final

from padres.broker.replay import Feed
from padres.broker.routes import Out
from padres.broker.timeline import Timeline
from padres.broker.trees import Tree, Trees
from padres.matching.rete_matcher import to_condition
from padres.model.messages import (
    CompositeSubscription,
    Filter,
    Publication,
    Subscription,
    TimeWindow,
)
from padres.model.protocol import (
    CompositeNotify,
    Notify,
    ReplayBatch,
    ReplayDone,
    ReplayEnd,
    ReplayRequest,
)
from rete import Activation, CompositeLimits, Network

__all__ = ["LOSS_MEMORY", "REPAIR_MARGIN", "History", "Watch", "composite_watch"]

log = logging.getLogger(__name__)

REPAIR_MARGIN: Final = 10.0
"""Seconds before a tree's loss from which a repair asks the past again: publications on their
way when the link failed (and publishers' clocks a little behind this broker's)."""
LOSS_MEMORY: Final = 600.0
"""Seconds a lost tree is waited for: a tree not back by then is not repaired for."""


@dataclass
class _Passage:
    back: str
    """The hop toward the requester; empty at the requester's own broker."""
    forward: str
    """The hop toward the database."""
    deadline: float
    """When the passage ends unless an answer comes through first (see ``History``)."""
    touched: bool = True
    """Whether the passage was made, or an answer came through it, since the last tick."""


@dataclass
class Watch:
    """A historic or hybrid subscription at its edge broker."""

    owner: str
    local_id: str
    feeds: dict[str, Feed] = field(default_factory=dict)
    """Per filter (the part's overlay-wide id), its feed."""
    indexes: dict[str, int] = field(default_factory=dict)
    """Per filter, its place among the composite's parts."""
    network: Network | None = None
    """A composite's own Rete network, fed only with what its feeds pass on."""
    timeline: Timeline | None = None
    """A composite matched in timestamp order: its feeds as one stream (``timeline``)."""
    has_past: bool = False
    count: int = 0
    reported: bool = False
    closed: bool = False
    """Whether a historic composite matched in timestamp order has closed the windows that
    close within its range."""

    def deliveries(self, part: str, pubs: list[Publication]) -> list[Out]:
        """What part ``part``'s feed passing on ``pubs`` delivers."""
        if self.network is None:
            return self._counted([(self.owner, Notify(p, (self.local_id,))) for p in pubs])
        if self.timeline is not None:
            return self._in_time(self.network, self.timeline, pubs)
        activations = []
        index = self.indexes[part]
        for pub in pubs:
            for activation in self.network.match_part(pub, self.local_id, index).activations:
                facts: tuple[Publication, ...] = activation.facts
                if len({(f.publisher, f.id) for f in facts}) == len(facts):
                    activations.append(activation)
        return self._notified(activations)

    def _in_time(self, network: Network, timeline: Timeline, pubs: list[Publication]) -> list[Out]:
        """A composite matched in timestamp order: its network takes what the timeline lets go;
        a historic one, once its past is complete, closes the windows that close within its
        range (those still open at its end are never reported)."""
        timeline.add(pubs)
        activations = []
        for pub in timeline.ready(self.feeds.values()):
            activations += network.match(pub).activations
        closing = timeline.closing
        historic = not any(f.live for f in self.feeds.values())
        if historic and closing is not None and not self.closed and self.caught_up():
            self.closed = True
            activations += network.advance(closing)
        return self._notified(activations)

    def caught_up(self) -> bool:
        """Whether the past is complete and let go, and no repair is due."""
        done = all(f.done and not f.due for f in self.feeds.values())
        return done and not (self.timeline is not None and len(self.timeline))

    def advance(self, clock: datetime) -> list[Out]:
        """The broker's clock (less its grace) is ``clock``: a hybrid composite matched in
        timestamp order takes it as a lower bound of its watermark once its past is complete
        (never beyond its range's end plus its lateness), closing the windows it passes."""
        network, timeline = self.network, self.timeline
        if network is None or timeline is None:
            return []
        clock = timeline.advance(clock)
        if self.closed or not self.caught_up():
            return []
        return self._notified(network.advance(clock))

    def _notified(self, activations: list[Activation]) -> list[Out]:
        out: list[Out] = []
        for activation in activations:
            facts: tuple[Publication, ...] = activation.facts
            notify = CompositeNotify(self.local_id, facts, activation.bindings)
            out.append((self.owner, notify))
        return self._counted(out)

    def _counted(self, out: list[Out]) -> list[Out]:
        if not self.reported:
            self.count += len(out)
        return out

    def report(self) -> list[Out]:
        """``ReplayDone`` once every feed has finished, if it has not been sent yet."""
        if self.reported or not all(f.done for f in self.feeds.values()):
            return []
        self.reported = True
        if not self.has_past:
            return []
        answered = sorted({db for f in self.feeds.values() for db in f.answered})
        failed = sorted(
            {f"{db}: {why}" for f in self.feeds.values() for db, why in f.failed.items()}
        )
        live = any(f.live for f in self.feeds.values())
        done = ReplayDone(self.local_id, self.count, tuple(answered), tuple(failed), live)
        return [(self.owner, done)]


def composite_watch(
    owner: str, sub: CompositeSubscription, limits: CompositeLimits | None, now: float
) -> Watch:
    """The watch of a composite subscription ``sub`` with time windows, made at ``now``: its
    own network holding only ``sub`` (under its id), fed part by part (``Watch.deliveries``);
    one matched in timestamp order reads one time range, its parts' feeds merged into one
    stream (``Timeline``)."""
    network = Network(limits, share=False)
    network.add(sub.id, to_condition(sub))
    timing = sub.timing
    if timing is None:
        return Watch(owner, sub.id, network=network)
    window = sub.filters[0].window
    seam = datetime.fromtimestamp(now, UTC)
    end = None if window is None else window.end
    timeline = Timeline(seam, end, timedelta(seconds=timing.late))
    return Watch(owner, sub.id, network=network, timeline=timeline)


class History:
    """A broker's historic requests: those it made, and those passing through it.

    ``replay_delay``: how long a database waits, after the end of the past a request asks for,
    before it answers (the request's ``ready_at``). ``timeout``: a request fails at a broker
    when no answer (a batch or the end) has come through it for ``timeout`` seconds, counted
    from its ``ready_at`` (or from when the broker sent it on, if that is later: the past a
    historic subscription asks for may have ended long ago) and again from each answer, so a
    database streaming a large answer slowly but steadily is not cut off. Time is counted in
    ticks (``expire``): a request, or an answer, starts the count at the next tick, so a request
    ends at most one tick late.

    Every broker on the path applies the rule to its own passage. At the requester's broker the
    request ends as failed: the feed names the database (``"DB1@B: no answer within 30 s"`` in
    ``ReplayDone.failed``), releases the live publications it held, and the passage is
    forgotten. A broker on the way only forgets its passage and sends nothing: the requester's
    broker applies the same rule to the same answers, and it alone reports the failure. An
    answer reaching a broker after its passage is gone is dropped there, so nothing of a
    request reaches the subscriber after its failure.
    """

    def __init__(
        self,
        broker_id: str,
        trees: Trees,
        archives: Trees,
        replay_delay: float,
        clock: Callable[[], float],
        *,
        timeout: float = 30.0,
    ) -> None:
        """``trees``: the advertisement trees; ``archives``: the trees of replay offers;
        ``clock``: the broker's time now (Unix seconds)."""
        self.id = broker_id
        self.trees = trees
        self.archives = archives
        self._clock = clock
        self.replay_delay = replay_delay
        self.timeout = timeout
        self.watches: dict[str, Watch] = {}
        self.parts: dict[str, str] = {}
        """Part id -> the id of its watch."""
        self._filters: dict[str, Filter] = {}
        """Part id -> its filter."""
        self._passages: dict[tuple[str, str], _Passage] = {}
        self._bounds: dict[str, float] = {}
        """Part id -> the earliest publication time its subscriber may read."""

    def is_empty(self) -> bool:
        return not (self.watches or self._passages)

    # -- at the requester's broker -----------------------------------------------------------

    def watch(
        self,
        gid: str,
        watch: Watch,
        parts: list[tuple[str, Filter]],
        now: float,
        bounds: Mapping[str, float | None] | None = None,
    ) -> list[Out]:
        """Start ``watch`` (stored under ``gid``) for its filters ``parts``; returns the requests
        to send. Parts whose window does not reach into the past ask nobody. ``bounds``: per
        part, the earliest publication time its subscriber may read (``ReplayRequest``'s
        ``not_before``); what a database answers from before it is dropped here too."""
        at = datetime.fromtimestamp(now, UTC)
        out: list[Out] = []
        for index, (pid, flt) in enumerate(parts):
            window = flt.window
            past = window is not None and (window.start is None or window.start < at)
            live = window is None or window.end is None or window.end > at
            databases: set[str] = set()
            bound = (bounds or {}).get(pid)
            if bound is not None:
                self._bounds[pid] = bound
            if past:
                watch.has_past = True
                out += self._ask(pid, flt, now, databases)
            watch.feeds[pid] = Feed(window, databases, live=live)
            watch.indexes[pid] = index
            self.parts[pid] = gid
            self._filters[pid] = flt
        self.watches[gid] = watch
        return out

    def _ask(self, pid: str, flt: Filter, now: float, databases: set[str]) -> list[Out]:
        """Requests for part ``pid``'s past as ``flt``'s window has it (up to now), one to
        each database whose offer overlaps it; the databases asked are added to ``databases``."""
        window = flt.window
        assert window is not None
        end = now if window.end is None else min(now, window.end.timestamp())
        ready_at = end + self.replay_delay
        bound = self._bounds.get(pid)
        out: list[Out] = []
        for tid in sorted(self.archives.overlapping(flt)):
            tree = self.archives.get(tid)
            if tree is None or tree.replay in databases:
                continue  # one request per database, up its first overlapping offer
            if tree.period is not None and not tree.period.meets(window):
                continue  # an archive of other times
            databases.add(tree.replay)
            deadline = ready_at + self.timeout
            self._passages[pid, tree.replay] = _Passage("", tree.parent, deadline)
            request = ReplayRequest(
                Subscription(pid, flt), tid, tree.replay, ready_at, not_before=bound
            )
            out.append((tree.parent, request))
        return out

    def unwatch(self, gid: str) -> Watch:
        watch = self.watches.pop(gid)
        for pid in watch.feeds:
            del self.parts[pid]
            del self._filters[pid]
            self._bounds.pop(pid, None)
            for key in [k for k in self._passages if k[0] == pid]:
                del self._passages[key]
        return watch

    def arrived(self, pid: str, pub: Publication) -> list[Out]:
        """A live publication matched part ``pid`` of a watch."""
        watch = self.watches[self.parts[pid]]
        return watch.deliveries(pid, watch.feeds[pid].arrived(pub))

    def advance(self, clock: datetime) -> list[Out]:
        """The broker's clock, less its grace, is ``clock``: the composites matched in
        timestamp order whose past is complete take it as a lower bound of their watermark
        (``Watch.advance``)."""
        out: list[Out] = []
        for watch in self.watches.values():
            out += watch.advance(clock)
        return out

    def tree_lost(self, tree: Tree) -> None:
        """``tree`` was lost with a failed link: the hybrid feeds following it will ask for
        the past again once it is back."""
        now = self._clock()
        for feed in self._following(tree, lost=False):
            feed.lost.setdefault(tree.id, now)

    def tree_found(self, tree: Tree) -> None:
        """``tree`` (an advertisement tree, or a database's offer) came: the feeds that lost
        trees it overlaps are due a repair, at the next tick."""
        for feed in self._following(tree, lost=True):
            feed.due = True

    def _following(self, tree: Tree, *, lost: bool) -> Iterator[Feed]:
        """The hybrid feeds whose filter overlaps ``tree``; with ``lost``, only those owed a
        repair (the only ones an arriving tree concerns: no overlap is tested for the rest)."""
        for pid, gid in self.parts.items():
            feed = self.watches[gid].feeds[pid]
            if lost and not feed.lost:
                continue
            if feed.live and self.archives.tree_overlaps(tree, self._filters[pid]):
                yield feed

    def _repair(self, now: float) -> list[Out]:
        """Ask the past again for the feeds due a repair (and no longer replaying): from the
        earliest loss they are owed, less ``REPAIR_MARGIN``, but not from before what they
        remember having passed on."""
        out: list[Out] = []
        for pid, gid in self.parts.items():
            watch = self.watches[gid]
            feed = watch.feeds[pid]
            for tid, when in list(feed.lost.items()):
                if now - when > LOSS_MEMORY:
                    del feed.lost[tid]
            if not (feed.due and feed.done):
                continue
            if not feed.lost:
                out += watch.deliveries(pid, feed.settle())
                continue
            flt = self._filters[pid]
            window = flt.window or TimeWindow()
            start = datetime.fromtimestamp(min(feed.lost.values()) - REPAIR_MARGIN, UTC)
            for floor in (window.start, feed.remembers_since()):
                if floor is not None and floor > start:
                    start = floor
            databases: set[str] = set()
            since = Filter(flt.predicates, TimeWindow(start, window.end))
            out += self._ask(pid, since, now, databases)
            if not databases:  # the next database that offers is asked
                out += watch.deliveries(pid, feed.settle())
                continue
            for tid in [t for t in feed.lost if self.trees.get(t) is not None]:
                del feed.lost[tid]  # back: repaired
            feed.reopen(databases)
            log.info(
                "%s: asking %s again for the past of %s since %s: a tree it followed was lost",
                self.id,
                ", ".join(sorted(databases)),
                pid,
                start.isoformat(),
            )
        return out

    # -- requests on the way -----------------------------------------------------------------

    def forward(self, request: ReplayRequest, hop: str) -> list[Out]:
        """A request from a neighbour: pass it on toward its database, or say it cannot go."""
        rid, db = request.subscription.id, request.database
        tree = self.archives.get(request.tree)
        if tree is None or tree.parent == hop or tree.replay != db:
            return [(hop, ReplayEnd(rid, db, 0, f"no route to {db} at broker {self.id}"))]
        self._passages[rid, db] = _Passage(hop, tree.parent, request.ready_at + self.timeout)
        return [(tree.parent, request)]

    def answer(self, message: ReplayBatch | ReplayEnd, hop: str) -> list[Out]:
        """An answer coming back from ``hop``: pass it on toward its requester, or deliver it."""
        key = (message.request, message.database)
        passage = self._passages.get(key)
        if passage is None or passage.forward != hop:
            return []  # its requester is gone, or it was given up
        passage.touched = True
        if isinstance(message, ReplayEnd):
            del self._passages[key]
        if passage.back:
            return [(passage.back, message)]
        return self._answered(message)

    def expire(self, now: float) -> list[Out]:
        """Time passes: passages with no answer for too long end (see the class docstring);
        returns what the requests made here that ended pass on to their subscribers."""
        out = self._repair(now)
        for key, passage in list(self._passages.items()):
            if passage.touched:
                passage.touched = False
                passage.deadline = max(passage.deadline, now + self.timeout)
            elif now >= passage.deadline:
                del self._passages[key]
                if not passage.back:
                    why = f"no answer within {self.timeout:g} s"
                    out += self._answered(ReplayEnd(key[0], key[1], 0, why))
        return out

    def hop_down(self, hop: str, why: str) -> list[Out]:
        """A connection is gone: requests sent through it end with ``why``; requests that came
        through it are forgotten."""
        out: list[Out] = []
        for key, passage in list(self._passages.items()):
            if passage.back == hop:
                del self._passages[key]
            elif passage.forward == hop:
                del self._passages[key]
                end = ReplayEnd(key[0], key[1], 0, why)
                out += [(passage.back, end)] if passage.back else self._answered(end)
        return out

    def _answered(self, message: ReplayBatch | ReplayEnd) -> list[Out]:
        gid = self.parts.get(message.request)
        if gid is None:
            return []
        watch = self.watches[gid]
        feed = watch.feeds[message.request]
        if isinstance(message, ReplayBatch):
            bound = self._bounds.get(message.request)
            replayed = message.publications
            if bound is not None:
                replayed = tuple(p for p in replayed if p.timestamp.timestamp() >= bound)
            pubs = feed.replayed(message.database, replayed)
        else:
            pubs = feed.finished(message.database, message.error)
        return watch.deliveries(message.request, pubs) + watch.report()
