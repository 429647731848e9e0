"""One broker's logic as a state machine: a message arrives from a hop, messages go out.

``Broker.handle(message, hop, now)`` returns ``[(hop, message), ...]`` to send. It opens no
socket, starts no thread and reads no clock; the runtime (``padres.runtime``) and the in-process
simulation (``padres.runtime.simulation``) are thin shells that carry its messages.

A *hop* is the runtime's name for one connection: a client or a neighbour broker. Each
connection starts with ``Hello`` (client or broker); a broker link starts when either side calls
``open_link`` and is torn down with ``close``.

Routing, as in PADRES and SIENA, over advertisement trees (see ``trees`` and ``routes``):

- an advertisement floods the overlay along a spanning tree rooted at its publisher's broker;
- a subscription travels up every tree holding an advertisement it overlaps, toward its root;
- a publication travels down the tree of an advertisement it conforms to, to the neighbours
  that sent a matching subscription for that tree, and to local subscribers.

A tree spans the overlay once whatever its cycles, so no publication reaches a broker twice.

An advertisement or subscription is acknowledged to its client once its routing has settled
(see ``padres.broker.echoes``): the publications made after the acknowledgement find their way.

Databases offer to replay what they store; historic and hybrid subscriptions are answered from
them (see ``history``).

Publications made in a transaction are kept at their publisher's broker until it commits or
aborts, and each subscription sees them by its visibility (see ``transactions``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from copy import copy
from itertools import islice
from typing import Final

from msgspec.structs import force_setattr, replace

from padres.broker.config import BrokerConfig
from padres.broker.dead_letters import DeadLetterQueues
from padres.broker.durable import REFRESH, Durables
from padres.broker.echoes import Echoes
from padres.broker.guard import Guard, admin_refusal, routing_filter
from padres.broker.history import History, Watch, composite_network
from padres.broker.journal import Journal, Tag
from padres.broker.memory_journal import MemoryJournal
from padres.broker.routes import Covering, Out, Routes, Sink
from padres.broker.schemas import Declaration, Schemas
from padres.broker.session import LocalAdvertisement, Session
from padres.broker.transactions import Transactions
from padres.broker.trees import Tree, Trees
from padres.broker.visibility import deliveries
from padres.errors import AuthenticationError, SchemaConflict, SchemaLimit
from padres.matching.matcher import conforms
from padres.matching.relations import covers
from padres.matching.rete_matcher import to_composite
from padres.model.messages import (
    MAX_ID,
    Advertisement,
    CompositeSubscription,
    Filter,
    Publication,
    Subscription,
    Unadvertise,
    Unsubscribe,
    check_id,
    quote,
)
from padres.model.printer import format_filter
from padres.model.protocol import (
    Ack,
    CompositeNotify,
    Durable,
    Echo,
    Envelope,
    Error,
    Exceptions,
    Failed,
    Guaranteed,
    Hello,
    Notify,
    Ok,
    Outcome,
    Query,
    QueryResult,
    Recover,
    Recovered,
    ReplayBatch,
    ReplayDone,
    ReplayEnd,
    ReplayOffer,
    ReplayRequest,
    Role,
    RouteAdvertise,
    RoutePublish,
    RouteSchema,
    RouteSubscribe,
    RouteTxPublish,
    RouteUnadvertise,
    RouteUnsubscribe,
    Subscribe,
    TxAbort,
    TxBegin,
    TxCommit,
    TxPublish,
    Visibility,
    Welcome,
)
from padres.model.requests import reference
from padres.security.accounts import Account, Accounts, Credentials
from rete import Network

__all__ = ["COVER_SCAN", "Broker", "Covering", "Out"]

COVER_SCAN: Final = 64
"""Local advertisements of the same class tried as covers of a new one, at most."""

_MARKED: Final = frozenset({RouteSubscribe, RouteAdvertise, ReplayDone})
"""The (exact) types the effects pass tags or ends: a message sending none, as a publication
does, skips it."""
RESYNC: Final = (Advertisement, Unadvertise, RouteUnadvertise)
"""The messages after which a durable subscription may follow a tree it has not yet asked for
what it missed (``Durables.sync``)."""


class Broker:
    """A content-based publish/subscribe broker, without I/O (see the module docstring)."""

    def __init__(
        self,
        broker_id: str,
        config: BrokerConfig | None = None,
        *,
        journal: Journal | None = None,
        accounts: Accounts | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        """``config``: its settings (the defaults if None). ``journal``: where guaranteed
        publications and durable subscriptions are kept (a ``MemoryJournal`` if None, a
        ``SqliteJournal`` to outlive the process); the durable subscriptions it holds are taken
        up at once. ``accounts``: who may connect and what each client may do (``guard``;
        anyone may do anything if None); ``credentials``: what this broker authenticates with
        to the neighbours it links to."""
        config = config or BrokerConfig()
        self.config = config
        self.id = check_id(broker_id, "broker id")
        self.conformity = config.conformity
        self.quotas = config.quotas
        """How many subscriptions and advertisements each client may hold."""
        self.guard = None if accounts is None else Guard(accounts)
        self.credentials = credentials or Credentials()
        self.trees = Trees()
        self.network = Network(config.composites)
        self.routes = Routes(self.trees, self.network, config.covering)
        self.archives = Trees()
        """The trees of the databases' replay offers."""
        self.history = History(
            self.id, self.archives, config.replay_delay, timeout=config.replay_timeout
        )
        self.echoes = Echoes()
        self.limits = config.composites
        self._epoch = config.epoch
        self._counter = 0
        self._sessions: dict[str, Session] = {}
        self._names: set[str] = set()
        self._peers: dict[str, str] = {}
        self._hello_sent: set[str] = set()
        self._admitted: dict[str, Account | None] = {}
        self._local: dict[str, LocalAdvertisement] = {}
        self._offers: dict[str, str] = {}
        """Replay offers made here: id -> the offering client's hop."""
        self._composites: dict[str, tuple[str, str, tuple[str, ...]]] = {}
        self._memory = config.memory
        self._withdrawn: dict[str, float] = {}
        self._withdrawals: deque[tuple[float, str]] = deque()
        self._now = 0.0
        self._refreshed = 0.0
        self.journal = journal if journal is not None else MemoryJournal()
        self.durables = Durables(self.journal, self.routes, self.trees, self.echoes, self._new_id)
        self.durables.restore()
        self.transactions = Transactions(
            self.journal, self._deliver, self._withdraw, config.transactions
        )
        self.schemas = Schemas(self.journal, self.echoes, self.quotas)
        """The schemas of typed classes (kept in the journal, known overlay-wide)."""
        self.dead_letters = DeadLetterQueues(self.journal, self.durables, self._sessions, self.id)

    @property
    def covering(self) -> Covering:
        return self.routes.covering

    @property
    def peers(self) -> dict[str, str]:
        """Neighbour brokers: hop -> broker id."""
        return dict(self._peers)

    @property
    def sessions(self) -> dict[str, Session]:
        return dict(self._sessions)

    def greeted(self, hop: str) -> bool:
        """Whether the connection ``hop`` has been accepted (its ``hello`` taken)."""
        return hop in self._sessions or hop in self._peers

    def publishes(self, hop: str) -> bool:
        """Whether the client on ``hop`` has advertised (flow control holds back publishers
        only: a subscriber's acknowledgements must always get through)."""
        session = self._sessions.get(hop)
        return session is not None and bool(session.advertisements)

    def is_empty(self) -> bool:
        """Whether no routing state is left (no advertisement, subscription or composite)."""
        return not (
            len(self.trees)
            or len(self.archives)
            or len(self.routes)
            or len(self.network)
            or self._local
            or len(self.echoes)
            or len(self.durables)
            or not self.history.is_empty()
        )

    # -- links -------------------------------------------------------------------------------

    def open_link(self, hop: str) -> list[Out]:
        """Start a link to a neighbour broker on ``hop``: greet it."""
        self._hello_sent.add(hop)
        return [(hop, self.credentials.hello(self.id, Role.BROKER))]

    def close(self, hop: str) -> list[Out]:
        """A connection is gone: a client's subscriptions and advertisements go with it; for a
        neighbour, what was learned through it is withdrawn from the rest of the overlay."""
        return self._effects([(h, m) for h, m in self._close(hop) if h != hop], sync=True)

    def _close(self, hop: str) -> list[Out]:
        self._hello_sent.discard(hop)
        self._admitted.pop(hop, None)
        session = self._sessions.pop(hop, None)
        if session is not None:
            self._names.discard(session.name)
            out = self.history.hop_down(hop, f"{session.name} disconnected")
            out += self.echoes.hop_down(hop, f"{session.name} disconnected")
            self.durables.detach(hop)
            self.dead_letters.hop_down(hop)
            for gid in [*session.subscriptions.values(), *session.composites.values()]:
                out += self._drop_subscription(gid)
            # Held while its open transactions wait for it: their publications, committed or
            # aborted, still have the trees to go down.
            advertisements = list(session.advertisements.values())
            if not self.transactions.hold(session, advertisements, self._now):
                for gid in advertisements:
                    out += self._withdraw(gid)
            return out
        name = self._peers.pop(hop, None)
        if name is None:
            return []
        self.routes.brokers.discard(hop)
        why = f"the link from {self.id} to {name} was lost"
        out = self.history.hop_down(hop, why)
        out += self.echoes.hop_down(hop, why)
        out += self.durables.hop_down(hop)
        for trees in (self.trees, self.archives):
            for tree in trees:
                if tree.parent == hop:
                    for aid in list(tree.advertisements):
                        trees.remove(aid)
                        out += self._flood(RouteUnadvertise(aid, tree.id, lost=True), hop)
                    if trees is self.trees:
                        out += self.routes.tree_shrank(tree.id)
        return out + self.routes.hop_down(hop)

    def tick(self, now: float) -> list[Out]:
        """Time passes with no message: requests that waited too long end, and durable
        subscriptions ask again for what they may have missed (every ``REFRESH`` seconds).
        The runtime calls this about once a second."""
        self._now = now
        out = self.history.expire(now) + self.transactions.expire(now)
        out = self._effects(out, sync=True)
        if now - self._refreshed >= REFRESH:
            self._refreshed = now
            out += self._effects(self.durables.refresh())
        return out

    # -- dispatch ----------------------------------------------------------------------------

    def handle(self, message: Envelope, hop: str, now: float = 0.0) -> list[Out]:
        """Process one message from ``hop`` at time ``now`` (Unix seconds: time windows of
        subscriptions are compared with it)."""
        self._now = now
        while self._withdrawals and self._withdrawals[0][0] < now - self._memory:
            self._withdrawn.pop(self._withdrawals.popleft()[1], None)
        session = self._sessions.get(hop)
        if session is not None:
            out = self._from_client(message, session)
        elif hop in self._peers:
            out = self._from_broker(message, hop)
        elif isinstance(message, Hello):
            out = self._hello(message, hop)
        elif isinstance(message, Error):
            return []  # a refused hello, say: never answer an error with an error
        else:
            return [(hop, Error("the first message of a connection must be 'hello'"))]
        return self._effects(out, sync=isinstance(message, RESYNC))

    def _effects(self, outs: list[Out], sync: bool = False) -> list[Out]:
        """What every message and tick ends with, over the messages ``outs`` it sends, in
        their order: historic subscriptions whose past is complete are forgotten (``_ended``);
        with ``sync``, durable subscriptions ask for what they missed on the trees they have
        started to follow (after ``outs``); routing messages get their echo tokens."""
        if sync:
            outs = outs + self.durables.sync()
        if not any(type(message) in _MARKED for _, message in outs):
            return outs
        self._ended(outs)
        return self._tagged(outs)

    def prefetch(self, messages: Iterable[object]) -> None:
        """Match the publications among ``messages``, about to be handled in turn, against
        the routing network together: one pass of its alpha step over all of them."""
        pubs: list[Publication] = []
        for message in messages:
            if isinstance(message, Publication):
                pubs.append(message)
            elif isinstance(message, RoutePublish | RouteTxPublish | Guaranteed):
                pubs.append(message.publication)
        self.routes.prefetch(pubs)

    def _tagged(self, outs: list[Out]) -> list[Out]:
        """Give every routing message to a neighbour its echo token (see
        ``padres.broker.echoes``); those that have one keep it. ``_effects`` tags what a
        message sends; a handler that waits for the tokens of what it sends (``echoes.wait``)
        tags it first."""
        tagged: list[Out] = []
        for hop, message in outs:
            if hop in self._peers:
                if isinstance(message, RouteSubscribe) and not message.echo:
                    sid = message.subscription.id
                    labels = [(sid, (hop, t)) for t in message.trees]
                    message = replace(message, echo=self.echoes.sent(hop, labels))
                elif isinstance(message, RouteAdvertise) and not message.echo:
                    label = (message.advertisement.id, hop)
                    message = replace(message, echo=self.echoes.sent(hop, [label]))
            tagged.append((hop, message))
        return tagged

    def _route_tokens(self, route_id: str, trees: Iterable[str] | None = None) -> set[str]:
        """The echoes a route still waits for: its own forwards toward the roots of ``trees``
        (all its trees when None), or those of the subscriptions it is hidden behind."""
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
            coverer = route.hidden_by.get(slot)
            if token is None and coverer is not None:
                token = self.echoes.pending((coverer, slot))
            if token is not None:
                tokens.add(token)
        return tokens

    def _flood_tokens(self, advertisement_id: str) -> set[str]:
        """The echoes an advertisement's flood still waits for."""
        pending = (self.echoes.pending((advertisement_id, hop)) for hop in self._peers)
        return {token for token in pending if token is not None}

    def admit(self, hop: str, account: Account | None) -> None:
        """Let the ``hello`` of ``hop``, an in-process connection of the runtime (the web API's
        sessions, which authenticated their callers themselves), in without credentials: as
        ``account``, whose grants then apply, or unchecked when None (the runtime's own)."""
        self._admitted[hop] = account

    def _hello(self, hello: Hello, hop: str) -> list[Out]:
        account = None
        if hop in self._admitted and hello.role is Role.CLIENT:
            account = self._admitted.pop(hop)
        elif self.guard is not None:
            try:
                account = self.guard.admit(hello, self.id)
            except AuthenticationError as exc:
                return [(hop, Error(str(exc)))]
        if hello.role is Role.CLIENT:
            if hop in self._hello_sent:  # a link this broker dialled: its frames are trusted
                return [(hop, Error("this connection is a broker link: greet as a broker"))]
            name = f"{hello.name}@{self.id}"
            if len(name) > MAX_ID:  # it is the publisher of the client's publications: an id
                most = MAX_ID - len(self.id) - 1
                why = f"client name {quote(hello.name)} is too long: at most {most} characters here"
                return [(hop, Error(why))]
            if name in self._names:
                return [(hop, Error(f"a client named {hello.name!r} is already connected"))]
            self._names.add(name)
            session = self._sessions[hop] = Session(hop, name, account=account)
            self.transactions.resume(session, self._now)  # back within the linger
            return [(hop, Welcome(self.id, name))]
        if hello.name == self.id:
            return [(hop, Error(f"broker {self.id} cannot link to itself"))]
        self._peers[hop] = hello.name
        self.routes.brokers.add(hop)
        out = [] if hop in self._hello_sent else self.open_link(hop)
        out += self.schemas.offer(hop)
        for tree in [*self.trees, *self.archives]:
            if tree.parent != hop and hello.name not in tree.path:
                out += self._offer_tree(tree, hop)
        return out

    def requires_admin(self, session: Session, action: str, ref: str = "") -> list[Out]:
        """Nothing if ``session`` may ``action`` (a right of administrators, such as declaring
        a schema); else the error to send it."""
        if self.guard is None or session.account is None:
            return []
        grants = self.guard.current(session.account)
        why = admin_refusal(grants, f"user {session.account.name!r}", action)
        return [] if why is None else [(session.hop, Error(why, ref))]

    def _refused(self, message: Envelope, why: str, session: Session) -> list[Out]:
        """A request the client's grants do not allow: an error to it, and nothing else; a
        replay answer that oversteps them ends its request as failed."""
        out: list[Out] = [(session.hop, Error(why, reference(message)))]
        out += self.transactions.refused(session, message, why)
        if isinstance(message, ReplayBatch):
            end = ReplayEnd(message.request, message.database, 0, why)
            out += self.history.answer(end, session.hop)
        return out

    def _from_client(self, message: Envelope, session: Session) -> list[Out]:
        if not isinstance(message, Publication):  # publications count against no quota
            over = self._over_quota(message, session)
            if over is not None:
                return [(session.hop, over)]
        if self.guard is not None and session.account is not None:
            why = self.guard.refusal(message, session.account, self._now)
            if why is not None:
                return self._refused(message, why, session)
        match self.schemas.screen(message):
            case Error() as refused:
                aborted = self.transactions.refused(session, message, refused.text)
                return [(session.hop, refused), *aborted]
            case Declaration() as declaration:
                return self.declare_schema(declaration, session)
        match message:
            case Publication():
                return self._publish(message, session)
            case Guaranteed():
                return self._publish(message.publication, session, guaranteed=True)
            case Durable():
                return self._durable(message, session)
            case Ack():
                return self.durables.ack(session.name, message)
            case Failed() | Exceptions():
                return self.dead_letters.handle(message, session, self._now)
            case Subscription():
                return self._subscribe(message, session)
            case Subscribe():
                return self._subscribe(message.subscription, session, message.visibility)
            case TxBegin():
                return self.transactions.begin(session, message, self._now)
            case TxPublish():
                pub = _stamped(message.publication, session)
                tree = self._tree_for(pub, session, strict=True)
                return self.transactions.publish(session, message, pub, tree, self._now)
            case TxCommit():
                return self.transactions.commit(session, message, self._now)
            case TxAbort():
                return self.transactions.abort(session, message, self._now)
            case CompositeSubscription():
                return self._subscribe_composite(message, session)
            case Advertisement():
                return self._advertise(message, session)
            case Unsubscribe():
                return self._unsubscribe(message, session)
            case Unadvertise():
                return self._unadvertise(message, session)
            case Query():
                return [(session.hop, self._query(message.what))]
            case ReplayOffer():
                return self._offer(message, session)
            case ReplayBatch() | ReplayEnd():
                return self.history.answer(message, session.hop)
            case _:
                kind = type(message).__name__
                return [(session.hop, Error(f"a client may not send {kind} messages"))]

    def _from_broker(self, message: Envelope, hop: str) -> list[Out]:
        match message:
            case RoutePublish():
                tree = self.trees.get(message.tree)
                if tree is None or tree.parent != hop:
                    return []  # along a route left over from an earlier path of the tree
                return self._deliver(message.publication, message.tree, hop, message.position)
            case RouteTxPublish():
                tree = self.trees.get(message.tree)
                if tree is None or tree.parent != hop:
                    return []
                tag = (message.tx, message.outcome)
                return self._deliver(message.publication, tree.id, hop, message.position, tag)
            case Recover():
                return self.durables.forward(message, hop)
            case Recovered():
                return self.durables.answered(message, hop)
            case RouteSubscribe():
                out = self._tagged(self.routes.arrive(message.subscription, hop, message.trees))
                if not message.echo:
                    return out
                tokens = self._route_tokens(message.subscription.id, message.trees)
                return out + self.echoes.wait(tokens, hop, _echo(hop, message.echo))
            case RouteSchema():
                return self.schemas.arrive(message, hop, self._peers)
            case RouteUnsubscribe():
                return self.routes.depart(message.subscription_id, hop, message.trees)
            case RouteAdvertise():
                # Durable subscriptions ask for what they missed before the echo goes back.
                out = self._tagged(self._route_advertise(message, hop) + self.durables.sync())
                if not message.echo:
                    return out
                # Wait only for the flood below a copy from the tree's parent: waiting on
                # copies that crossed a cycle could wait in a circle.
                tree = self._tree_of(message.advertisement.id)
                below = tree is not None and tree.parent == hop
                tokens = self._flood_tokens(message.advertisement.id) if below else set()
                return out + self.echoes.wait(tokens, hop, _echo(hop, message.echo))
            case Echo():
                return self.echoes.echo(message.token, hop, message.incomplete)
            case RouteUnadvertise():
                return self._route_unadvertise(message, hop)
            case ReplayRequest():
                return self.history.forward(message, hop)
            case ReplayBatch() | ReplayEnd():
                return self.history.answer(message, hop)
            case Error():
                return []  # never answer an error with an error
            case _:
                kind = type(message).__name__
                return [(hop, Error(f"a broker link may not carry {kind} messages"))]

    # -- clients -----------------------------------------------------------------------------

    def declare_schema(self, declaration: Declaration, session: Session) -> list[Out]:
        """Declare, widen or drop a class's schema for the client of ``session``: every
        declaration comes here, whatever its form. The client's ``ok`` comes once every
        reachable broker has it."""
        verb = "drop" if declaration.attributes is None else "declare"
        action = f"{verb} the schema of {declaration.class_name}"
        refused = self.requires_admin(session, action, declaration.ref)
        if refused:
            return refused
        try:
            schema = self.schemas.declare(declaration)
        except (SchemaConflict, SchemaLimit) as exc:
            return [(session.hop, Error(str(exc), declaration.ref))]
        out, tokens = ([], set()) if schema is None else self.schemas.flood(schema, self._peers)
        return out + self.echoes.wait(
            tokens, session.hop, lambda inc: (session.hop, Ok(declaration.ref, inc))
        )

    def _new_id(self) -> str:
        self._counter += 1
        return f"{self.id}#{self._epoch}.{self._counter}"

    def _over_quota(self, message: Envelope, session: Session) -> Error | None:
        """The error refusing ``message`` if it would take its client over a quota (a durable
        subscription taken up again is not counted)."""
        if isinstance(message, Durable) and self.durables.has(
            session.name, message.subscription.id
        ):
            return None
        return self.quotas.refusal(message, session, self.durables.owned(session.name))

    def _publish(self, pub: Publication, session: Session, guaranteed: bool = False) -> list[Out]:
        pub = _stamped(pub, session)
        tree = self._tree_for(pub, session, strict=guaranteed)
        if guaranteed:
            if tree is None:
                why = f"guaranteed publication {pub.id!r} conforms to none of your advertisements"
                return [(session.hop, Error(why, pub.id))]
            position, new = self.journal.append(tree, pub, self._now)
            ack: list[Out] = [(session.hop, Ok(pub.id))]
            return self._deliver(pub, tree, session.hop, position) + ack if new else ack
        if tree is None and self.conformity:
            return [
                (
                    session.hop,
                    Error(
                        f"publication {pub.id!r} matches none of the advertisements of "
                        f"{session.name}: advertise what you publish first",
                        pub.id,
                    ),
                )
            ]
        return self._deliver(pub, tree, session.hop)

    def conforming(self, hop: str, pub: Publication) -> bool:
        """Whether the client at ``hop`` may publish ``pub`` as far as conformity goes: it
        conforms to one of its advertisements, or the broker does not check. The one rule the
        core applies, for callers that check before they hand publications over."""
        if not self.conformity:
            return True
        session = self.sessions.get(hop)
        return session is not None and self._tree_for(pub, session) is not None

    def _tree_for(self, pub: Publication, session: Session, strict: bool = False) -> str | None:
        """The tree of an advertisement of the publisher that ``pub`` conforms to.

        Without the conformity check a publication that conforms to none takes the tree of the
        publisher's first advertisement (it reaches the subscriptions routed there only), or,
        with no advertisement at all, reaches local subscribers only. Not when ``strict`` (a
        guaranteed or transactional publication, which must reach every subscriber): None.
        """
        first: str | None = None
        for gid in session.advertisements.values():
            tree = self.trees.tree_of(gid)
            if tree is None:
                continue
            if conforms(tree.advertisements[gid].filter, pub):
                return tree.id
            first = first or tree.id
        return None if self.conformity or strict else first

    def _subscribe(
        self,
        sub: Subscription,
        session: Session,
        visibility: Visibility = Visibility.ON_COMMIT,
    ) -> list[Out]:
        if sub.id in session.subscriptions or sub.id in session.composites:
            return [(session.hop, Error(f"subscription {sub.id!r} already exists", sub.id))]
        if visibility is not Visibility.ON_COMMIT and sub.filter.window is not None:
            why = (
                f"subscription {sub.id!r} has a time window: it sees committed publications "
                f"only, it cannot have visibility {visibility.value}"
            )
            return [(session.hop, Error(why, sub.id))]
        if visibility is not Visibility.ON_COMMIT:
            session.visibility[sub.id] = visibility
        gid = session.subscriptions[sub.id] = self._new_id()
        if sub.filter.window is not None:
            return self._watch(Watch(session.hop, sub.id), gid, [(gid, sub.filter)])
        out = self.routes.add_local(Subscription(gid, sub.filter), session.hop, sub.id)
        out += self.dead_letters.resume(session.name, sub.id)
        return self._acknowledged(out, [gid], session.hop, sub.id)

    def _durable(self, message: Durable, session: Session) -> list[Out]:
        sid = message.subscription.id
        if sid in session.subscriptions or sid in session.composites:
            return [(session.hop, Error(f"subscription {sid!r} already exists", sid))]
        if message.subscription.filter.window is not None:
            why = f"durable subscription {sid!r} cannot have a time window"
            return [(session.hop, Error(why, sid))]
        try:
            out, gid = self.durables.attach(
                session.name,
                session.hop,
                message.subscription,
                message.acked,
                self._now,
                message.visibility,
            )
        except ValueError as exc:
            return [(session.hop, Error(str(exc), sid))]
        out = self._tagged(out + self.durables.sync() + self.dead_letters.resume(session.name, sid))
        tokens = self._route_tokens(gid) | self.durables.pending(gid)
        return out + self.echoes.wait(tokens, session.hop, lambda inc: (session.hop, Ok(sid, inc)))

    def _subscribe_composite(self, sub: CompositeSubscription, session: Session) -> list[Out]:
        if sub.id in session.subscriptions or sub.id in session.composites:
            return [(session.hop, Error(f"subscription {sub.id!r} already exists", sub.id))]
        gid = session.composites[sub.id] = self._new_id()
        if any(flt.window is not None for flt in sub.filters):
            watch = Watch(session.hop, sub.id, network=composite_network(sub, self.limits))
            filters = [(f"{gid}:{i}", routing_filter(f)) for i, f in enumerate(sub.filters)]
            return self._watch(watch, gid, filters)
        self.network.add(gid, to_composite(sub))
        parts = tuple(f"{gid}:{i}" for i in range(len(sub.filters)))
        self._composites[gid] = (session.hop, sub.id, parts)
        out: list[Out] = []
        for pid, flt in zip(parts, sub.filters, strict=True):
            out += self.routes.add_local(Subscription(pid, routing_filter(flt)), session.hop, None)
        return self._acknowledged(out, parts, session.hop, sub.id)

    def _watch(self, watch: Watch, gid: str, parts: list[tuple[str, Filter]]) -> list[Out]:
        """A subscription with a time window: ask the databases for its past, and route the
        parts that reach into the future as live subscriptions whose matches go to history.
        The past is bounded by the subscriber's history grants, if any (``guard``)."""
        account = self._sessions[watch.owner].account
        bounds = {}
        if self.guard is not None and account is not None:
            bounds = {pid: self.guard.not_before(account, flt, self._now) for pid, flt in parts}
        out = self.history.watch(gid, watch, parts, self._now, bounds)
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
        return outs + self.echoes.wait(tokens, hop, lambda inc: (hop, Ok(ref, inc)))

    def _ended(self, outs: list[Out]) -> None:
        """A historic subscription whose past is complete is over: it is forgotten."""
        for hop, message in outs:
            if isinstance(message, ReplayDone) and not message.live:
                session = self._sessions.get(hop)
                if session is None:
                    continue
                gid = session.drop(message.subscription)
                if gid is not None:
                    self.history.unwatch(gid)

    def _unsubscribe(self, unsub: Unsubscribe, session: Session) -> list[Out]:
        sid = unsub.subscription_id
        gid = session.drop(sid)
        if gid is None and self.durables.has(session.name, sid):
            return [*self.durables.drop(session.name, sid), (session.hop, Ok(sid))]
        if gid is None:
            return [(session.hop, Error(f"no subscription {sid!r}", sid))]
        return [*self._drop_subscription(gid), (session.hop, Ok(sid))]

    def _drop_subscription(self, gid: str) -> list[Out]:
        out: list[Out] = []
        if gid in self.history.watches:
            watch = self.history.unwatch(gid)
            for pid, feed in watch.feeds.items():
                if feed.live:
                    out += self.routes.remove_local(pid)
        elif gid in self._composites:
            _, _, parts = self._composites.pop(gid)
            self.network.remove(gid)
            for pid in parts:
                out += self.routes.remove_local(pid)
        else:
            out += self.routes.remove_local(gid)
        return out

    def _advertise(self, adv: Advertisement, session: Session) -> list[Out]:
        if adv.id in session.advertisements:
            return [(session.hop, Error(f"advertisement {adv.id!r} already exists", adv.id))]
        # Each advertising gets an id of its own (a withdrawn one is not taken again), but an
        # advertisement made again by the same publisher keeps its tree: positions in the
        # journal stay meaningful to the durable subscriptions that follow it, and what they
        # were recovering when the publisher left is asked for again when it is back.
        gid = self._new_id()
        tree_id = self.journal.tree_of(session.name, adv.id) or gid
        session.advertisements[adv.id] = gid
        self.journal.remember_tree(session.name, adv.id, tree_id)
        mine = Advertisement(gid, adv.filter)
        hider = self._local_coverer(mine)
        out: list[Out] = []
        if hider is None:
            self._local[gid] = LocalAdvertisement(session.hop, tree_id)
            self.trees.add(mine, tree_id, session.hop, (self.id,))
            out += self._flood(RouteAdvertise(mine, tree_id, (self.id,)))
        else:
            tree = self._local[hider].tree
            self._local[gid] = LocalAdvertisement(session.hop, tree, hidden_by=hider)
            self._local[hider].hides.add(gid)
            self.trees.add(mine, tree, session.hop, (self.id,))
        out = self._tagged(out + self.routes.tree_grew(self._local[gid].tree, adv.filter))
        tokens = self._flood_tokens(hider or gid)
        return out + self.echoes.wait(
            tokens, session.hop, lambda inc: (session.hop, Ok(adv.id, inc))
        )

    def _local_coverer(self, adv: Advertisement) -> str | None:
        if self.covering is Covering.OFF:
            return None
        # Only one of the same class can cover it; covering saves routing state but is never
        # needed, so the search is bounded: advertising stays linear in the advertisements.
        for gid in islice(self.trees.of_class(adv.filter.class_name), COVER_SCAN):
            local = self._local.get(gid)
            if local is not None and local.hidden_by is None:
                tree = self.trees.get(local.tree)
                if tree is not None and covers(tree.advertisements[gid].filter, adv.filter):
                    return gid
        return None

    def _unadvertise(self, unadv: Unadvertise, session: Session) -> list[Out]:
        aid = unadv.advertisement_id
        gid = session.advertisements.pop(aid, None)
        if gid is None:
            return [(session.hop, Error(f"no advertisement {aid!r}", aid))]
        self.journal.forget_tree(session.name, aid)
        return [*self._withdraw(gid), (session.hop, Ok(aid))]

    def _offer(self, offer: ReplayOffer, session: Session) -> list[Out]:
        adv = offer.advertisement
        if adv.id in session.advertisements:
            return [(session.hop, Error(f"advertisement {adv.id!r} already exists", adv.id))]
        gid = session.advertisements[adv.id] = self._new_id()
        self._offers[gid] = session.hop
        tree = self.archives.add(
            Advertisement(gid, adv.filter), gid, session.hop, (self.id,), session.name, offer.period
        )
        out = self._tagged(self._offer_tree(tree))
        tokens = self._flood_tokens(gid)
        return out + self.echoes.wait(
            tokens, session.hop, lambda inc: (session.hop, Ok(adv.id, inc))
        )

    def _offer_tree(self, tree: Tree, hop: str | None = None) -> list[Out]:
        """The tree's advertisements, to ``hop`` or flooded to every neighbour."""
        out: list[Out] = []
        for adv in self._flooded(tree):
            message = RouteAdvertise(adv, tree.id, tree.path, tree.replay, period=tree.period)
            out += [(hop, message)] if hop is not None else self._flood(message)
        return out

    def _withdraw(self, gid: str) -> list[Out]:
        """Withdraw a local advertisement; the ones it hid are flooded (in its tree) first."""
        if self._offers.pop(gid, None) is not None:
            self.archives.remove(gid)
            self._forget(gid)
            return self._flood(RouteUnadvertise(gid, gid))
        out = self._strand(gid)
        local = self._local.pop(gid)
        if local.hidden_by is not None:
            self._local[local.hidden_by].hides.discard(gid)
        else:
            tree = self.trees.holding(gid)
            for hidden in sorted(local.hides):
                self._local[hidden].hidden_by = None
                adv = tree.advertisements[hidden]
                out += self._flood(RouteAdvertise(adv, tree.id, tree.path))
            out += self._flood(RouteUnadvertise(gid, local.tree))
        self._forget(gid)
        self.trees.remove(gid)
        return out + self.routes.tree_shrank(local.tree)

    def _strand(self, gid: str) -> list[Out]:
        """Abort the open transactions that hold a publication only the local advertisement
        ``gid`` takes down its tree: once it is withdrawn, their commit would go nowhere."""
        tree = self.trees.holding(gid)
        rest = [a.filter for aid, a in tree.advertisements.items() if aid != gid]
        return self.transactions.withdrawing(
            tree.id, lambda pub: any(conforms(flt, pub) for flt in rest)
        )

    def _flooded(self, tree: Tree) -> Iterable[Advertisement]:
        """The tree's advertisements that went out (not those hidden here by covering)."""
        for aid, adv in tree.advertisements.items():
            local = self._local.get(aid)
            if local is None or local.hidden_by is None:
                yield adv

    def _flood(self, message: RouteAdvertise | RouteUnadvertise, source: str = "") -> list[Out]:
        path = message.path if isinstance(message, RouteAdvertise) else ()
        peers = self._peers.items()
        return [(hop, message) for hop, name in peers if hop != source and name not in path]

    def _query(self, what: str) -> QueryResult:
        if what == "advertisements":
            rows = [
                f"{adv.id} {format_filter(adv.filter)} tree={tree.id} from={tree.parent}"
                + (f" replay={tree.replay}" if tree.replay else "")
                for tree in [*self.trees, *self.archives]
                for adv in tree.advertisements.values()
            ]
        elif what == "schemas":
            rows = [str(schema) for schema in self.schemas]
        else:
            rows = [
                f"{r.id} {format_filter(r.sub.filter)} "
                f"from={','.join(sorted(r.arrivals)) or r.owner or f'({r.sink})'} "
                f"to={','.join(sorted({hop for hop, _ in r.sent})) or '-'}"
                for r in self.routes
            ]
        return QueryResult(what, tuple(sorted(rows)))

    # -- brokers -----------------------------------------------------------------------------

    def _route_advertise(self, message: RouteAdvertise, hop: str) -> list[Out]:
        adv = message.advertisement
        trees = self.archives if message.replay else self.trees
        if self.id in message.path or adv.id in self._withdrawn or self._tree_of(adv.id):
            return []
        tree = trees.get(message.tree)
        if tree is not None and tree.parent != hop:
            return []  # the copy from the tree's parent is the one that counts
        path = (*message.path, self.id)
        tree = trees.add(adv, message.tree, hop, path, message.replay, message.period)
        forward = RouteAdvertise(adv, tree.id, tree.path, tree.replay, period=tree.period)
        out = self._flood(forward, hop)
        if message.replay:
            return out
        return out + self.routes.tree_grew(tree.id, adv.filter)

    def _tree_of(self, advertisement_id: str) -> Tree | None:
        return self.trees.tree_of(advertisement_id) or self.archives.tree_of(advertisement_id)

    def _route_unadvertise(self, message: RouteUnadvertise, hop: str) -> list[Out]:
        tree = self._tree_of(message.advertisement_id)
        if tree is None:
            return []
        if tree.parent != hop:
            if message.lost and self._peers[hop] not in tree.path:
                # The neighbour lost the tree with a failed link; it can have it through us.
                return self._offer_tree(tree, hop)
            return []
        (self.archives if tree.replay else self.trees).remove(message.advertisement_id)
        if not message.lost:
            self._forget(message.advertisement_id)
        out = self._flood(message, hop)
        return out if tree.replay else out + self.routes.tree_shrank(tree.id)

    def _forget(self, advertisement_id: str) -> None:
        self._withdrawn[advertisement_id] = self._now
        self._withdrawals.append((self._now, advertisement_id))

    # -- publications ------------------------------------------------------------------------

    def _deliver(
        self,
        pub: Publication,
        tree: str | None,
        source: str,
        position: int = 0,
        tag: Tag | None = None,
    ) -> list[Out]:
        """Route ``pub`` down ``tree`` and deliver it here; ``tag``: a transaction's, which
        each subscription sees by its visibility (composite and historic subscriptions see
        committed ones only)."""
        committed = tag is None or tag[1] is Outcome.COMMITTED
        matches = self.routes.match(pub, tree, source, composites=committed)
        out: list[Out] = []
        if tree is not None and matches.hops:
            message: RoutePublish | RouteTxPublish = (
                RoutePublish(pub, tree, position)
                if tag is None
                else RouteTxPublish(pub, tree, tag[0], tag[1], position)
            )
            out += [(hop, message) for hop in sorted(matches.hops)]
        for gid in matches.durables:
            out += self.durables.arrived(gid, pub, tree, position, tag)
        if committed:
            for pid in matches.watches:
                out += self.history.arrived(pid, pub)
        if tag is None:
            out += [(client, Notify(pub, tuple(ids))) for client, ids in matches.clients.items()]
        else:
            out += deliveries(pub, matches.clients, tag, self._visibility)
        for activation in matches.activations:
            owner, local_id, _ = self._composites[activation.id]
            facts: tuple[Publication, ...] = activation.facts
            out.append((owner, CompositeNotify(local_id, facts, activation.bindings)))
        return out

    def _visibility(self, hop: str, subscription: str) -> Visibility:
        session = self._sessions.get(hop)
        if session is None:
            return Visibility.ON_COMMIT
        return session.visibility.get(subscription, Visibility.ON_COMMIT)


def _stamped(pub: Publication, session: Session) -> Publication:
    """``pub`` with its publisher: the client of ``session``, whatever it said. The copy is not
    checked again (``replace`` would: a tenth of a publisher's broker's time): only the
    publisher changes, to a session name, which is valid."""
    if pub.publisher == session.name:
        return pub
    stamped = copy(pub)
    force_setattr(stamped, "publisher", session.name)
    return stamped


def _echo(hop: str, token: str) -> Callable[[tuple[str, ...]], Out]:
    return lambda incomplete: (hop, Echo(token, incomplete))
