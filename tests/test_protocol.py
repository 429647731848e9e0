"""Frames and the session / routing messages: round trips, and clear errors for bad input."""

from __future__ import annotations

import typing
from datetime import UTC, datetime

import orjson
import pytest

from padres.errors import ConnectError, DecodeError, InvalidMessage
from padres.language.parser import (
    parse_advertisement,
    parse_composite,
    parse_publication,
    parse_subscription,
)
from padres.model.classes import Schema, parse_attributes
from padres.model.messages import Unadvertise, Unsubscribe
from padres.model.protocol import (
    MAX_FRAME_BYTES,
    MAX_PRIORITY,
    Ack,
    CompositeNotify,
    DeclareSchema,
    DropSchema,
    Durable,
    Echo,
    Envelope,
    Error,
    ExceptionAction,
    ExceptionEntry,
    ExceptionReport,
    Exceptions,
    Failed,
    GoingAway,
    Guaranteed,
    Hello,
    LinkPing,
    LinkPong,
    Lost,
    Notify,
    Ok,
    Outcome,
    PartState,
    Query,
    QueryResult,
    Recover,
    Recovered,
    Rejected,
    ReplayBatch,
    ReplayDone,
    ReplayEnd,
    ReplayOffer,
    ReplayRequest,
    Retry,
    Roam,
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
    Scope,
    Subscribe,
    TxAbort,
    TxBegin,
    TxCommit,
    TxEnded,
    TxNotify,
    TxPublish,
    TxVote,
    Visibility,
    Vote,
    Welcome,
    decode_frame,
    encode_frame,
    http_url,
    websocket_url,
)

_PUB = parse_publication(
    "[class,'Order'],[price,120],[item,'shoes']",
    id="p1",
    timestamp=datetime(2026, 1, 1, tzinfo=UTC),
)

