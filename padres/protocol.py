"""The messages brokers and clients exchange besides the language's own, and their frames.

A connection carries frames; a frame is one JSON message object or a JSON array of them (a
batch). Each message is an object with ``"v"`` and ``"type"``; the language's messages
(publication, subscription, ...) are written by ``padres.wire``, the ones here add sessions,
replies, deliveries and the routing messages brokers send each other. ``docs/protocol.md``
describes every one of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, TypeAlias

import orjson

from padres.errors import DecodeError, InvalidMessage
from padres.messages import (
    Advertisement,
    Message,
    Publication,
    Subscription,
    check_id,
)
from padres.wire import MAX_MESSAGE_BYTES, VERSION, from_dict, load_json, to_dict
from rete.operators import Value

__all__ = [
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

MAX_FRAME_BYTES: Final = 4 * MAX_MESSAGE_BYTES
"""A frame (one message or a batch) may not be larger than this."""


class Role(StrEnum):
    CLIENT = "client"
    BROKER = "broker"


@dataclass(frozen=True, slots=True)
class Hello:
    """The first message of a connection: who is connecting, as a client or as a broker."""

    name: str
    role: Role = Role.CLIENT

    def __post_init__(self) -> None:
        check_id(self.name, "client or broker name")
        if not isinstance(self.role, Role):
            raise InvalidMessage(f"role must be 'client' or 'broker', not {self.role!r}")


@dataclass(frozen=True, slots=True)
class Welcome:
    """The broker's answer to ``Hello``: its id and the session's name there."""

    broker: str
    session: str


@dataclass(frozen=True, slots=True)
class Ok:
    """A request (subscribe, advertise, ...) identified by ``ref`` was accepted.

    An advertisement or subscription is acknowledged once its routing has settled across the
    overlay; ``incomplete`` says why it could not settle everywhere (a link lost on the way)."""

    ref: str
    incomplete: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Error:
    """A message was refused; ``ref`` is its id when it had one, ``text`` says why."""

    text: str
    ref: str = ""


@dataclass(frozen=True, slots=True)
class Notify:
    """A publication delivered to a client, with the ids of its subscriptions it matched.

    ``seq`` numbers the deliveries of a durable subscription (its only subscription then),
    from 1; the client acknowledges them with ``Ack``. It is 0 for other deliveries."""

    publication: Publication
    subscriptions: tuple[str, ...]
    seq: int = 0


@dataclass(frozen=True, slots=True)
class Guaranteed:
    """A publication to be delivered exactly once, in order, to every matching durable
    subscription. The broker answers ``Ok(publication.id)`` once it is on disk."""

    publication: Publication


@dataclass(frozen=True, slots=True)
class Durable:
    """Make, or resume, the durable subscription ``subscription`` (its id is its name).

    The broker keeps it and what it matches while the client is away; ``acked``: the client
    has everything up to that delivery number, the broker resends what follows."""

    subscription: Subscription
    acked: int = 0


@dataclass(frozen=True, slots=True)
class Ack:
    """The client has processed the deliveries of durable subscription ``subscription`` up to
    ``seq``: the broker may forget them."""

    subscription: str
    seq: int


@dataclass(frozen=True, slots=True)
class CompositeNotify:
    """A composite subscription completed by ``publications`` under ``bindings``."""

    subscription: str
    publications: tuple[Publication, ...]
    bindings: Mapping[str, Value]


@dataclass(frozen=True, slots=True)
class Query:
    """Ask a broker for its routing tables: ``what`` is 'subscriptions' or 'advertisements'."""

    what: str

    def __post_init__(self) -> None:
        if self.what not in ("subscriptions", "advertisements"):
            raise InvalidMessage(
                f"query what must be 'subscriptions' or 'advertisements', not {self.what!r}"
            )


@dataclass(frozen=True, slots=True)
class QueryResult:
    """Rows of a routing table, as text: one row per entry."""

    what: str
    rows: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RouteAdvertise:
    """An advertisement flooded along ``tree``; ``path`` lists the brokers it has crossed.

    ``replay`` names the database that offers to replay what the advertisement describes; it
    is empty for a publisher's advertisement."""

    advertisement: Advertisement
    tree: str
    path: tuple[str, ...]
    replay: str = ""
    echo: str = ""
    """The token the receiver echoes back once the advertisement has settled beyond it."""


