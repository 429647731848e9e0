"""The messages brokers and clients exchange besides the language's own, and their frames.

A connection carries frames; a frame is one JSON message object or a JSON array of them (a
batch). The language's messages (publication, subscription, ...) are declared in
``padres.messages``; the ones here add sessions, replies, deliveries and the routing messages
brokers send each other. Each is a struct whose declaration is its JSON form (``padres.wire``):
adding a message is declaring it and naming it in ``Envelope``. ``docs/protocol.md`` describes
every one of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, Final, TypeAlias

import msgspec

from padres.errors import InvalidMessage
from padres.messages import (
    Advertisement,
    Message,
    Publication,
    Subscription,
    WireMessage,
    check_id,
)
from padres.wire import MAX_FRAME_BYTES, Codec, Rejected, encode_frame, to_dict
from rete.operators import Value

__all__ = [
    "ENVELOPES",
    "MAX_FRAME_BYTES",
    "Ack",
    "CompositeNotify",
    "Durable",
    "Echo",
    "Envelope",
    "Error",
    "Guaranteed",
    "Hello",
    "Notify",
    "Ok",
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
    "Role",
    "RouteAdvertise",
    "RoutePublish",
    "RouteSubscribe",
    "RouteUnadvertise",
    "RouteUnsubscribe",
    "Welcome",
    "decode_frame",
    "encode_frame",
    "envelope_from_dict",
    "envelope_to_dict",
    "websocket_url",
]

Count: TypeAlias = Annotated[int, msgspec.Meta(ge=0)]
"""A count, a sequence number or a journal position: never negative."""


class Role(StrEnum):
    CLIENT = "client"
    BROKER = "broker"


class Hello(WireMessage, frozen=True, tag="hello"):
    """The first message of a connection: who is connecting, as a client or as a broker."""

    name: str
    role: Role = Role.CLIENT

    def __post_init__(self) -> None:
        check_id(self.name, "client or broker name")
        if not isinstance(self.role, Role):
            raise InvalidMessage(f"role must be 'client' or 'broker', not {self.role!r}")


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


class Guaranteed(WireMessage, frozen=True, tag="guaranteed"):
    """A publication to be delivered exactly once, in order, to every matching durable
    subscription. The broker answers ``Ok(publication.id)`` once it is on disk."""

    publication: Publication


class Durable(WireMessage, frozen=True, tag="durable"):
    """Make, or resume, the durable subscription ``subscription`` (its id is its name).

    The broker keeps it and what it matches while the client is away; ``acked``: the client
    has everything up to that delivery number, the broker resends what follows."""

    subscription: Subscription
    acked: Count = 0


class Ack(WireMessage, frozen=True, tag="ack"):
    """The client has processed the deliveries of durable subscription ``subscription`` up to
    ``seq``: the broker may forget them."""

    subscription: str
    seq: Count


class CompositeNotify(WireMessage, frozen=True, tag="composite_notify"):
    """A composite subscription completed by ``publications`` under ``bindings``."""

    subscription: str
    publications: tuple[Publication, ...]
    bindings: Mapping[str, Value]


class Query(WireMessage, frozen=True, tag="query"):
    """Ask a broker for its routing tables: ``what`` is 'subscriptions' or 'advertisements'."""

    what: str

    def __post_init__(self) -> None:
        if self.what not in ("subscriptions", "advertisements"):
            raise InvalidMessage(
                f"query what must be 'subscriptions' or 'advertisements', not {self.what!r}"
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


class ReplayOffer(WireMessage, frozen=True, tag="replay_offer"):
    """A client (a database) offers to replay stored publications matching ``advertisement``;
    it is withdrawn with ``Unadvertise``."""

    advertisement: Advertisement


class ReplayRequest(WireMessage, frozen=True, tag="replay_request"):
    """A historic query on its way to ``database`` up the replay tree ``tree``.

    ``subscription`` holds the request's overlay-wide id and its filter with the time window.
    The database answers once its clock reads ``ready_at`` (Unix seconds), so what was still
    on its way when the subscription was made is stored first."""

    subscription: Subscription
    tree: str
    database: str
    ready_at: float


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


class Recover(WireMessage, frozen=True, tag="recover"):
    """A durable subscription's broker asks the root of ``tree`` for the guaranteed
    publications matching ``subscription`` after journal position ``after``, accepted at
    ``since`` (Unix seconds) or later."""

    request: str
    subscription: Subscription
    tree: str
    after: Count
    limit: Annotated[int, msgspec.Meta(ge=1)] = 1000
    since: float = 0.0


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

    def __post_init__(self) -> None:
        if len(self.positions) != len(self.publications):
            raise InvalidMessage(
                f"{len(self.publications)} publications need as many positions, "
                f"not {len(self.positions)}"
            )


Envelope: TypeAlias = (
    Message
    | Hello
    | Welcome
    | Ok
    | Error
    | Notify
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
    | Recover
    | Recovered
    | ReplayOffer
    | ReplayRequest
    | ReplayBatch
    | ReplayEnd
    | ReplayDone
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
    data: bytes | str, *, max_bytes: int = MAX_FRAME_BYTES
) -> list[Envelope | Rejected]:
    """The messages of a frame, in order; one that does not decode is ``Rejected`` in its place.

    A frame that is too large or not JSON at all raises ``DecodeError``: nothing in it is used.
    """
    return ENVELOPES.decode_frame(data, max_bytes)


def websocket_url(url: str) -> str:
    """``ws://host:port`` or ``ws://host:port/ws``: a broker's WebSocket endpoint."""
    url = url.rstrip("/")
    return url if url.endswith("/ws") else f"{url}/ws"