MESSAGES: list[Envelope] = [
    Hello("alice"),
    Hello("B2", Role.BROKER),
    Welcome("B1", "alice@B1"),
    Ok("s1"),
    Ok("a1", ("the link from B1 to B2 was lost",)),
    Echo("e7"),
    Echo("e8", ("the link from B2 to B3 was lost",)),
    Error("no subscription 's9'", "s9"),
    Notify(_PUB, ("s1", "s2")),
    CompositeNotify("c1", (_PUB, _PUB), {"X": "gold", "N": 3}),
    Query("subscriptions"),
    QueryResult("advertisements", ("a b", "c d")),
    RouteAdvertise(parse_advertisement("[class,eq,'Order']", id="B1#x.1"), "B1#x.1", ("B1", "B2")),
    RouteUnadvertise("B1#x.1", "B1#x.1", lost=True),
    RouteSubscribe(parse_subscription("[class,eq,'Order'],[price,>,1]", id="B3#y.4"), ("t1", "t2")),
    RouteSubscribe(parse_subscription("[class,eq,'Order']", id="B3#y.5"), ("t1",), echo="e3"),
    RouteAdvertise(
        parse_advertisement("[class,eq,'A']", id="B1#x.2"), "B1#x.2", ("B1",), echo="e4"
    ),
    RouteUnsubscribe("B3#y.4", ("t1",)),
    RoutePublish(_PUB, "t1"),
    parse_composite("{[class,eq,'A'],[k,eq,$X]} & {[class,eq,'B'],[k,eq,$X]}", id="c1"),
    _PUB,
    parse_subscription("[class,eq,'Order'],[time,>=,'2026-01-01T08:00']", id="s3"),
    parse_advertisement("[class,eq,'Order']", id="a1"),
    Unsubscribe("s3"),
    Unadvertise("a1"),
    Guaranteed(_PUB),
    Durable(parse_subscription("[class,eq,'Order']", id="orders"), acked=41),
    Notify(_PUB, ("orders",), seq=42),
    Ack("orders", 42),
    Failed("f1", "orders", _PUB, "ValueError: no", 4, seq=42),
    Exceptions("x1", "orders", ExceptionAction.PURGE, (3, 5), "manager"),
    ExceptionReport(
        "x1", "orders", (ExceptionEntry(id=3, publication=_PUB, error="E", attempts=4, at=1.5),)
    ),
    Retry("orders", 3, _PUB, 4),
    Recover("r1", parse_subscription("[class,eq,'Order']", id="B2#d.1"), "t1", 7, 500, 1.5),
    Recovered("r1", "t1", (_PUB,), (8,), 9, more=True),
    ReplayOffer(parse_advertisement("[class,eq,'Order']", id="db")),
    ReplayRequest(parse_subscription("[class,eq,'Order']", id="B1#h.1"), "t2", "DB1", 12.5),
    ReplayBatch("B1#h.1", "DB1", (_PUB, _PUB)),
    ReplayEnd("B1#h.1", "DB1", 2, "disk full"),
    ReplayDone("s3", 2, ("DB1",), ("DB2: link lost",), live=True),
    RoutePublish(_PUB, "t1", position=8),
    Subscribe(parse_subscription("[class,eq,'Order']", id="s5"), Visibility.IMMEDIATE),
    Subscribe(parse_subscription("[class,eq,'Order']", id="s6"), priority=-7, scope=Scope.LOCAL),
    Durable(parse_subscription("[class,eq,'Order']", id="e"), priority=3, scope=Scope.LOCAL),
    Durable(parse_subscription("[class,eq,'Order']", id="d"), visibility=Visibility.ON_ABORT),
    Durable(
        parse_subscription("[class,eq,'Order']", id="m"),
        roam=Roam(12.5, "B1", {"shop.1a2b": [[1, 40], [42, 57]]}),
    ),
    RouteRelease("B2#x.7", "B1", "manager", "orders"),
    RouteCongestion("B2", "a1b2c3", 7, True),
    RouteLoss("B1#x.1", "shop@B1", 1204, "p17", "p1220", "B2", "B3", "link queue overflow"),
    Lost("B1#x.1", "shop@B1", 1, "p9", "p9", "B1", "B2", "the link was lost"),
    TxBegin("t1"),
    TxBegin("t3", ("stock", "billing@B2"), wait=2.5),
    TxBegin("j1", join="shop@B1:t1"),
    TxPublish("t1", _PUB),
    TxCommit("t1", 3),
    TxAbort("t1"),
    TxEnded("t1", Outcome.ABORTED, "it was idle for more than 60 s"),
    TxEnded("t2", Outcome.ABORTED, "too many open transactions", limit=True),
    TxNotify(_PUB, ("s5",), tx="shop@B1:t1", outcome=Outcome.PENDING),
    TxNotify(_PUB, ("d",), 4, tx="shop@B1:t1", outcome=Outcome.COMMITTED),
    RouteTxPublish(_PUB, "t1", "shop@B1:t1", Outcome.COMMITTED, 9),
    TxVote("shop@B1:t1", Vote.FAILED, "out of stock"),
    RouteTxVote("shop@B1:t1", "B1#1.2", "stock@B2", Vote.GONE, "stock@B2 disconnected"),
    RouteTxPart("shop@B1:t1", "stock@B2:j1", "stock@B2", PartState.JOIN, ("B2", "B1")),
    RouteTxOutcome("shop@B1:t1", "stock@B2:j1", Outcome.ABORTED, ("B2", "B1"), True, "over"),
    Recovered("r2", "t1", (_PUB,), (8,), 9, transactions=("shop@B1:t1",)),
    DeclareSchema("d1", "Order", parse_attributes("price:float item:string?")),
    DropSchema("d2", "Order"),
    RouteSchema(
        Schema(class_name="Order", version=2, attributes=parse_attributes("x:float")), "e9"
    ),
    RouteSchema(Schema(class_name="Order", version=3, attributes={}, dropped=True)),
    GoingAway("B1", "the broker is shutting down"),
    RoutePath("B1#1.2", ("B1", "B4", "B2"), 3, 0.0125),
    RouteDrain("B1#1.2", "B2#1.9"),
    RouteDrain("B1#1.2", "B2#1.9", done=True),
    RouteVersion("B1#1.2", 3),
    LinkPing(1234.5678),
    LinkPong(1234.5678),
]


def test_every_message_survives_a_frame_round_trip() -> None:
    assert {type(m) for m in MESSAGES} == set(typing.get_args(Envelope))
    assert decode_frame(encode_frame(MESSAGES)) == MESSAGES


