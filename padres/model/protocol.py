"""The messages brokers and clients exchange besides the language's own, and their frames.

A connection carries frames; a frame is one JSON message object or a JSON array of them (a
batch). The language's messages (publication, subscription, ...) are declared in
``padres.model.messages``; the ones here add sessions, replies, deliveries and the routing messages
brokers send each other. Each is a struct whose declaration is its JSON form
(``padres.model.codec``):
adding a message is declaring it and naming it in ``Envelope``. ``docs/protocol.md`` describes
every one of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Final, TypeAlias

import msgspec

from padres.errors import ConnectError, InvalidMessage
from padres.model.classes import Attributes, Schema, check_class, parse_attributes
from padres.model.codec import (
    MAX_FRAME_BYTES,
    MAX_FRAME_MESSAGES,
    Codec,
    Rejected,
    encode_frame,
    to_dict,
)
from padres.model.messages import (
    MAX_COUNT,
    MAX_PARTS,
    Advertisement,
    CompositeSubscription,
    Filter,
    Message,
    Publication,
    Subscription,
    TimeWindow,
    WireMessage,
    check_id,
)
from padres.model.producers import MAX_PRODUCERS, MAX_RANGES
from rete.operators import Value

__all__ = [
    "ENVELOPES",
    "MAX_FRAME_BYTES",
    "MAX_FRAME_MESSAGES",
    "MAX_PATH",
    "MAX_PRIORITY",
    "MAX_REASON",
    "MAX_VITAL",
    "MAX_VITAL_WAIT",
    "Ack",
    "CompositeNotify",
    "DeclareSchema",
    "DropSchema",
    "Durable",
    "Echo",
    "Envelope",
    "Error",
    "ExceptionAction",
    "ExceptionEntry",
    "ExceptionReport",
    "Exceptions",
    "Failed",
    "GoingAway",
    "Guaranteed",
    "Hello",
    "LinkPing",
    "LinkPong",
    "Lost",
    "Notify",
    "Ok",
    "Outcome",
    "PartState",
    "Query",
    "QueryResult",
    "Recover",
    "Recovered",
    "Rejected",
    "ReplayBatch",
    "ReplayDone",
    "ReplayEnd",
    "ReplayOffer",
    "ReplayRequest",
    "Retry",
    "Roam",
    "Role",
    "RouteAdvertise",
    "RouteCongestion",
    "RouteDrain",
    "RouteLoss",
    "RoutePath",
    "RoutePublish",
    "RouteRelease",
    "RouteSchema",
    "RouteSubscribe",
    "RouteTxOutcome",
    "RouteTxPart",
    "RouteTxPublish",
    "RouteTxVote",
    "RouteUnadvertise",
    "RouteUnsubscribe",
    "RouteVersion",
    "Scope",
    "Span",
    "Subscribe",
    "TxAbort",
    "TxBegin",
    "TxCommit",
    "TxEnded",
    "TxNotify",
    "TxPublish",
    "TxVote",
    "Visibility",
    "Vote",
    "Welcome",
    "check_priority",
    "decode_frame",
    "encode_frame",
    "envelope_from_dict",
    "envelope_to_dict",
    "http_url",
    "websocket_url",
]

Count: TypeAlias = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
"""A count, a sequence number or a journal position: never negative, never past
``MAX_COUNT``."""
Cost: TypeAlias = Annotated[float, msgspec.Meta(ge=0.0, le=3600.0)]
"""A path's cost in seconds (``padres.broker.paths``): never negative; 3,600 is a path that
carries nothing (a broker on it stopped answering)."""


class Role(StrEnum):
    CLIENT = "client"
    BROKER = "broker"


class Outcome(StrEnum):
    """Where a transactional publication stands: its transaction is still open (``pending``),
    its producer has asked to commit it (``committing``: the commit waits for its vital
    consumers, if it has any), or it is over."""

    PENDING = "pending"
    COMMITTING = "committing"
    COMMITTED = "committed"
    ABORTED = "aborted"


class Visibility(StrEnum):
    """Which transactional publications a subscription sees (``docs/transactions.md``).

    ``on_commit``: those of committed transactions, once committed (the default);
    ``immediate``: every one at once (``pending``), then again with its outcome;
    ``deferred``: every one when its producer asks to commit (``committing``), then again with
    the outcome;
    ``on_abort``: those of aborted transactions, once aborted (to compensate)."""

    ON_COMMIT = "on_commit"
    IMMEDIATE = "immediate"
    ON_ABORT = "on_abort"
    DEFERRED = "deferred"


class Scope(StrEnum):
    """Which publications a subscription sees by where they were published
    (``docs/padres.md``).

    ``global``: every matching publication of the overlay (the default); ``local``: only those
    published by clients of the subscriber's own broker. A local subscription is never sent to
    the neighbours: it follows only the advertisements made at its broker."""

    GLOBAL = "global"
    LOCAL = "local"

    @classmethod
    def _missing_(cls, value: object) -> Scope:
        choices = ", ".join(scope.value for scope in cls)
        raise InvalidMessage(f"scope {value!r} is not one of {choices}")


MAX_PRIORITY: Final = 2**31 - 1
"""A subscription's priority lies between ``-MAX_PRIORITY`` and ``MAX_PRIORITY``."""


