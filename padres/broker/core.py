"""One broker's logic as a state machine: a message arrives from a hop, messages go out.

``Broker.handle(message, hop, now)`` returns ``[(hop, message), ...]`` to send. It opens no
socket, starts no thread and reads no clock; the runtime (``padres.runtime``) and the in-process
simulation (``padres.runtime.simulation``) are thin shells that carry its messages.

A *hop* is the runtime's name for one connection: a client or a neighbour broker. Each
connection starts with ``Hello`` (client or broker); a broker link starts when either side calls
``open_link`` and is torn down with ``close`` (see ``links``).

Routing, as in PADRES and SIENA, over advertisement trees (see ``trees`` and ``routes``):

- an advertisement floods the overlay along a spanning tree rooted at its publisher's broker
  (``advertising``);
- a subscription travels up every tree holding an advertisement it overlaps, toward its root
  (``subscribing``);
- a publication travels down the tree of an advertisement it conforms to, to the neighbours
  that sent a matching subscription for that tree, and to local subscribers (``publishing``).

A tree spans the overlay once whatever its cycles, so no publication reaches a broker twice.

An advertisement or subscription is acknowledged to its client once its routing has settled
(see ``padres.broker.echoes``): the publications made after the acknowledgement find their way.

Databases offer to replay what they store; historic and hybrid subscriptions are answered from
them (see ``history``).

Publications made in a transaction are kept at their publisher's broker until it commits or
aborts, and each subscription sees them by its visibility (see ``transactions``); a consumer's
transaction may join it as a part, kept at the consumer's broker (see ``parts``).

This module holds the ``Broker`` itself: its parts wired together, its clients' sessions, the
dispatch of each message to the part it concerns, the one pass every message ends with
(``Broker._effects``), and the answers to queries.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from msgspec.structs import replace

from padres.broker.advertising import Advertising
from padres.broker.config import BrokerConfig
from padres.broker.congestion import Congestion
from padres.broker.dead_letters import DeadLetterQueues
from padres.broker.durable import REFRESH, Durables
from padres.broker.echoes import Echoes
from padres.broker.guard import Guard, admin_refusal
from padres.broker.history import History
from padres.broker.journal import Journal
from padres.broker.links import Links
from padres.broker.losses import Losses, Tally
from padres.broker.memory_journal import MemoryJournal
from padres.broker.parts import Ways
from padres.broker.paths import LinkState, Paths
from padres.broker.publishing import Publishing
from padres.broker.releases import Releases
from padres.broker.routes import Covering, Out, Routes
from padres.broker.schemas import Declaration, Schemas
from padres.broker.session import Session, stamped
from padres.broker.subscribing import Subscribing
from padres.broker.transactions import Transactions
from padres.broker.trees import Trees
from padres.broker.votes import Votes
from padres.errors import AuthenticationError, SchemaConflict, SchemaLimit
from padres.model.messages import (
    MAX_ID,
    Advertisement,
    CompositeSubscription,
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
    Durable,
    Echo,
    Envelope,
    Error,
    Exceptions,
    Failed,
    Guaranteed,
    Hello,
    LinkPing,
    LinkPong,
    Ok,
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
    RouteCongestion,
    RouteDrain,
    RouteLoss,
    RoutePath,
    RoutePublish,
    RouteRelease,
    RouteSchema,
    RouteSubscribe,
    RouteTxOutcome,
    RouteTxPart,
    RouteTxPublish,
    RouteTxVote,
    RouteUnadvertise,
    RouteUnsubscribe,
    RouteVersion,
    Subscribe,
    TxAbort,
    TxBegin,
    TxCommit,
    TxPublish,
    TxVote,
    Welcome,
)
from padres.model.requests import reference
from padres.security.accounts import Account, Accounts, Credentials
from rete import Network

__all__ = ["Broker", "Covering", "Out"]

_MARKED: Final = frozenset({RouteSubscribe, RouteAdvertise, ReplayDone})
"""The (exact) types the effects pass tags or ends: a message sending none, as a publication
does, skips it."""
RESYNC: Final = (Advertisement, Unadvertise, RouteUnadvertise, RoutePath)
"""The messages after which a durable subscription may follow a tree it has not yet asked for
what it missed, or one that came along another way (``Durables.sync``)."""


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
        self.routes = Routes(
            self.trees, self.network, config.covering, config.merging, self._new_id
        )
        self.archives = Trees()
        """The trees of the databases' replay offers."""
        self.history = History(
            self.id,
            self.trees,
            self.archives,
            config.replay_delay,
            lambda: self._now,
            timeout=config.replay_timeout,
        )
        self.echoes = Echoes()
        self.limits = config.composites
        self._epoch = config.epoch
        self._counter = 0
        self._sessions: dict[str, Session] = {}
        self._names: set[str] = set()
        self._peers: dict[str, str] = {}
        """Neighbour brokers: hop -> broker id (``links`` keeps it)."""
        self._admitted: dict[str, Account | None] = {}
        self._now = 0.0
        self._refreshed = 0.0
        self.journal = journal if journal is not None else MemoryJournal()
        self.durables = Durables(
            self.journal,
            self.routes,
            self.trees,
            self.echoes,
            self._new_id,
            lambda: self._now,
            self.quotas,
            config.composites,
            config.durable_expiry,
        )
        self.durables.restore()
        self.paths = Paths(
            self.id,
            self.trees,
            self.routes,
            self.durables,
            self.echoes,
            self._peers,
            self._new_id,
            config.switching,
        )
        """The ways to the roots of the trees, measured, and the moves between them."""
        self.schemas = Schemas(self.journal, self.echoes, self.quotas)
        """The schemas of typed classes (kept in the journal, known overlay-wide)."""
        self.releases = Releases(self.id, self.durables, self._peers, self._new_id)
        self.congestion = Congestion(self.id, self._epoch, self._peers)
        """Which brokers of the overlay have a congested link (the runtime says of this one)."""
        self.losses = Losses(self.id, self.trees, self._peers, self._sessions)
        """Reports of plain publications dropped on links, on their way to their publishers."""
        self.dead_letters = DeadLetterQueues(self.journal, self.durables, self._sessions, self.id)
        self.subscribing = Subscribing(
            self.routes,
            self.trees,
            self.network,
            self.limits,
            self.echoes,
            self.history,
            self.durables,
            self.dead_letters,
            self.guard,
            self._tagged,
            self._new_id,
        )
        self.votes = Votes(
            self.trees, self._peers, lambda vote: self.transactions.vote(vote, self._now)
        )
        """Consumers' votes on transactions, on their way to the producers' brokers."""
        self.publishing = Publishing(
            self.routes,
            self.trees,
            self.journal,
            self.durables,
            self.history,
            self._sessions,
            self.subscribing.composites,
            self.conformity,
            self.votes,
            self.paths,
            self.echoes,
        )
        # Transactions and advertising call on each other: withdrawing an advertisement aborts
        # the transactions it strands, and the end of a client's last transaction withdraws
        # the advertisements held for it.
        self.transactions = Transactions(
            self.journal,
            self.publishing.deliver,
            lambda gid: self.advertising.withdraw(gid, self._now),
            config.transactions,
            ways=Ways(self.id, self._peers),
            votes=self.votes,
            clock=lambda: self._now,
        )
        self.transactions.restore()
        self.advertising = Advertising(
            self.id,
            self.trees,
            self.archives,
            self.routes,
            self.echoes,
            self.journal,
            self.durables,
            self.transactions,
            self.history,
            self.paths,
            self._peers,
            self._tagged,
            self._new_id,
            config.memory,
        )
        self.links = Links(
            self.id,
            self.credentials,
            self._peers,
            self.routes,
            self.schemas,
            self.history,
            self.echoes,
            self.durables,
            self.advertising,
        )

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

    def connected(self, client: str) -> bool:
        """Whether a client named ``client`` (as its ``hello`` says) is connected here."""
        return f"{client}@{self.id}" in self._names

    def replays(self, hop: str) -> bool:
        """Whether the client on ``hop`` has offered to replay what it stores (a database or
        an archive node)."""
        return self.advertising.offers_from(hop)

    def publishes(self, hop: str) -> bool:
        """Whether the client on ``hop`` has advertised (flow control holds back publishers
        only: a subscriber's acknowledgements must always get through)."""
        session = self._sessions.get(hop)
        return session is not None and bool(session.advertisements)

    def conforming(self, hop: str, pub: Publication) -> bool:
        """Whether the client at ``hop`` may publish ``pub`` as far as conformity goes: it
        conforms to one of its advertisements, or the broker does not check. The one rule the
        core applies, for callers that check before they hand publications over."""
        if not self.conformity:
            return True
        session = self._sessions.get(hop)
        return session is not None and self.publishing.tree_for(pub, session) is not None

    def is_empty(self) -> bool:
        """Whether no routing state is left (no advertisement, subscription or composite)."""
        return not (
            len(self.trees)
            or len(self.archives)
            or len(self.routes)
            or len(self.routes.mergers)
            or len(self.network)
            or len(self.advertising)
            or len(self.echoes)
            or len(self.durables)
            or not self.history.is_empty()
        )

    # -- connections -------------------------------------------------------------------------

    def open_link(self, hop: str) -> list[Out]:
        """Start a link to a neighbour broker on ``hop``: greet it."""
        return self.links.open_link(hop)

    def admit(self, hop: str, account: Account | None) -> None:
        """Let the ``hello`` of ``hop``, an in-process connection of the runtime (the web API's
        sessions, which authenticated their callers themselves), in without credentials: as
        ``account``, whose grants then apply, or unchecked when None (the runtime's own)."""
        self._admitted[hop] = account

    def close(self, hop: str) -> list[Out]:
        """A connection is gone: a client's subscriptions and advertisements go with it; for a
        neighbour, what was learned through it is withdrawn from the rest of the overlay."""
        return self._effects([(h, m) for h, m in self._close(hop) if h != hop], sync=True)

    def _close(self, hop: str) -> list[Out]:
        out = self.links.close(hop, self._now)  # nothing unless ``hop`` is a neighbour's link
        self._admitted.pop(hop, None)
        session = self._sessions.pop(hop, None)
        if session is None:
            return out
        self._names.discard(session.name)
        why = f"{session.name} disconnected"
        out += self.history.hop_down(hop, why)
        out += self.echoes.hop_down(hop, why)
        self.durables.detach(hop)
        self.dead_letters.hop_down(hop)
        out += self.votes.gone(session)
        out += self.subscribing.drop(*session.subscriptions.values(), *session.composites.values())
        # Held while its open transactions wait for it: their publications, committed or
        # aborted, still have the trees to go down.
        advertisements = list(session.advertisements.values())
        if not self.transactions.hold(session, advertisements, self._now):
            for gid in advertisements:
                out += self.advertising.withdraw(gid, self._now)
        return out

    def _hello(self, hello: Hello, hop: str) -> list[Out]:
        account = None
        if hop in self._admitted and hello.role is Role.CLIENT:
            account = self._admitted.pop(hop)
        elif self.guard is not None:
            try:
                account = self.guard.admit(hello, self.id)
            except AuthenticationError as exc:
                return [(hop, Error(str(exc)))]
        if hello.role is not Role.CLIENT:
            return self.links.hello(hello, hop)
        if self.links.dialled(hop):  # a link this broker dialled: its frames are trusted
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

    def drop_durable(self, owner: str, name: str) -> list[Out] | None:
        """An administrator deletes durable subscription ``name`` of client ``owner``, with
        what it queued (its client, if connected, is told with an ``error``); None if there
        is no such subscription here."""
        if not self.durables.has(owner, name):
            return None
        hop = self.durables.hop_of(owner, name)
        out = self.durables.drop(owner, name)
        if hop is not None:
            why = f"durable subscription {name!r} was deleted by an administrator"
            out.append((hop, Error(why, name)))
        return self._effects(out)

    def lost(self, neighbour: str, tally: Tally, reason: str) -> list[Out]:
        """The runtime's link to broker ``neighbour`` ended for ``reason`` with the plain
        publications of ``tally`` unsent: their publishers are told (``losses``)."""
        return self.losses.report(neighbour, tally, reason)

    def measured(self, links: dict[str, LinkState], now: float) -> list[Out]:
        """The runtime measured the links to the neighbours (by hop): trees move to better
        ways to their roots (``paths``). The runtime calls this a few times a second."""
        self._now = now
        out = self.paths.measured(links, now)
        return self._effects(out, sync=True) if out else out  # a move sends something

    def tick(self, now: float) -> list[Out]:
        """Time passes with no message: requests that waited too long end, and durable
        subscriptions ask again for what they may have missed, or expire if their client has
        been away too long (every ``REFRESH`` seconds).
        The runtime calls this about once a second."""
        self._now = now
        out = self.paths.tick(now) + self.history.expire(now) + self.transactions.expire(now)
        out = self._effects(out, sync=True)
        out += self.publishing.windows_closed(now)
        if now - self._refreshed >= REFRESH:
            self._refreshed = now
            out += self._effects(self.durables.expire() + self.durables.refresh())
        return out

    # -- dispatch ----------------------------------------------------------------------------

    def handle(self, message: Envelope, hop: str, now: float = 0.0) -> list[Out]:
        """Process one message from ``hop`` at time ``now`` (Unix seconds: time windows of
        subscriptions are compared with it)."""
        self._now = now
        self.advertising.expire(now)
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

    def prefetch(self, messages: Iterable[object], hop: str = "") -> None:
        """Match the publications among ``messages`` from ``hop``, about to be handled in
        turn, against the routing network together: one pass of its alpha step over all of
        them (but those the neighbour matched for this broker)."""
        pubs: list[Publication] = []
        for message in messages:
            if isinstance(message, Publication):
                pubs.append(message)
            elif isinstance(message, RoutePublish) and self.publishing.trusts(message, hop):
                continue  # the neighbour matched it for this broker: see ``Routes.match``
            elif isinstance(message, RoutePublish | RouteTxPublish | Guaranteed):
                pubs.append(message.publication)
        self.routes.prefetch(pubs)

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
        now = self._now
        match message:
            case Publication():
                return self.publishing.publish(message, session, now)
            case Guaranteed():
                return self.publishing.publish(message.publication, session, now, guaranteed=True)
            case Durable():
                return self._durable(message, session, now)
            case Ack():
                return self.durables.ack(session.name, message)
            case Failed() | Exceptions():
                return self.dead_letters.handle(message, session, now)
            case Subscription():
                return self.subscribing.subscribe(message, session, now)
            case Subscribe():
                return self.subscribing.subscribe(
                    message.subscription,
                    session,
                    now,
                    message.visibility,
                    message.priority,
                    message.scope,
                    message.group,
                )
            case TxBegin():
                return self.transactions.begin(session, message, now)
            case TxPublish():
                pub = stamped(message.publication, session)
                tree = self.publishing.tree_for(pub, session, strict=True)
                return self.transactions.publish(session, message, pub, tree, now)
            case TxCommit():
                return self.transactions.commit(session, message, now)
            case TxAbort():
                return self.transactions.abort(session, message, now)
            case TxVote():
                return self.votes.vote(session, message)
            case CompositeSubscription():
                out = self.subscribing.subscribe_composite(message, session, now)
                # Its windows follow the broker's clock from the start, not from the next tick.
                return out + self.publishing.windows_closed(now)
            case Advertisement():
                return self.advertising.advertise(message, session)
            case Unsubscribe():
                return self.subscribing.unsubscribe(message, session)
            case Unadvertise():
                return self.advertising.unadvertise(message, session, now)
            case Query():
                return [(session.hop, self._query(message.what))]
            case ReplayOffer():
                return self.advertising.offer(message, session)
            case ReplayBatch() | ReplayEnd():
                return self.history.answer(message, session.hop)
            case _:
                kind = type(message).__name__
                return [(session.hop, Error(f"a client may not send {kind} messages"))]

    def _from_broker(self, message: Envelope, hop: str) -> list[Out]:
        match message:
            case RoutePublish() | RouteTxPublish():
                return self.publishing.arrive(message, hop, self._now)
            case Recover():
                return self.durables.forward(message, hop)
            case Recovered():
                return self.durables.answered(message, hop)
            case RouteSubscribe():
                return self.subscribing.arrive(message, hop)
            case RouteSchema():
                return self.schemas.arrive(message, hop, self._peers)
            case RouteRelease():
                return self.releases.arrive(message, hop)
            case RouteTxVote():
                return self.votes.route(message, hop)
            case RouteTxPart():
                return self.transactions.part_message(message)
            case RouteTxOutcome():
                return self.transactions.outcome_message(message)
            case RouteCongestion():
                return self.congestion.arrive(message, hop, self._now)
            case RouteLoss():
                return self.losses.arrive(message, hop)
            case RouteUnsubscribe():
                return self.routes.depart(message.subscription_id, hop, message.trees)
            case RouteAdvertise():
                return self.advertising.arrive(message, hop, self._now)
            case RoutePath():
                return self.paths.path(message, hop, self._now)
            case RouteDrain():
                return self.paths.drain(message, hop, self._now)
            case RouteVersion():
                return self.paths.version(message, hop, self._now)
            case LinkPing() | LinkPong():
                return []  # the runtime's measures of the link, answered before the core
            case Echo():
                return self.echoes.echo(message.token, hop, message.incomplete)
            case RouteUnadvertise():
                return self.advertising.depart(message, hop, self._now)
            case ReplayRequest():
                return self.history.forward(message, hop)
            case ReplayBatch() | ReplayEnd():
                return self.history.answer(message, hop)
            case Error():
                return []  # never answer an error with an error
            case _:
                kind = type(message).__name__
                return [(hop, Error(f"a broker link may not carry {kind} messages"))]

    # -- effects -----------------------------------------------------------------------------

    def _effects(self, outs: list[Out], sync: bool = False) -> list[Out]:
        """What every message and tick ends with, over the messages ``outs`` it sends, in
        their order: historic subscriptions whose past is complete are forgotten (``_ended``);
        with ``sync``, durable subscriptions ask for what they missed on the trees they have
        started to follow (after ``outs``); routing messages get their echo tokens."""
        if sync:
            outs = outs + self.durables.sync()
        for _, message in outs:
            if type(message) in _MARKED:
                self._ended(outs)
                return self._tagged(outs)
        return outs

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

    # -- sessions ----------------------------------------------------------------------------

    def _new_id(self) -> str:
        self._counter += 1
        return f"{self.id}#{self._epoch}.{self._counter}"

    def _durable(self, message: Durable, session: Session, now: float) -> list[Out]:
        """Make or resume a durable subscription; one brought from another broker is let go
        of there (``releases``)."""
        out = self.subscribing.durable(message, session, now)
        if isinstance(message.subscription, CompositeSubscription):
            out += self.publishing.windows_closed(now)  # as for a composite: see ``handle``
        sid, roam = message.subscription.id, message.roam
        if roam is None or not self.durables.has(session.name, sid):
            return out
        client = session.name.removesuffix(f"@{self.id}")
        return out + self.releases.moved(roam.left, client, sid)

    def _over_quota(self, message: Envelope, session: Session) -> Error | None:
        """The error refusing ``message`` if it would take its client over a quota (a durable
        subscription taken up again is not counted)."""
        if isinstance(message, Durable) and self.durables.has(
            session.name, message.subscription.id
        ):
            return None
        return self.quotas.refusal(message, session, self.durables.owned(session.name))

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

    # -- queries -----------------------------------------------------------------------------

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
                + (f" priority={r.priority}" if r.priority else "")
                + (" scope=local" if r.local else "")
                for r in self.routes
            ]
        return QueryResult(what, tuple(sorted(rows)))