@dataclass(frozen=True, slots=True)
class ReplayOffer:
    """A client (a database) offers to replay stored publications matching ``advertisement``;
    it is withdrawn with ``Unadvertise``."""

    advertisement: Advertisement


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    """A historic query on its way to ``database`` up the replay tree ``tree``.

    ``subscription`` holds the request's overlay-wide id and its filter with the time window.
    The database answers once its clock reads ``ready_at`` (Unix seconds), so what was still
    on its way when the subscription was made is stored first."""

    subscription: Subscription
    tree: str
    database: str
    ready_at: float


@dataclass(frozen=True, slots=True)
class ReplayBatch:
    """Stored publications answering request ``request``, in time order, on the way back."""

    request: str
    database: str
    publications: tuple[Publication, ...]


@dataclass(frozen=True, slots=True)
class ReplayEnd:
    """``database`` finished request ``request`` after ``count`` publications, or failed
    (``error`` says why)."""

    request: str
    database: str
    count: int
    error: str = ""


@dataclass(frozen=True, slots=True)
class ReplayDone:
    """To a client: the past of ``subscription`` has been delivered (``count`` deliveries).

    ``databases`` answered in full; ``failed`` lists ``"<database>: <why>"`` for those that
    did not finish."""

    subscription: str
    count: int
    databases: tuple[str, ...]
    failed: tuple[str, ...] = ()
    live: bool = False
    """Whether live deliveries follow (a hybrid subscription); if not, the subscription is
    over and its id free again."""


@dataclass(frozen=True, slots=True)
class RouteUnadvertise:
    """An advertisement withdrawn from ``tree``; ``lost``: withdrawn because a link failed."""

    advertisement_id: str
    tree: str
    lost: bool = False


@dataclass(frozen=True, slots=True)
class RouteSubscribe:
    """A subscription sent toward the roots of ``trees`` (advertisement trees)."""

    subscription: Subscription
    trees: tuple[str, ...]
    echo: str = ""
    """The token the receiver echoes back once the subscription has settled beyond it."""


@dataclass(frozen=True, slots=True)
class RouteUnsubscribe:
    subscription_id: str
    trees: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Echo:
    """The answer to a routing message carrying ``echo``: what it set off has settled beyond
    the receiver; ``incomplete`` names links lost before it could."""

    token: str
    incomplete: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RoutePublish:
    """A publication travelling down ``tree``, the tree of an advertisement it conforms to."""

    publication: Publication
    tree: str
    position: int = 0
    """For a guaranteed publication: its position in the journal of the tree's root broker."""


@dataclass(frozen=True, slots=True)
class Recover:
    """A durable subscription's broker asks the root of ``tree`` for the guaranteed
    publications matching ``subscription`` after journal position ``after``, accepted at
    ``since`` (Unix seconds) or later."""

    request: str
    subscription: Subscription
    tree: str
    after: int
    limit: int = 1000
    since: float = 0.0


@dataclass(frozen=True, slots=True)
class Recovered:
    """The answer to ``Recover``, on its way back: publications with their positions.

    ``head`` is the journal's last position when it answered; ``more``: ask again after the
    last one; ``lost``: publications after ``after`` were already gone from the journal."""

    request: str
    tree: str
    publications: tuple[Publication, ...]
    positions: tuple[int, ...]
    head: int
    more: bool = False
    lost: bool = False
    error: str = ""


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