def check_priority(priority: object) -> int:
    """``priority`` if it is a valid subscription priority: a whole number (not a bool)
    between ``-MAX_PRIORITY`` and ``MAX_PRIORITY``; ``InvalidMessage`` otherwise."""
    if type(priority) is not int:
        raise InvalidMessage(f"a priority is a whole number, not {priority!r}")
    if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        raise InvalidMessage(
            f"priority {priority} is out of range: from {-MAX_PRIORITY} to {MAX_PRIORITY}"
        )
    return priority


class Vote(StrEnum):
    """A consumer's word on a producer's transaction (``TxVote``): its vital reaction is
    ``ready`` or ``failed``, or it marks the transaction ``rollback`` only; ``gone``: said by
    a consumer's broker when the consumer's connection ended before it said either."""

    READY = "ready"
    FAILED = "failed"
    ROLLBACK = "rollback"
    GONE = "gone"


class PartState(StrEnum):
    """What a joined part's broker tells the broker of the transaction it joined
    (``RouteTxPart``): the part asks to ``join``; it is ``prepared`` (done, and on its broker's
    disk: it commits or aborts with the transaction); it was ``aborted`` before it was done (so
    is the transaction); its broker, holding it prepared, ``ask``s how the transaction ended."""

    JOIN = "join"
    PREPARED = "prepared"
    ABORTED = "aborted"
    ASK = "ask"


MAX_VITAL: Final = 100
"""Consumers a transaction may name as vital, at most."""
MAX_VITAL_WAIT: Final = 600.0
"""Seconds a commit may wait for its vital consumers, at most."""
MAX_REASON: Final = 1000
"""Characters of the reason a loss report or a vote gives, at most."""
MAX_PATH: Final = 64
"""Brokers between a joined part's broker and its transaction's, both counted, at most."""


class Hello(WireMessage, frozen=True, tag="hello"):
    """The first message of a connection: who is connecting, as a client or as a broker.

    A broker with accounts (``docs/security.md``) wants ``user`` and ``password``, or a
    ``token`` alone; the account must own ``name``."""

    name: str
    role: Role = Role.CLIENT
    user: str = ""
    password: str = ""
    token: str = ""

    def __post_init__(self) -> None:
        check_id(self.name, "client or broker name")
        if not isinstance(self.role, Role):
            raise InvalidMessage(f"role must be 'client' or 'broker', not {self.role!r}")

    def __repr__(self) -> str:
        secret = ", password=..." if self.password else ", token=..." if self.token else ""
        return f"Hello(name={self.name!r}, role={self.role!r}, user={self.user!r}{secret})"


class Welcome(WireMessage, frozen=True, tag="welcome"):
    """The broker's answer to ``Hello``: its id and the session's name there."""

    broker: str
    session: str


class Ok(WireMessage, frozen=True, tag="ok"):
    """A request (subscribe, advertise, ...) identified by ``ref`` was accepted.

    An advertisement or subscription is acknowledged once its routing has settled across the
    overlay; ``incomplete`` says why it could not settle everywhere (a link lost on the way)."""

    ref: str
    incomplete: tuple[str, ...] = ()


class Error(WireMessage, frozen=True, tag="error"):
    """A message was refused; ``ref`` is its id when it had one, ``text`` says why."""

    text: str
    ref: str = ""


class Notify(WireMessage, frozen=True, tag="notify"):
    """A publication delivered to a client, with the ids of its subscriptions it matched.

    ``seq`` numbers the deliveries of a durable subscription (its only subscription then),
    from 1; the client acknowledges them with ``Ack``. It is 0 for other deliveries."""

    publication: Publication
    subscriptions: tuple[str, ...]
    seq: Count = 0


class TxNotify(Notify, frozen=True, kw_only=True, tag="tx_notify"):
    """A publication of transaction ``tx`` delivered to a client: ``outcome`` is ``pending``
    while the transaction is open (to ``immediate`` subscriptions), else how it ended."""

    tx: str
    outcome: Outcome


