"""Subscribing: the subscriptions made at a broker, and those its neighbours route through it.

A client's subscription is routed up every tree holding an advertisement it overlaps
(``routes``). A durable one is kept in the journal and catches up on what it missed
(``durable``). A composite one is matched here, by the broker's Rete network; its parts are
routed as plain subscriptions; a durable composite one is matched by a network of its own,
kept in the journal (``durable_composites``). One with a time window is *watched*
(``history``): its past is asked of the databases, and the parts that reach into the future
are routed for their live publications; a composite with a sequence or a window reads one
time range, its parts' past and live publications matched as one stream in timestamp order.
The client's ``ok`` comes once the routes have settled (``echoes``); so does the echo of a
subscription a neighbour sent up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

from padres.broker.dead_letters import DeadLetterQueues
from padres.broker.durable import Durables
from padres.broker.echoes import Echoes
from padres.broker.guard import Guard, routing_filter
from padres.broker.history import History, Watch, composite_watch
from padres.broker.routes import Out, Routes, Sink
from padres.broker.session import Session
from padres.broker.trees import Trees
from padres.matching.rete_matcher import to_condition
from padres.model.messages import CompositeSubscription, Filter, Subscription, Unsubscribe
from padres.model.protocol import Durable, Error, Ok, RouteSubscribe, Scope, Visibility
from padres.security.accounts import Account
from rete import CompositeLimits, Network

__all__ = ["LocalComposite", "Subscribing"]


class LocalComposite(NamedTuple):
    """A composite subscription made at this broker, matched here."""

    owner: str
    """Its client's hop."""
    local_id: str
    """The client's id for it."""
    parts: tuple[str, ...]
    """The overlay-wide ids of its parts, routed as plain subscriptions."""