def envelope_to_dict(message: Envelope) -> dict[str, Any]:
    """The message as a JSON-ready dict with ``v`` and ``type``."""
    match message:
        case Hello():
            body: dict[str, Any] = {"name": message.name, "role": message.role.value}
        case Welcome():
            body = {"broker": message.broker, "session": message.session}
        case Ok():
            body = {"ref": message.ref}
            if message.incomplete:
                body["incomplete"] = list(message.incomplete)
        case Error():
            body = {"text": message.text, "ref": message.ref}
        case Notify():
            body = {
                "publication": to_dict(message.publication),
                "subscriptions": list(message.subscriptions),
            }
            if message.seq:
                body["seq"] = message.seq
        case CompositeNotify():
            body = {
                "subscription": message.subscription,
                "publications": [to_dict(p) for p in message.publications],
                "bindings": dict(message.bindings),
            }
        case Query():
            body = {"what": message.what}
        case QueryResult():
            body = {"what": message.what, "rows": list(message.rows)}
        case RouteAdvertise():
            body = {
                "advertisement": to_dict(message.advertisement),
                "tree": message.tree,
                "path": list(message.path),
                "replay": message.replay,
                "echo": message.echo,
            }
        case RouteUnadvertise():
            body = {
                "advertisement_id": message.advertisement_id,
                "tree": message.tree,
                "lost": message.lost,
            }
        case RouteSubscribe():
            body = {
                "subscription": to_dict(message.subscription),
                "trees": list(message.trees),
                "echo": message.echo,
            }
        case RouteUnsubscribe():
            body = {"subscription_id": message.subscription_id, "trees": list(message.trees)}
        case RoutePublish():
            body = {"publication": to_dict(message.publication), "tree": message.tree}
            if message.position:
                body["position"] = message.position
        case Guaranteed():
            body = {"publication": to_dict(message.publication)}
        case Durable():
            body = {"subscription": to_dict(message.subscription), "acked": message.acked}
        case Ack():
            body = {"subscription": message.subscription, "seq": message.seq}
        case Recover():
            body = {
                "request": message.request,
                "subscription": to_dict(message.subscription),
                "tree": message.tree,
                "after": message.after,
                "limit": message.limit,
                "since": message.since,
            }
        case Recovered():
            body = {
                "request": message.request,
                "tree": message.tree,
                "publications": [to_dict(p) for p in message.publications],
                "positions": list(message.positions),
                "head": message.head,
                "more": message.more,
                "lost": message.lost,
                "error": message.error,
            }
        case Echo():
            body = {"token": message.token, "incomplete": list(message.incomplete)}
        case ReplayOffer():
            body = {"advertisement": to_dict(message.advertisement)}
        case ReplayRequest():
            body = {
                "subscription": to_dict(message.subscription),
                "tree": message.tree,
                "database": message.database,
                "ready_at": message.ready_at,
            }
        case ReplayBatch():
            body = {
                "request": message.request,
                "database": message.database,
                "publications": [to_dict(p) for p in message.publications],
            }
        case ReplayEnd():
            body = {
                "request": message.request,
                "database": message.database,
                "count": message.count,
                "error": message.error,
            }
        case ReplayDone():
            body = {
                "subscription": message.subscription,
                "count": message.count,
                "databases": list(message.databases),
                "failed": list(message.failed),
                "live": message.live,
            }
        case _:
            return to_dict(message)
    return {"v": VERSION, "type": _TYPES[type(message)], **body}


# -- decoding ------------------------------------------------------------------------------------


class _Fields:
    """Typed access to one decoded object's fields, naming the path of a bad one."""

    def __init__(self, obj: dict[str, Any], allowed: Iterable[str]) -> None:
        extra = sorted(set(obj) - set(allowed) - {"v", "type"})
        if extra:
            raise DecodeError(f"unknown field {extra[0]!r}")
        self.obj = obj

    def get(self, key: str, kind: type, default: Any = ...) -> Any:
        if key not in self.obj:
            if default is ...:
                raise DecodeError(f"missing field {key!r}")
            return default
        value = self.obj[key]
        if type(value) is not kind:
            raise DecodeError(
                f"must be {kind.__name__}, not {type(value).__name__}", path=f"$.{key}"
            )
        return value

    def number(self, key: str) -> int | float:
        value = self.obj.get(key)
        if type(value) is not int and type(value) is not float:
            raise DecodeError("must be a number", path=f"$.{key}")
        return value

    def strings(self, key: str) -> tuple[str, ...]:
        items = self.get(key, list)
        for i, item in enumerate(items):
            if type(item) is not str:
                raise DecodeError("must be a string", path=f"$.{key}[{i}]")
        return tuple(items)

    def message(self, key: str, kind: type[Any]) -> Any:
        return _nested(self.get(key, dict), kind, f"$.{key}")


def _nested(obj: Any, kind: type[Any], path: str) -> Any:
    """A language message inside another, of type ``kind``; errors name their full path."""
    try:
        inner = from_dict(obj)
    except DecodeError as exc:
        raise DecodeError(exc.reason, path=f"{path}{exc.path[1:]}") from None
    if not isinstance(inner, kind):
        raise DecodeError(f"must be a {kind.__name__.lower()}", path=path)
    return inner