class Subscribe(WireMessage, frozen=True, tag="subscribe"):
    """Make ``subscription`` with options: ``visibility`` of transactional publications;
    ``priority``: where its id comes in a ``Notify`` matching several of the client's
    subscriptions (higher first, ties in the order they were made where the client's
    priorities are not all 0); ``scope``: which
    publications it sees by where they were published (``Scope``); ``group``: the id a
    ``Notify`` names it by instead of its own, shared by the subscriptions of one group
    (``Client.subscribe_many``): a publication matching several of them names the group once.

    A plain ``subscription`` is the same with the defaults: ``on_commit``, 0, ``global``, no
    group."""

    subscription: Subscription
    visibility: Visibility = Visibility.ON_COMMIT
    priority: int = 0
    scope: Scope = Scope.GLOBAL
    group: str = ""

    def __post_init__(self) -> None:
        check_priority(self.priority)
        if self.group:
            check_id(self.group, "subscription group")


class TxBegin(WireMessage, frozen=True, tag="tx_begin"):
    """Open transaction ``tx`` (the client's id for it). Answered by ``ok``, or by
    ``tx_ended`` when a limit refuses it.

    ``vital``: the consumers (client names, ``name`` or ``name@broker``) whose reactions are
    vital: the commit waits, ``wait`` seconds at most, until each has voted ``ready``, and
    aborts if one votes ``failed``, is gone, or has not voted in time.

    ``join``: the overlay-wide id (``TxNotify.tx``) of a producer's transaction whose
    publications reached the client: this one is a *part* of it (a shared context), its
    publications that transaction's. Answered by ``ok`` once the producer's broker took the
    part, by ``tx_ended`` if it refused it (the transaction is over, or its commit has started
    and does not wait for this client), by an ``error`` if no publication of it reached this
    broker. A part names no vital consumers."""

    tx: str
    vital: Annotated[tuple[str, ...], msgspec.Meta(max_length=MAX_VITAL)] = ()
    wait: Annotated[float, msgspec.Meta(gt=0, le=MAX_VITAL_WAIT)] = 10.0
    join: str = ""

    def __post_init__(self) -> None:
        check_id(self.tx, "transaction id")
        if self.join:
            check_id(self.join, "transaction id")
            if self.vital:
                raise InvalidMessage("a part of another transaction names no vital consumers")


class TxPublish(WireMessage, frozen=True, tag="tx_publish"):
    """A publication made in open transaction ``tx``; no reply (``tx_ended`` if refused)."""

    tx: str
    publication: Publication


class TxCommit(WireMessage, frozen=True, tag="tx_commit"):
    """Commit ``tx``, which holds ``count`` publications (fewer at the broker: some were lost
    with a connection, and the transaction is aborted). Answered by ``ok`` once every
    publication is on disk, or by ``tx_ended`` if the transaction was aborted."""

    tx: str
    count: Count


class TxAbort(WireMessage, frozen=True, tag="tx_abort"):
    """Abort ``tx``. Answered by ``ok``."""

    tx: str


class TxVote(WireMessage, frozen=True, tag="tx_vote"):
    """A consumer's ``vote`` on transaction ``tx`` (its overlay-wide id, ``TxNotify.tx``),
    which it has received publications of; its broker sends it up to the producer's broker.
    Answered by ``ok`` (``tx`` as its reference), or by an ``error`` when the broker has
    delivered no publication of an open transaction ``tx`` to its clients."""

    tx: str
    vote: Vote
    reason: Annotated[str, msgspec.Meta(max_length=MAX_REASON)] = ""


class RouteTxVote(WireMessage, frozen=True, tag="route_tx_vote"):
    """A ``TxVote`` of client ``voter`` (``<client>@<broker>``) on its way up ``tree`` to the
    broker of the transaction's producer (the tree's root)."""

    tx: str
    tree: str
    voter: str
    vote: Vote
    reason: Annotated[str, msgspec.Meta(max_length=MAX_REASON)] = ""


class RouteTxPart(WireMessage, frozen=True, tag="route_tx_part"):
    """From the broker of joined part ``part`` (``<client>@<broker>:<id>``, of client
    ``voter``) to the broker of transaction ``tx``, the one it joined: see ``PartState``.

    It travels along ``path``, the part's broker first: for a ``join``, the brokers up the
    tree the transaction's publications came down (a broker at its end holding a part of
    ``tx`` itself passes it on, the path extended along that part's); afterwards, the path the
    answer gave."""

    tx: str
    part: str
    voter: str
    state: PartState
    path: Annotated[tuple[str, ...], msgspec.Meta(min_length=1, max_length=MAX_PATH)]
    reason: Annotated[str, msgspec.Meta(max_length=MAX_REASON)] = ""


class RouteTxOutcome(WireMessage, frozen=True, tag="route_tx_outcome"):
    """From the broker of transaction ``tx`` to that of its joined part ``part``, back along
    ``path`` (the part's broker first): ``pending`` or ``committing``, the part is taken (the
    transaction is open, or its commit has started); ``committing`` again when the commit
    starts; ``committed`` or ``aborted`` when the transaction ends (``reason``: why it
    aborted). ``refused``: the part is not taken, ``reason`` says why."""

    tx: str
    part: str
    outcome: Outcome
    path: Annotated[tuple[str, ...], msgspec.Meta(min_length=1, max_length=MAX_PATH)]
    refused: bool = False
    reason: Annotated[str, msgspec.Meta(max_length=MAX_REASON)] = ""


