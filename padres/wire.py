"""The JSON wire format: one versioned object per message.

::

    {"v": 1, "type": "publication", "id": "p1", "publisher": "c1",
     "timestamp": "2026-11-21T13:44:02.123456+00:00",
     "attributes": {"class": "STOCK", "open": 63.3}}
    {"v": 1, "type": "subscription", "id": "s1",
     "filter": [["class", "eq", "STOCK"], ["open", "<", 70]]}
    {"v": 1, "type": "advertisement", "id": "a1",
     "filter": [["class", "eq", "STOCK"], ["open", "isPresent"]]}
    {"v": 1, "type": "composite_subscription", "id": "s2",
     "expression": {"all": [{"filter": [...]}, {"any": [{"filter": [...]}, {"filter": [...]}]}]}}
    {"v": 1, "type": "unsubscribe", "subscription_id": "s1"}
    {"v": 1, "type": "unadvertise", "advertisement_id": "a1"}

A variable operand is ``{"var": "X", "type": "S"}`` (``type`` is ``""``, ``S``, ``I`` or ``F``).
Decoding checks everything and raises ``DecodeError`` naming the offending field.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

import orjson

from padres.errors import DecodeError, InvalidMessage
from padres.messages import (
    TIME,
    Advertisement,
    AllOf,
    AnyOf,
    CompositeSubscription,
    Expression,
    Filter,
    Message,
    Predicate,
    Publication,
    Subscription,
    TimeWindow,
    Unadvertise,
    Unsubscribe,
    Variable,
    VarType,
)
from padres.times import narrow, parse_time, window_predicates
from rete.operators import Op

__all__ = [
    "MAX_MESSAGE_BYTES",
    "VERSION",
    "decode",
    "encode",
    "from_dict",
    "load_json",
    "to_dict",
]

VERSION: Final = 1
MAX_MESSAGE_BYTES: Final = 1 << 20
_MAX_DEPTH: Final = 32


def _predicate(p: Predicate) -> list[Any]:
    if p.value is None:
        return [p.attribute, p.op.value]
    if isinstance(p.value, Variable):
        return [p.attribute, p.op.value, {"var": p.value.name, "type": p.value.type.value}]
    return [p.attribute, p.op.value, p.value]


def _filter(f: Filter) -> list[list[Any]]:
    times = [[a, op.value, at] for a, op, at in window_predicates(f.window)]
    return [*(_predicate(p) for p in f.predicates), *times]


def _expression(expr: Expression) -> dict[str, Any]:
    if isinstance(expr, Filter):
        return {"filter": _filter(expr)}
    key = "all" if isinstance(expr, AllOf) else "any"
    return {key: [_expression(part) for part in expr.parts]}


def to_dict(message: Message) -> dict[str, Any]:
    """The message as a JSON-ready dict (see the module docstring)."""
    match message:
        case Publication():
            return {
                "v": VERSION,
                "type": "publication",
                "id": message.id,
                "publisher": message.publisher,
                "timestamp": message.timestamp.isoformat(),
                "attributes": dict(message.attributes),
            }
        case Subscription():
            return {
                "v": VERSION,
                "type": "subscription",
                "id": message.id,
                "filter": _filter(message.filter),
            }
        case Advertisement():
            return {
                "v": VERSION,
                "type": "advertisement",
                "id": message.id,
                "filter": _filter(message.filter),
            }
        case CompositeSubscription():
            return {
                "v": VERSION,
                "type": "composite_subscription",
                "id": message.id,
                "expression": _expression(message.expression),
            }
        case Unsubscribe():
            return {"v": VERSION, "type": "unsubscribe", "subscription_id": message.subscription_id}
        case Unadvertise():
            return {
                "v": VERSION,
                "type": "unadvertise",
                "advertisement_id": message.advertisement_id,
            }


def encode(message: Message) -> bytes:
    return orjson.dumps(to_dict(message))


# -- decoding ------------------------------------------------------------------------------------


def _field(obj: dict[str, Any], key: str, kind: type, path: str) -> Any:
    if key not in obj:
        raise DecodeError(f"missing field {key!r}", path=path)
    value = obj[key]
    if type(value) is not kind:
        raise DecodeError(
            f"must be {kind.__name__}, not {type(value).__name__}", path=f"{path}.{key}"
        )
    return value


def _only(obj: dict[str, Any], allowed: frozenset[str], path: str) -> None:
    extra = sorted(set(obj) - allowed)
    if extra:
        raise DecodeError(f"unknown field {extra[0]!r}", path=path)


def _decode_predicate(item: Any, path: str) -> Predicate:
    if type(item) is not list or len(item) not in (2, 3):
        raise DecodeError(
            "a predicate is [attribute, operator] or [attribute, operator, value]", path=path
        )
    attribute, op_text, *rest = item
    try:
        op = Op(op_text)
    except ValueError:
        raise DecodeError(f"unknown operator {op_text!r}", path=f"{path}[1]") from None
    value = rest[0] if rest else None
    if type(value) is dict:
        _only(value, frozenset({"var", "type"}), f"{path}[2]")
        try:
            value = Variable(
                _field(value, "var", str, f"{path}[2]"), VarType(value.get("type", ""))
            )
        except ValueError as exc:
            raise DecodeError(str(exc), path=f"{path}[2]") from None
    try:
        return Predicate(attribute, op, value)
    except InvalidMessage as exc:
        raise DecodeError(str(exc), path=path) from None


def _decode_filter(items: Any, path: str) -> Filter:
    if type(items) is not list:
        raise DecodeError("a filter is a list of predicates", path=path)
    preds: list[Predicate] = []
    window: TimeWindow | None = None
    now = datetime.now(UTC)
    for i, item in enumerate(items):
        if type(item) is list and len(item) == 3 and item[0] == TIME:
            window = _decode_time_bound(window, item, now, f"{path}[{i}]")
        else:
            preds.append(_decode_predicate(item, f"{path}[{i}]"))
    try:
        return Filter(tuple(preds), window)
    except InvalidMessage as exc:
        raise DecodeError(str(exc), path=path) from None


def _decode_time_bound(
    window: TimeWindow | None, item: list[Any], now: datetime, path: str
) -> TimeWindow:
    _, op_text, at = item
    if type(at) is not str:
        raise DecodeError("a time is a string: an ISO 8601 time or now-1h", path=f"{path}[2]")
    try:
        return narrow(window, Op(op_text), parse_time(at, now))
    except ValueError as exc:  # an unknown operator, or InvalidMessage
        raise DecodeError(str(exc), path=path) from None


def _decode_expression(obj: Any, path: str, depth: int = 0) -> Expression:
    if depth > _MAX_DEPTH:
        raise DecodeError(f"composite nested deeper than {_MAX_DEPTH}", path=path)
    if type(obj) is not dict or len(obj) != 1:
        raise DecodeError('expected {"filter": [...]}, {"all": [...]} or {"any": [...]}', path=path)
    ((key, value),) = obj.items()
    if key == "filter":
        return _decode_filter(value, f"{path}.filter")
    if key not in ("all", "any") or type(value) is not list:
        raise DecodeError('expected {"filter": [...]}, {"all": [...]} or {"any": [...]}', path=path)
    parts = tuple(
        _decode_expression(part, f"{path}.{key}[{i}]", depth + 1) for i, part in enumerate(value)
    )
    try:
        return AllOf(parts) if key == "all" else AnyOf(parts)
    except InvalidMessage as exc:
        raise DecodeError(str(exc), path=path) from None


def _decode_timestamp(text: str, path: str) -> datetime:
    try:
        ts = datetime.fromisoformat(text)
    except ValueError:
        raise DecodeError(f"not an ISO 8601 timestamp: {text!r}", path=path) from None
    if ts.tzinfo is None:
        raise DecodeError("timestamp needs a time zone (Z or +hh:mm)", path=path)
    try:
        ts.astimezone(UTC)
    except OverflowError:
        raise DecodeError(
            f"timestamp {text} is out of range: in UTC it falls outside the years 1 to 9999",
            path=path,
        ) from None
    return ts


def _publication(obj: dict[str, Any]) -> Message:
    return Publication(
        _field(obj, "id", str, "$"),
        _field(obj, "attributes", dict, "$"),
        _decode_timestamp(_field(obj, "timestamp", str, "$"), "$.timestamp"),
        _field(obj, "publisher", str, "$") if "publisher" in obj else "",
    )


_DECODERS: Final[dict[str, tuple[frozenset[str], Callable[[dict[str, Any]], Message]]]] = {
    "publication": (
        frozenset({"id", "publisher", "timestamp", "attributes"}),
        _publication,
    ),
    "subscription": (
        frozenset({"id", "filter"}),
        lambda o: Subscription(
            _field(o, "id", str, "$"), _decode_filter(o.get("filter"), "$.filter")
        ),
    ),
    "advertisement": (
        frozenset({"id", "filter"}),
        lambda o: Advertisement(
            _field(o, "id", str, "$"), _decode_filter(o.get("filter"), "$.filter")
        ),
    ),
    "composite_subscription": (
        frozenset({"id", "expression"}),
        lambda o: CompositeSubscription(
            _field(o, "id", str, "$"), _decode_expression(o.get("expression"), "$.expression")
        ),
    ),
    "unsubscribe": (
        frozenset({"subscription_id"}),
        lambda o: Unsubscribe(_field(o, "subscription_id", str, "$")),
    ),
    "unadvertise": (
        frozenset({"advertisement_id"}),
        lambda o: Unadvertise(_field(o, "advertisement_id", str, "$")),
    ),
}


def from_dict(obj: Any) -> Message:
    """The message a decoded JSON object describes; raises ``DecodeError``."""
    if type(obj) is not dict:
        raise DecodeError(f"a message is a JSON object, not {type(obj).__name__}")
    version = obj.get("v")
    if version != VERSION or type(version) is not int:
        raise DecodeError(
            f"unsupported version {version!r} (this side speaks {VERSION})", path="$.v"
        )
    kind = obj.get("type")
    entry = _DECODERS.get(kind) if type(kind) is str else None
    if entry is None:
        raise DecodeError(
            f"unknown message type {kind!r} (one of {', '.join(_DECODERS)})", path="$.type"
        )
    allowed, build = entry
    _only(obj, allowed | {"v", "type"}, "$")
    try:
        return build(obj)
    except DecodeError:
        raise
    except InvalidMessage as exc:
        raise DecodeError(str(exc)) from None


def load_json(data: bytes | str, max_bytes: int, what: str = "message") -> Any:
    """Parse JSON text of at most ``max_bytes``; too large or malformed raises ``DecodeError``."""
    size = len(data.encode() if isinstance(data, str) else data)
    if size > max_bytes:
        raise DecodeError(f"{what} of {size} bytes exceeds the limit of {max_bytes} bytes")
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"not valid JSON: {exc}") from None


def decode(data: bytes | str, *, max_bytes: int = MAX_MESSAGE_BYTES) -> Message:
    """Decode one JSON message; oversized or malformed input raises ``DecodeError``."""
    return from_dict(load_json(data, max_bytes))