def test_a_single_object_is_a_frame_too() -> None:
    assert decode_frame(b'{"v": 1, "type": "ok", "ref": "s1"}') == [Ok("s1")]


def test_a_bad_message_is_rejected_in_place_naming_field_and_id() -> None:
    frame = orjson.dumps(
        [
            {"v": 1, "type": "ok", "ref": "a"},
            {"v": 1, "type": "subscription", "id": "s7", "filter": [["price", ">", "x"]]},
            {"v": 1, "type": "route_subscribe", "subscription": {"v": 1}, "trees": []},
            {"v": 1, "type": "hello", "name": "x", "role": "king"},
            {"v": 1, "type": "ok", "ref": "b"},
        ]
    )
    first, bad, nested, role, last = decode_frame(frame)
    assert first == Ok("a") and last == Ok("b")
    assert isinstance(bad, Rejected) and bad.ref == "s7" and "$.filter" in str(bad.error)
    assert isinstance(nested, Rejected) and "$.subscription" in str(nested.error)
    assert isinstance(role, Rejected) and "king" in str(role.error)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"{nope", "not valid JSON"),
        (b"[" + b" " * MAX_FRAME_BYTES + b"]", "exceeds the limit"),
    ],
)
def test_a_bad_frame_is_refused_as_a_whole(data: bytes, reason: str) -> None:
    with pytest.raises(DecodeError, match=reason):
        decode_frame(data)


def test_a_subscriptions_priority_and_scope_are_checked_where_they_enter() -> None:
    sub = {"v": 1, "type": "subscription", "id": "s", "filter": [["class", "eq", "T"]]}
    frame = [
        {"v": 1, "type": "subscribe", "subscription": sub, "priority": "high"},
        {"v": 1, "type": "subscribe", "subscription": sub, "priority": True},
        {"v": 1, "type": "durable", "subscription": sub, "priority": MAX_PRIORITY + 1},
        {"v": 1, "type": "subscribe", "subscription": sub, "scope": "nearby"},
        {"v": 1, "type": "durable", "subscription": sub, "priority": -MAX_PRIORITY},
    ]
    word, flag, big, scope, lowest = decode_frame(orjson.dumps(frame))
    assert isinstance(word, Rejected) and "$.priority" in str(word.error)
    assert isinstance(flag, Rejected) and "$.priority" in str(flag.error)
    assert isinstance(big, Rejected) and "out of range" in str(big.error)
    assert isinstance(scope, Rejected) and "$.scope" in str(scope.error)
    assert isinstance(lowest, Durable) and lowest.priority == -MAX_PRIORITY
    with pytest.raises(InvalidMessage, match="whole number"):
        Subscribe(lowest.subscription, priority=1.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidMessage, match="scope 'nearby' is not one of global, local"):
        Scope("nearby")


def test_version_and_unknown_fields_are_checked() -> None:
    old, extra = decode_frame(
        orjson.dumps(
            [{"v": 2, "type": "ok", "ref": "a"}, {"v": 1, "type": "ok", "ref": "a", "x": 1}]
        )
    )
    assert isinstance(old, Rejected) and "unsupported version" in str(old.error)
    assert isinstance(extra, Rejected) and "unknown field 'x'" in str(extra.error)


def test_websocket_url_accepts_both_forms() -> None:
    assert websocket_url("ws://h:1") == websocket_url("ws://h:1/ws/") == "ws://h:1/ws"


@pytest.mark.parametrize(
    ("given", "endpoint"),
    [
        ("127.0.0.1:9101", "ws://127.0.0.1:9101/ws"),
        ("http://127.0.0.1:9101", "ws://127.0.0.1:9101/ws"),
        ("HTTPS://b1.example:443/", "wss://b1.example:443/ws"),
        (" wss://b1:8001/ws ", "wss://b1:8001/ws"),
    ],
)
def test_a_broker_address_is_taken_as_users_write_it(given: str, endpoint: str) -> None:
    assert websocket_url(given) == endpoint
    assert http_url(given) == endpoint.replace("ws", "http", 1).removesuffix("/ws")


@pytest.mark.parametrize("given", ["ftp://h:1", "ws://", "", "/ws"])
def test_anything_else_is_refused_saying_what_to_write(given: str) -> None:
    with pytest.raises(ConnectError, match="write ws://host:port"):
        websocket_url(given)