class TxEnded(WireMessage, frozen=True, tag="tx_ended"):
    """To a client: its transaction ``tx`` is over, or could not begin; ``reason`` says why
    (the broker aborted it: a timeout, a limit, a refused publication). ``limit``: a limit
    refused it."""

    tx: str
    outcome: Outcome
    reason: str = ""
    limit: bool = False


class Guaranteed(WireMessage, frozen=True, tag="guaranteed"):
    """A publication to be delivered exactly once, in order, to every matching durable
    subscription. The broker answers ``Ok(publication.id)`` once it is on disk."""

    publication: Publication


Range: TypeAlias = Annotated[list[Count], msgspec.Meta(min_length=2, max_length=2)]
"""``[first, last]``: the numbers from ``first`` to ``last``, both included."""


class Roam(msgspec.Struct, frozen=True, gc=False):
    """Where a durable subscription stands when its client brings it from another broker:
    ``age``, the seconds since the client first made it (by the client's clock); ``taken``,
    per producer, the numbers of the guaranteed publications the client has processed."""

    age: Annotated[float, msgspec.Meta(ge=0, le=MAX_COUNT)]
    left: str = ""
    """The broker it leaves, which is told to let go of its copy (``RouteRelease``)."""
    taken: Annotated[
        dict[str, Annotated[list[Range], msgspec.Meta(max_length=MAX_RANGES)]],
        msgspec.Meta(max_length=MAX_PRODUCERS),
    ] = {}


class Durable(WireMessage, frozen=True, tag="durable"):
    """Make, or resume, the durable subscription ``subscription`` (its id is its name).

    The broker keeps it and what it matches while the client is away; ``acked``: the client
    has everything up to that delivery number, the broker resends what follows. ``roam``: the
    client brings it from another broker, where it stood as ``roam`` says: the broker makes it
    anew (in place of one it may have), and it gets the guaranteed publications made since
    ``roam.age`` seconds ago that the client has not ``roam.taken``.

    A composite subscription may be durable too: its matches are the deliveries
    (``CompositeNotify`` with ``seq``), and the broker keeps its partial matches as well. One
    brought from another broker (``roam``) starts afresh: what it held stays there."""

    subscription: Subscription | CompositeSubscription
    acked: Count = 0
    visibility: Visibility = Visibility.ON_COMMIT
    """Which transactional publications it sees."""
    roam: Roam | None = None
    priority: int = 0
    """Where its deliveries come among those of the client's other durable subscriptions
    matching the same publication (``Subscribe.priority``)."""
    scope: Scope = Scope.GLOBAL
    """Which publications it sees by where they were published (``Scope``)."""

    def __post_init__(self) -> None:
        check_priority(self.priority)


class Ack(WireMessage, frozen=True, tag="ack"):
    """The client has processed the deliveries of durable subscription ``subscription`` up to
    ``seq``: the broker may forget them."""

    subscription: str
    seq: Count


DURABLE_WINDOW: Final = 20_000
"""Deliveries a durable subscription sends ahead of its client's acknowledgements (``Ack``),
at most."""
DURABLE_WINDOW_BYTES: Final = 4 << 20
"""Bytes of deliveries the durable subscriptions of one client send ahead of its
acknowledgements, together, at most (one delivery of each always goes, however large); well
below a client's queue at its broker (``padres.runtime.node.Limits.client_queue``), so that
none is dropped on the way."""


class Failed(WireMessage, frozen=True, tag="failed"):
    """The handler of subscription ``subscription`` failed on ``publication`` ``attempts``
    times, the last time with ``error``: the broker puts it into the subscription's exception
    queue and answers ``Ok(ref)`` (a ``ref`` sent again is recognised). ``seq``: the delivery
    number of a durable subscription, acknowledged in the same journal transaction. ``entry``:
    an entry of the queue delivered again (``Retry``) that failed again: it is updated."""

    ref: str
    subscription: str
    publication: Publication
    error: str
    attempts: Annotated[int, msgspec.Meta(ge=1, le=MAX_COUNT)]
    seq: Count = 0
    entry: Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)] = 0


EntryId: TypeAlias = Annotated[int, msgspec.Meta(ge=1, le=MAX_COUNT)]
"""The id of an entry of an exception queue."""
MAX_ENTRIES_NAMED: Final = 1000
"""Entries one ``Exceptions`` request may name."""


class ExceptionAction(StrEnum):
    LIST = "list"
    REPLAY = "replay"
    PURGE = "purge"