def _bindings(f: _Fields) -> dict[str, Value]:
    out = f.get("bindings", dict)
    for name, value in out.items():
        if type(value) not in (str, int, float, bool):
            raise DecodeError("a binding is a string, number or boolean", path=f"$.bindings.{name}")
    return out  # type: ignore[no-any-return]


_BUILDERS: Final[dict[str, tuple[tuple[str, ...], Callable[[_Fields], Envelope]]]] = {
    "hello": (("name", "role"), lambda f: Hello(f.get("name", str), Role(f.get("role", str)))),
    "welcome": (
        ("broker", "session"),
        lambda f: Welcome(f.get("broker", str), f.get("session", str)),
    ),
    "ok": (
        ("ref", "incomplete"),
        lambda f: Ok(f.get("ref", str), f.strings("incomplete") if "incomplete" in f.obj else ()),
    ),
    "error": (("text", "ref"), lambda f: Error(f.get("text", str), f.get("ref", str, ""))),
    "notify": (
        ("publication", "subscriptions", "seq"),
        lambda f: Notify(
            f.message("publication", Publication), f.strings("subscriptions"), f.get("seq", int, 0)
        ),
    ),
    "guaranteed": (
        ("publication",),
        lambda f: Guaranteed(f.message("publication", Publication)),
    ),
    "durable": (
        ("subscription", "acked"),
        lambda f: Durable(f.message("subscription", Subscription), f.get("acked", int, 0)),
    ),
    "ack": (("subscription", "seq"), lambda f: Ack(f.get("subscription", str), f.get("seq", int))),
    "recover": (
        ("request", "subscription", "tree", "after", "limit", "since"),
        lambda f: Recover(
            f.get("request", str),
            f.message("subscription", Subscription),
            f.get("tree", str),
            f.get("after", int),
            f.get("limit", int, 1000),
            float(f.number("since")) if "since" in f.obj else 0.0,
        ),
    ),
    "recovered": (
        ("request", "tree", "publications", "positions", "head", "more", "lost", "error"),
        lambda f: Recovered(
            f.get("request", str),
            f.get("tree", str),
            tuple(_publications(f)),
            _ints(f, "positions"),
            f.get("head", int),
            f.get("more", bool, False),
            f.get("lost", bool, False),
            f.get("error", str, ""),
        ),
    ),
    "composite_notify": (
        ("subscription", "publications", "bindings"),
        lambda f: CompositeNotify(
            f.get("subscription", str),
            tuple(_publications(f)),
            _bindings(f),
        ),
    ),
    "query": (("what",), lambda f: Query(f.get("what", str))),
    "query_result": (
        ("what", "rows"),
        lambda f: QueryResult(f.get("what", str), f.strings("rows")),
    ),
    "route_advertise": (
        ("advertisement", "tree", "path", "replay", "echo"),
        lambda f: RouteAdvertise(
            f.message("advertisement", Advertisement),
            f.get("tree", str),
            f.strings("path"),
            f.get("replay", str, ""),
            f.get("echo", str, ""),
        ),
    ),
    "route_unadvertise": (
        ("advertisement_id", "tree", "lost"),
        lambda f: RouteUnadvertise(
            f.get("advertisement_id", str), f.get("tree", str), f.get("lost", bool, False)
        ),
    ),
    "route_subscribe": (
        ("subscription", "trees", "echo"),
        lambda f: RouteSubscribe(
            f.message("subscription", Subscription), f.strings("trees"), f.get("echo", str, "")
        ),
    ),
    "route_unsubscribe": (
        ("subscription_id", "trees"),
        lambda f: RouteUnsubscribe(f.get("subscription_id", str), f.strings("trees")),
    ),
    "route_publish": (
        ("publication", "tree", "position"),
        lambda f: RoutePublish(
            f.message("publication", Publication), f.get("tree", str), f.get("position", int, 0)
        ),
    ),
    "echo": (
        ("token", "incomplete"),
        lambda f: Echo(
            f.get("token", str), f.strings("incomplete") if "incomplete" in f.obj else ()
        ),
    ),
    "replay_offer": (
        ("advertisement",),
        lambda f: ReplayOffer(f.message("advertisement", Advertisement)),
    ),
    "replay_request": (
        ("subscription", "tree", "database", "ready_at"),
        lambda f: ReplayRequest(
            f.message("subscription", Subscription),
            f.get("tree", str),
            f.get("database", str),
            float(f.number("ready_at")),
        ),
    ),
    "replay_batch": (
        ("request", "database", "publications"),
        lambda f: ReplayBatch(
            f.get("request", str), f.get("database", str), tuple(_publications(f))
        ),
    ),
    "replay_end": (
        ("request", "database", "count", "error"),
        lambda f: ReplayEnd(
            f.get("request", str),
            f.get("database", str),
            f.get("count", int),
            f.get("error", str, ""),
        ),
    ),
    "replay_done": (
        ("subscription", "count", "databases", "failed", "live"),
        lambda f: ReplayDone(
            f.get("subscription", str),
            f.get("count", int),
            f.strings("databases"),
            f.strings("failed") if "failed" in f.obj else (),
            f.get("live", bool, False),
        ),
    ),
}