class Subscribing:
    """The subscriptions of a broker's clients, and the routing of its neighbours'."""

    def __init__(
        self,
        routes: Routes,
        trees: Trees,
        network: Network,
        limits: CompositeLimits,
        echoes: Echoes,
        history: History,
        durables: Durables,
        dead_letters: DeadLetterQueues,
        guard: Guard | None,
        tagged: Callable[[list[Out]], list[Out]],
        new_id: Callable[[], str],
    ) -> None:
        """``network``: matches the composite subscriptions, within ``limits``; ``guard``:
        bounds the past a subscriber may read (None: any); ``tagged``: the messages given,
        routing messages to neighbours with their echo tokens; ``new_id``: a new overlay-wide
        id."""
        self.routes = routes
        self.trees = trees
        self.network = network
        self.limits = limits
        self.echoes = echoes
        self.history = history
        self.durables = durables
        self.dead_letters = dead_letters
        self.guard = guard
        self._tagged = tagged
        self._new_id = new_id
        self.composites: dict[str, LocalComposite] = {}
        """The composite subscriptions matched here (watched ones are not), by overlay-wide
        id."""

    # -- clients -----------------------------------------------------------------------------

    def subscribe(
        self,
        sub: Subscription,
        session: Session,
        now: float,
        visibility: Visibility = Visibility.ON_COMMIT,
        priority: int = 0,
        scope: Scope = Scope.GLOBAL,
        group: str = "",
    ) -> list[Out]:
        """A plain subscription of a client; ``group``: the id its deliveries name, shared
        with the other subscriptions of the group (``Subscribe.group``)."""
        taken = _taken(sub.id, session)
        if taken:
            return taken
        if group:
            why = _ungroupable(sub, group, session)
            if why is not None:
                return [(session.hop, Error(why, sub.id))]
        if sub.filter.window is not None:
            why = _windowed(sub.id, visibility, priority, scope)
            if why is not None:
                return [(session.hop, Error(why, sub.id))]
        if visibility is not Visibility.ON_COMMIT:
            session.visibility[sub.id] = visibility
        gid = session.subscriptions[sub.id] = self._new_id()
        if sub.filter.window is not None:
            watch = Watch(session.hop, sub.id)
            return self._watch(watch, gid, [(gid, sub.filter)], session.account, now)
        out = self.routes.add_local(
            Subscription(gid, sub.filter),
            session.hop,
            group or sub.id,
            priority=priority,
            local=scope is Scope.LOCAL,
            grouped=bool(group),
        )
        out += self.dead_letters.resume(session.name, sub.id)
        return self._acknowledged(out, [gid], session.hop, sub.id)

    def durable(self, message: Durable, session: Session, now: float) -> list[Out]:
        sub = message.subscription
        sid = sub.id
        taken = _taken(sid, session)
        if taken:
            return taken
        why = _not_durable(message)
        if why is not None:
            return [(session.hop, Error(why, sid))]
        try:
            out, gid = self.durables.attach(
                session.name,
                session.hop,
                message.subscription,
                message.acked,
                now,
                message.visibility,
                message.roam,
                message.priority,
                message.scope,
            )
        except ValueError as exc:
            return [(session.hop, Error(str(exc), sid))]
        out = self._tagged(out + self.durables.sync() + self.dead_letters.resume(session.name, sid))
        tokens = self.durables.pending(gid)
        for rid in self.durables.route_ids(gid):
            tokens |= self._route_tokens(rid)
        return out + self.echoes.ok(tokens, session.hop, sid)

    def subscribe_composite(
        self, sub: CompositeSubscription, session: Session, now: float
    ) -> list[Out]:
        taken = _taken(sub.id, session)
        if taken:
            return taken
        windows = [flt.window for flt in sub.filters]
        if sub.timing is not None and any(w != windows[0] for w in windows):
            why = (
                f"composite subscription {sub.id!r}: a sequence or a window (within, late, "
                "consume) reads one time range: give every part the same time predicates"
            )
            return [(session.hop, Error(why, sub.id))]
        gid = session.composites[sub.id] = self._new_id()
        if any(w is not None for w in windows):
            watch = composite_watch(session.hop, sub, self.limits, now)
            filters = [(f"{gid}:{i}", routing_filter(f)) for i, f in enumerate(sub.filters)]
            return self._watch(watch, gid, filters, session.account, now)
        self.network.add(gid, to_condition(sub))
        parts = tuple(f"{gid}:{i}" for i in range(len(sub.filters)))
        self.composites[gid] = LocalComposite(session.hop, sub.id, parts)
        out: list[Out] = []
        for pid, flt in zip(parts, sub.filters, strict=True):
            out += self.routes.add_local(Subscription(pid, routing_filter(flt)), session.hop, None)
        return self._acknowledged(out, parts, session.hop, sub.id)

    def _watch(
        self,
        watch: Watch,
        gid: str,
        parts: list[tuple[str, Filter]],
        account: Account | None,
        now: float,
    ) -> list[Out]:
        """A subscription with a time window: ask the databases for its past, and route the
        parts that reach into the future as live subscriptions whose matches go to history.
        The past is bounded by the history grants of the subscriber's ``account``, if any
        (``guard``)."""
        bounds: dict[str, float | None] = {}
        if self.guard is not None and account is not None:
            bounds = {pid: self.guard.not_before(account, flt, now) for pid, flt in parts}
        known = [b for b in bounds.values() if b is not None]
        if watch.timeline is not None and known:
            bounds = dict.fromkeys(bounds, max(known))  # one range: the narrowest grant's
        out = self.history.watch(gid, watch, parts, now, bounds)
        live = [pid for pid, _ in parts if watch.feeds[pid].live]
        for pid, flt in parts:
            if pid in live:
                out += self.routes.add_own(Subscription(pid, flt), Sink.HISTORY)
        out = self._acknowledged(out, live, watch.owner, watch.local_id)
        return [*out, *watch.report()]

    def _acknowledged(
        self, outs: list[Out], route_ids: Iterable[str], hop: str, ref: str
    ) -> list[Out]:
        """``outs``, and ``Ok(ref)`` to ``hop`` once the routes ``route_ids`` have settled."""
        outs = self._tagged(outs)
        tokens: set[str] = set()
        for rid in route_ids:
            tokens |= self._route_tokens(rid)
        return outs + self.echoes.ok(tokens, hop, ref)

    def unsubscribe(self, unsub: Unsubscribe, session: Session) -> list[Out]:
        sid = unsub.subscription_id
        gid = session.drop(sid)
        if gid is None and self.durables.has(session.name, sid):
            return [*self.durables.drop(session.name, sid), (session.hop, Ok(sid))]
        if gid is None:
            return [(session.hop, Error(f"no subscription {sid!r}", sid))]
        return [*self.drop(gid), (session.hop, Ok(sid))]

    def drop(self, *gids: str) -> list[Out]:
        """Forget the subscriptions of overlay-wide ids ``gids`` (plain, composite or watched)
        and withdraw their routes, together (``Routes.remove_local``)."""
        routes: list[str] = []
        for gid in gids:
            if gid in self.history.watches:
                watch = self.history.unwatch(gid)
                routes += (pid for pid, feed in watch.feeds.items() if feed.live)
            elif gid in self.composites:
                self.network.remove(gid)
                routes += self.composites.pop(gid).parts
            else:
                routes.append(gid)
        return self.routes.remove_local(*routes)

    # -- neighbours --------------------------------------------------------------------------

    def arrive(self, message: RouteSubscribe, hop: str) -> list[Out]:
        """A subscription sent up by the neighbour on ``hop``: routed on toward the roots of
        its trees; the echo goes back once those forwards have settled."""
        out = self._tagged(self.routes.arrive(message.subscription, hop, message.trees))
        if not message.echo:
            return out
        tokens = self._route_tokens(message.subscription.id, message.trees)
        return out + self.echoes.relay(tokens, hop, message.echo)

    def _route_tokens(self, route_id: str, trees: Iterable[str] | None = None) -> set[str]:
        """The echoes a route still waits for: its own forwards toward the roots of ``trees``
        (all its trees when None), or those of the subscriptions standing for it there (it
        is hidden behind one, or merged into one)."""
        route = self.routes.get(route_id)
        if route is None:
            return set()
        if trees is None:
            trees = set(route.trees).union(*route.arrivals.values())
        tokens: set[str] = set()
        for t in trees:
            tree = self.trees.get(t)
            if tree is None:
                continue
            slot = (tree.parent, t)
            token = self.echoes.pending((route_id, slot))
            if token is None:
                token = self.echoes.pending((self.routes.carrier(route_id, slot), slot))
            if token is not None:
                tokens.add(token)
        return tokens