class Exceptions(WireMessage, frozen=True, tag="exceptions"):
    """List, replay or purge the exception queue of subscription ``subscription`` of client
    ``client`` at this broker (the sender's own when empty); ``entries``: only those (all when
    empty); a list gives the entries after ``after``, ``limit`` at most. Answered with
    ``ExceptionReport``."""

    ref: str
    subscription: str
    action: ExceptionAction = ExceptionAction.LIST
    entries: Annotated[tuple[EntryId, ...], msgspec.Meta(max_length=MAX_ENTRIES_NAMED)] = ()
    client: str = ""
    after: Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)] = 0
    limit: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 100


class ExceptionEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One publication in an exception queue: the handler's last ``error``, how many
    ``attempts`` it has had, when it last failed (``at``, Unix seconds), and whether it is
    being delivered again (``replaying``)."""

    id: EntryId
    publication: Publication
    error: str
    attempts: Count
    at: float
    replaying: bool = False


class ExceptionReport(WireMessage, frozen=True, tag="exception_report"):
    """The answer to ``Exceptions``: the entries listed (``more``: there are more after the
    last), the entries replayed or purged (``affected``), the queue's length and bytes, and
    how many of its oldest entries were dropped because it was full."""

    ref: str
    subscription: str
    entries: tuple[ExceptionEntry, ...] = ()
    more: bool = False
    affected: Count = 0
    length: Count = 0
    bytes: Count = 0
    dropped: Count = 0


class Retry(WireMessage, frozen=True, tag="retry"):
    """To a client: entry ``entry`` of the exception queue of subscription ``subscription``,
    delivered again through its handler. The client answers ``Failed`` with ``entry`` (it
    failed again) or ``Exceptions`` purging it (it was handled)."""

    subscription: str
    entry: EntryId
    publication: Publication
    attempts: Count


class CompositeNotify(WireMessage, frozen=True, tag="composite_notify"):
    """A composite subscription completed by ``publications`` under ``bindings``.

    ``seq`` numbers the matches of a durable composite subscription, as ``Notify.seq`` does;
    0 for other subscriptions."""

    subscription: str
    publications: tuple[Publication, ...]
    bindings: Mapping[str, Value]
    seq: Count = 0


class Query(WireMessage, frozen=True, tag="query"):
    """Ask a broker for its tables: ``what`` is 'subscriptions', 'advertisements' or
    'schemas' (the schemas of typed classes it knows)."""

    what: str

    def __post_init__(self) -> None:
        if self.what not in ("subscriptions", "advertisements", "schemas"):
            raise InvalidMessage(
                "query what must be 'subscriptions', 'advertisements' or 'schemas', "
                f"not {self.what!r}"
            )


class QueryResult(WireMessage, frozen=True, tag="query_result"):
    """Rows of a routing table, as text: one row per entry."""

    what: str
    rows: tuple[str, ...]


class RouteAdvertise(WireMessage, frozen=True, tag="route_advertise"):
    """An advertisement flooded along ``tree``; ``path`` lists the brokers it has crossed.

    ``replay`` names the database that offers to replay what the advertisement describes; it
    is empty for a publisher's advertisement."""

    advertisement: Advertisement
    tree: str
    path: tuple[str, ...]
    replay: str = ""
    echo: str = ""
    """The token the receiver echoes back once the advertisement has settled beyond it."""
    period: Span | None = None
    """For a replay offer: the publication times it holds (any when None)."""
    version: Count = 0
    """The tree's version at the sender (``RoutePath``)."""
    cost: Cost = 0.0
    """The sender's cost to the tree's root, in seconds (``RoutePath``)."""


class Span(msgspec.Struct, frozen=True):
    """The publication times a replay offer holds: from ``first`` to ``last`` (Unix seconds,
    both included)."""

    first: float
    last: float

    SLACK: ClassVar[float] = 1e-3
    """Seconds either side taken as inside: a float's rounding must not skip a publication."""

    def __post_init__(self) -> None:
        if not self.first <= self.last:
            raise InvalidMessage(f"a period cannot end ({self.last}) before it starts")

    def meets(self, window: TimeWindow | None) -> bool:
        """Whether a publication of this period may fall in ``window``."""
        if window is None:
            return True
        if window.end is not None and self.first - self.SLACK >= window.end.timestamp():
            return False
        return window.start is None or self.last + self.SLACK >= window.start.timestamp()


class ReplayOffer(WireMessage, frozen=True, tag="replay_offer"):
    """A client (a database) offers to replay stored publications matching ``advertisement``,
    and published within ``period`` if it is given (an archive's); it is withdrawn with
    ``Unadvertise``."""

    advertisement: Advertisement
    period: Span | None = None