_TYPES: Final[dict[type, str]] = {
    Hello: "hello",
    Welcome: "welcome",
    Ok: "ok",
    Error: "error",
    Notify: "notify",
    CompositeNotify: "composite_notify",
    Query: "query",
    QueryResult: "query_result",
    RouteAdvertise: "route_advertise",
    RouteUnadvertise: "route_unadvertise",
    RouteSubscribe: "route_subscribe",
    RouteUnsubscribe: "route_unsubscribe",
    RoutePublish: "route_publish",
    Echo: "echo",
    Guaranteed: "guaranteed",
    Durable: "durable",
    Ack: "ack",
    Recover: "recover",
    Recovered: "recovered",
    ReplayOffer: "replay_offer",
    ReplayRequest: "replay_request",
    ReplayBatch: "replay_batch",
    ReplayEnd: "replay_end",
    ReplayDone: "replay_done",
}


def _ints(f: _Fields, key: str) -> tuple[int, ...]:
    items = f.get(key, list)
    for i, item in enumerate(items):
        if type(item) is not int:
            raise DecodeError("must be an integer", path=f"$.{key}[{i}]")
    return tuple(items)


def _publications(f: _Fields) -> list[Publication]:
    items = f.get("publications", list)
    return [_nested(item, Publication, f"$.publications[{i}]") for i, item in enumerate(items)]


def envelope_from_dict(obj: Any) -> Envelope:
    """The message a decoded JSON object describes; raises ``DecodeError``."""
    kind = obj.get("type") if type(obj) is dict else None
    if type(kind) is str and kind in _BUILDERS:
        if obj.get("v") != VERSION or type(obj.get("v")) is not int:
            raise DecodeError(
                f"unsupported version {obj.get('v')!r} (this side speaks {VERSION})", path="$.v"
            )
        allowed, build = _BUILDERS[kind]
        try:
            return build(_Fields(obj, allowed))
        except DecodeError:
            raise
        except (InvalidMessage, ValueError) as exc:
            raise DecodeError(str(exc)) from None
    return from_dict(obj)


def websocket_url(url: str) -> str:
    """``ws://host:port`` or ``ws://host:port/ws``: a broker's WebSocket endpoint."""
    url = url.rstrip("/")
    return url if url.endswith("/ws") else f"{url}/ws"


def encode_frame(messages: Iterable[Envelope]) -> bytes:
    """One frame holding ``messages``: a JSON array (a batch)."""
    return orjson.dumps([envelope_to_dict(m) for m in messages])


@dataclass(frozen=True, slots=True)
class Rejected:
    """A message of a frame that did not decode: why, and the id it carried if any."""

    error: DecodeError
    ref: str = ""


def _ref(item: Any) -> str:
    if type(item) is dict:
        for key in ("id", "subscription_id", "advertisement_id"):
            if type(item.get(key)) is str:
                return item[key]  # type: ignore[no-any-return]
    return ""


def decode_frame(
    data: bytes | str, *, max_bytes: int = MAX_FRAME_BYTES
) -> list[Envelope | Rejected]:
    """The messages of a frame, in order; one that does not decode is ``Rejected`` in its place.

    A frame that is too large or not JSON at all raises ``DecodeError``: nothing in it is used.
    """
    obj = load_json(data, max_bytes, "frame")
    items = obj if type(obj) is list else [obj]
    out: list[Envelope | Rejected] = []
    for item in items:
        try:
            out.append(envelope_from_dict(item))
        except DecodeError as exc:
            out.append(Rejected(exc, _ref(item)))
    return out