def _windowed(sid: str, visibility: Visibility, priority: int, scope: Scope) -> str | None:
    """Why a subscription with a time window cannot have these options, if it cannot: its
    past comes from the databases, wherever they are, as a replay of its own."""
    what = f"subscription {sid!r} has a time window"
    if visibility is not Visibility.ON_COMMIT:
        return (
            f"{what}: it sees committed publications only, it cannot have visibility "
            f"{visibility.value}"
        )
    if scope is not Scope.GLOBAL:
        return f"{what}: its past comes from databases anywhere, it cannot have scope local"
    if priority:
        return f"{what}: its deliveries come from a replay of their own, it cannot have a priority"
    return None


def _not_durable(message: Durable) -> str | None:
    """Why the subscription of ``message`` cannot be durable, if it cannot."""
    sub = message.subscription
    if isinstance(sub, Subscription):
        if sub.filter.window is not None:
            return f"durable subscription {sub.id!r} cannot have a time window"
        return None
    if any(flt.window is not None for flt in sub.filters):
        return (
            f"durable composite subscription {sub.id!r} is matched on live publications "
            "only: its parts cannot have time predicates"
        )
    if message.visibility is not Visibility.ON_COMMIT:
        return (
            f"composite subscription {sub.id!r} sees committed publications only: it "
            f"cannot have visibility {message.visibility.value}"
        )
    if message.priority or message.scope is not Scope.GLOBAL:
        return f"composite subscription {sub.id!r} cannot have a priority or a scope"
    return None


def _taken(sid: str, session: Session) -> list[Out]:
    """The error refusing a new subscription ``sid`` if the client has one by that id."""
    if sid in session.subscriptions or sid in session.composites:
        return [(session.hop, Error(f"subscription {sid!r} already exists", sid))]
    return []


def _ungroupable(sub: Subscription, group: str, session: Session) -> str | None:
    """Why ``sub`` cannot join ``group`` of ``session``'s client, or None."""
    if group in session.subscriptions or group in session.composites:
        return f"subscription {sub.id!r} cannot join group {group!r}: a subscription has its id"
    if sub.filter.window is not None:
        return (
            f"subscription {sub.id!r} cannot join group {group!r}: one with a time window "
            "is made on its own"
        )
    return None