class ReplayRequest(WireMessage, frozen=True, tag="replay_request"):
    """A historic query on its way to ``database`` up the replay tree ``tree``.

    ``subscription`` holds the request's overlay-wide id and its filter with the time window.
    The database answers once its clock reads ``ready_at`` (Unix seconds), so what was still
    on its way when the subscription was made is stored first.

    ``not_before`` (Unix seconds) bounds how far back the requester may read, from its history
    grants (``docs/security.md``): the database answers nothing published earlier, whatever
    the window asks for."""

    subscription: Subscription
    tree: str
    database: str
    ready_at: float
    not_before: float | None = None

    def query(self) -> Filter | None:
        """What the database answers: the subscription's filter, its window starting no earlier
        than ``not_before``; None when nothing is left of it."""
        flt = self.subscription.filter
        if self.not_before is None:
            return flt
        bound = datetime.fromtimestamp(self.not_before, UTC)
        window = flt.window or TimeWindow()
        if window.start is not None and window.start >= bound:
            return flt
        if window.end is not None and window.end <= bound:
            return None
        return Filter(flt.predicates, TimeWindow(bound, window.end))


class ReplayBatch(WireMessage, frozen=True, tag="replay_batch"):
    """Stored publications answering request ``request``, in time order, on the way back."""

    request: str
    database: str
    publications: tuple[Publication, ...]


class ReplayEnd(WireMessage, frozen=True, tag="replay_end"):
    """``database`` finished request ``request`` after ``count`` publications, or failed
    (``error`` says why)."""

    request: str
    database: str
    count: Count
    error: str = ""


class ReplayDone(WireMessage, frozen=True, tag="replay_done"):
    """To a client: the past of ``subscription`` has been delivered (``count`` deliveries).

    ``databases`` answered in full; ``failed`` lists ``"<database>: <why>"`` for those that
    did not finish."""

    subscription: str
    count: Count
    databases: tuple[str, ...]
    failed: tuple[str, ...] = ()
    live: bool = False
    """Whether live deliveries follow (a hybrid subscription); if not, the subscription is
    over and its id free again."""


class RouteUnadvertise(WireMessage, frozen=True, tag="route_unadvertise"):
    """An advertisement withdrawn from ``tree``; ``lost``: withdrawn because a link failed."""

    advertisement_id: str
    tree: str
    lost: bool = False


class RouteSubscribe(WireMessage, frozen=True, tag="route_subscribe"):
    """A subscription sent toward the roots of ``trees`` (advertisement trees)."""

    subscription: Subscription
    trees: tuple[str, ...]
    echo: str = ""
    """The token the receiver echoes back once the subscription has settled beyond it."""


class RouteUnsubscribe(WireMessage, frozen=True, tag="route_unsubscribe"):
    subscription_id: str
    trees: tuple[str, ...]


class RoutePath(WireMessage, frozen=True, tag="route_path"):
    """The sender's way to the root of ``tree`` now: the brokers from the root down to it
    (``path``), the tree's ``version`` it holds and its ``cost`` to the root in seconds.
    Sent to every neighbour when its path or version changes, or its cost changes by much:
    the neighbours whose parent in the tree it is follow it, the others keep it as an
    alternative parent (``padres.broker.paths``)."""

    tree: str
    path: tuple[str, ...]
    version: Count
    cost: Cost


class RouteDrain(WireMessage, frozen=True, tag="route_drain"):
    """To the tree's former parent, after the sender withdrew its subscriptions for ``tree``
    there: answered with ``done`` at once, which comes behind every publication of the tree
    the former parent sent before; until then the sender still takes the tree's
    publications from it (``token`` pairs the answer with its request)."""

    tree: str
    token: str
    done: bool = False


class RouteVersion(WireMessage, frozen=True, tag="route_version"):
    """A broker that has no usable way to the root of ``tree`` at ``version`` asks the root,
    along its neighbours' parents, for a newer version, under which it may take any
    neighbour as its parent again (``padres.broker.paths``)."""

    tree: str
    version: Count


class LinkPing(WireMessage, frozen=True, tag="link_ping"):
    """Between neighbour brokers, several times a second: answered with ``LinkPong`` carrying
    the same ``sent`` (the sender's own clock, never compared with another's). It waits in
    the send queues and behind the frames each side has to read, so its round trip measures
    the link with its queues."""

    sent: float


class LinkPong(WireMessage, frozen=True, tag="link_pong"):
    """The answer to ``LinkPing``."""

    sent: float


class Echo(WireMessage, frozen=True, tag="echo"):
    """The answer to a routing message carrying ``echo``: what it set off has settled beyond
    the receiver; ``incomplete`` names links lost before it could."""

    token: str
    incomplete: tuple[str, ...] = ()


class RoutePublish(WireMessage, frozen=True, tag="route_publish"):
    """A publication travelling down ``tree``, the tree of an advertisement it conforms to."""

    publication: Publication
    tree: str
    position: Count = 0
    """For a guaranteed publication: its position in the journal of the tree's root broker."""
    matched: tuple[str, ...] | None = None
    """The ids of the subscriptions the receiver forwarded to the sender (for ``tree``) that
    the publication matches, all of them: the sender matched it against those, and it
    conforms to the tree's advertisement. The receiver then matches it only against what it
    did not forward there (``padres.broker.routes``). None: the receiver matches it in full."""


class RouteTxPublish(WireMessage, frozen=True, tag="route_tx_publish"):
    """A publication of transaction ``tx`` travelling down ``tree``: ``pending`` (to
    ``immediate`` subscriptions only) while it is open, then again with its outcome; a
    committed one is guaranteed (``position`` in the journal of the tree's root)."""

    publication: Publication
    tree: str
    tx: str
    outcome: Outcome
    position: Count = 0


class Recover(WireMessage, frozen=True, tag="recover"):
    """A durable subscription's broker asks the root of ``tree`` for the guaranteed
    publications matching ``subscription`` after journal position ``after``.

    ``age``, on a first contact with the tree: the subscription's age in seconds, by its own
    broker's clock when it asked; the root takes only what it accepted since then, by its own
    clock (``now - age``), so that no two brokers' clocks are ever compared."""

    request: str
    subscription: Subscription
    tree: str
    after: Count
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_COUNT)] = 1000
    age: Annotated[float, msgspec.Meta(ge=0)] | None = None
    also: Annotated[tuple[Filter, ...], msgspec.Meta(max_length=MAX_PARTS)] = ()
    """More filters: a publication matching any of them is asked for too (the parts of a
    durable composite subscription ask together)."""


class Recovered(WireMessage, frozen=True, tag="recovered"):
    """The answer to ``Recover``, on its way back: publications with their positions.

    ``head`` is the journal's last position when it answered; ``more``: ask again after the
    last one; ``lost``: publications after ``after`` were already gone from the journal."""

    request: str
    tree: str
    publications: tuple[Publication, ...]
    positions: tuple[Count, ...]
    head: Count
    more: bool = False
    lost: bool = False
    error: str = ""
    transactions: tuple[str, ...] = ()
    """The transaction of each publication ("" for none), or empty when none has one."""

    def __post_init__(self) -> None:
        if len(self.positions) != len(self.publications):
            raise InvalidMessage(
                f"{len(self.publications)} publications need as many positions, "
                f"not {len(self.positions)}"
            )
        if self.transactions and len(self.transactions) != len(self.publications):
            raise InvalidMessage(
                f"{len(self.publications)} publications need as many transactions, "
                f"not {len(self.transactions)}"
            )


class DeclareSchema(WireMessage, frozen=True, tag="declare_schema"):
    """Declare the schema of class ``class_name`` (``"class"`` in JSON), or widen the one in
    force; answered by ``ok`` once every reachable broker knows it (see
    ``padres.model.classes``)."""

    id: str
    class_name: str = msgspec.field(name="class")
    attributes: Attributes

    def __post_init__(self) -> None:
        check_id(self.id, "declaration id")
        check_class(self.class_name)
        parse_attributes(self.attributes)  # refuses reserved or invalid names


class DropSchema(WireMessage, frozen=True, tag="drop_schema"):
    """Drop the schema of class ``class_name`` (an administrator's right): the class is untyped
    again at every broker; answered by ``ok`` once every reachable broker knows it."""

    id: str
    class_name: str = msgspec.field(name="class")

    def __post_init__(self) -> None:
        check_id(self.id, "drop id")
        check_class(self.class_name)


class RouteRelease(WireMessage, frozen=True, tag="route_release"):
    """Durable subscription ``subscription`` of client ``client`` moved from broker ``broker``
    to another: flooded to every broker, once (``id``); the broker named lets go of its copy
    unless the client is connected to it (``padres.broker.releases``)."""

    id: str
    broker: str
    client: str
    subscription: str


class RouteCongestion(WireMessage, frozen=True, tag="route_congestion"):
    """Broker ``origin`` (in its run ``run``) has a congested link, or no longer has one:
    flooded to every broker, each passing on the latest (``seq``) once; while a broker hears
    of one, it reads its publishers no more (``padres.broker.congestion``)."""

    origin: str
    run: str
    seq: Count
    congested: bool


class _Loss(WireMessage, frozen=True):
    """What ``RouteLoss`` and ``Lost`` say: broker ``broker`` dropped ``count`` plain
    publications of ``publisher`` sent down tree ``tree``, from ``first`` to ``last`` (their
    ids, in the order they were queued), when its link to broker ``neighbour`` ended for
    ``reason``."""

    tree: str
    publisher: str
    count: Annotated[int, msgspec.Meta(ge=1, le=MAX_COUNT)]
    first: str
    last: str
    broker: str
    neighbour: str
    reason: Annotated[str, msgspec.Meta(max_length=MAX_REASON)]

    def __post_init__(self) -> None:
        check_id(self.tree, "tree id")
        check_id(self.publisher, "publisher id")
        check_id(self.first, "publication id")
        check_id(self.last, "publication id")
        check_id(self.broker, "broker id")
        check_id(self.neighbour, "broker id")


class RouteLoss(_Loss, frozen=True, tag="route_loss"):
    """Plain publications a link dropped (see ``_Loss``), on their way up ``tree``: each
    broker passes it to its parent there, and the root, the publisher's broker, tells the
    publisher with ``Lost`` (``padres.broker.losses``)."""


class Lost(_Loss, frozen=True, tag="lost"):
    """To a publisher: plain publications of its own were dropped on a link (see ``_Loss``)."""


class GoingAway(WireMessage, frozen=True, tag="going_away"):
    """To a client: broker ``broker`` is shutting down (``reason``). The client sends no more
    and closes its connection; what it sent before is still read and handled. A client that
    knows other brokers of the overlay goes on at one of them."""

    broker: str
    reason: Annotated[str, msgspec.Meta(max_length=MAX_REASON)] = ""

    def __post_init__(self) -> None:
        check_id(self.broker, "broker id")


class RouteSchema(WireMessage, frozen=True, tag="route_schema"):
    """A class's schema (or its tombstone), flooded to every broker; each keeps the latest
    version, or merges versions declared apart (see ``padres.broker.schemas``)."""

    schema: Schema
    echo: str = ""
    """The token the receiver echoes back once every neighbour it passed the schema on to has
    echoed."""


Envelope: TypeAlias = (
    Message
    | Hello
    | Welcome
    | Ok
    | Error
    | Notify
    | TxNotify
    | CompositeNotify
    | Query
    | QueryResult
    | RouteAdvertise
    | RouteUnadvertise
    | RouteSubscribe
    | RouteUnsubscribe
    | RoutePublish
    | Echo
    | Guaranteed
    | Durable
    | Ack
    | Failed
    | Exceptions
    | ExceptionReport
    | Retry
    | Recover
    | Recovered
    | ReplayOffer
    | ReplayRequest
    | ReplayBatch
    | ReplayEnd
    | ReplayDone
    | DeclareSchema
    | DropSchema
    | RouteSchema
    | RouteRelease
    | RouteCongestion
    | RouteLoss
    | Lost
    | GoingAway
    | Subscribe
    | TxBegin
    | TxPublish
    | TxCommit
    | TxAbort
    | TxEnded
    | TxVote
    | RouteTxPublish
    | RouteTxVote
    | RouteTxPart
    | RouteTxOutcome
    | RoutePath
    | RouteDrain
    | RouteVersion
    | LinkPing
    | LinkPong
)


ENVELOPES: Final[Codec[Envelope]] = Codec(Envelope)
"""The codec of every message a connection carries."""


def envelope_to_dict(message: Envelope) -> dict[str, Any]:
    """The message as a JSON-ready dict with ``v`` and ``type``."""
    return to_dict(message)


def envelope_from_dict(obj: Any) -> Envelope:
    """The message a decoded JSON object describes; raises ``DecodeError``."""
    return ENVELOPES.from_dict(obj)


def decode_frame(
    data: bytes | str, *, max_bytes: int = MAX_FRAME_BYTES, checked: bool = False
) -> list[Envelope | Rejected]:
    """The messages of a frame, in order; one that does not decode is ``Rejected`` in its place.

    A frame that is too large or not JSON at all raises ``DecodeError``: nothing in it is used.
    ``checked``: the frame comes from a broker, which checked its publications at its edge
    (``padres.model.messages.checked_before``).
    """
    return ENVELOPES.decode_frame(data, max_bytes, checked=checked)


def websocket_url(url: str) -> str:
    """A broker's WebSocket endpoint from what a user may write: ``ws://host:port`` or
    ``wss://host:port`` (``/ws`` is added), ``http://`` or ``https://`` (the broker serves
    both on one port), or ``host:port``; ``ConnectError`` saying what to write otherwise."""
    text = url.strip()
    scheme, separator, rest = text.partition("://")
    if not separator:
        scheme, rest = "ws", text
    rest = rest.rstrip("/")
    scheme = {"http": "ws", "https": "wss"}.get(scheme.lower(), scheme.lower())
    if scheme not in ("ws", "wss") or not rest or rest.startswith("/"):
        raise ConnectError(
            f"not a broker address: {url!r} (write ws://host:port, wss://host:port for a "
            "broker serving TLS, or host:port)"
        )
    endpoint = f"{scheme}://{rest}"
    return endpoint if endpoint.endswith("/ws") else f"{endpoint}/ws"


def http_url(url: str) -> str:
    """The base of a broker's HTTP endpoints (``/health``, ``/ready``, the web API) from any
    address ``websocket_url`` takes: ``http://host:port``, or ``https://`` for TLS."""
    endpoint = websocket_url(url).removesuffix("/ws")
    return "http" + endpoint.removeprefix("ws")
