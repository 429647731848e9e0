"""The JSON codec of every message: one versioned object per message, a frame of several.

The message types (``padres.messages`` and ``padres.protocol``) are ``msgspec`` structs; their
declarations are their JSON form: ``"type"`` is the class's tag, ``"v"`` the protocol version,
then one key per field. Only filters and composite expressions are written by hand here::

    {"type": "publication", "id": "p1", "attributes": {"class": "STOCK", "open": 63.3},
     "timestamp": "2026-11-21T13:44:02.123456Z", "publisher": "c1", "v": 1}
    {"type": "subscription", "id": "s1", "filter": [["class", "eq", "STOCK"], ["open", "<", 70]],
     "v": 1}
    {"type": "advertisement", "id": "a1",
     "filter": [["class", "eq", "STOCK"], ["open", "isPresent"]], "v": 1}
    {"type": "composite_subscription", "id": "s2",
     "expression": {"all": [[...], {"any": [[...], [...]]}]}, "v": 1}
    {"type": "unsubscribe", "subscription_id": "s1", "v": 1}
    {"type": "unadvertise", "advertisement_id": "a1", "v": 1}

A filter is its list of predicates, its time window written as ``["time", op, "<ISO time>"]``
predicates; in an expression, ``{"filter": [...]}`` is read as the same filter. A variable
operand is ``{"var": "X", "type": "S"}`` (``type`` is ``""``, ``S``, ``I`` or ``F``).

Decoding checks everything, the types of every field and the rules of the language, and raises
``DecodeError`` naming the offending field (``$.publication.attributes``). A frame is one message
or a JSON array of them; ``Codec.decode_frame`` refuses a bad message of a frame on its own.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Generic, TypeVar

import msgspec

from padres.errors import DecodeError, InvalidMessage
from padres.messages import (
    TIME,
    VERSION,
    AllOf,
    AnyOf,
    Expression,
    Filter,
    Message,
    Predicate,
    TimeWindow,
    Variable,
    VarType,
    WireMessage,
)
from padres.times import narrow, parse_time, window_predicates
from rete.operators import Op

__all__ = [
    "MAX_FRAME_BYTES",
    "MESSAGES",
    "VERSION",
    "Codec",
    "Rejected",
    "decode",
    "encode",
    "encode_frame",
    "from_dict",
    "to_dict",
]

MAX_FRAME_BYTES: Final = 4 << 20
"""A frame (one message or a batch) may not be larger than this."""
_MAX_DEPTH: Final = 32

# -- filters and expressions: the hand-written part ----------------------------------------------


def _predicate(p: Predicate) -> list[Any]:
    # Op and VarType are string enums: msgspec writes their values.
    if p.value is None:
        return [p.attribute, p.op]
    if isinstance(p.value, Variable):
        return [p.attribute, p.op, {"var": p.value.name, "type": p.value.type}]
    return [p.attribute, p.op, p.value]


def _filter(f: Filter) -> list[list[Any]]:
    predicates = [_predicate(p) for p in f.predicates]
    if f.window is not None:
        predicates += [[a, op, at] for a, op, at in window_predicates(f.window)]
    return predicates


def _encode_custom(obj: Any) -> Any:
    """The JSON form of what is not a struct: a filter, or the junctions of an expression."""
    if isinstance(obj, Filter):
        return _filter(obj)
    if isinstance(obj, AllOf):
        return {"all": list(obj.parts)}
    if isinstance(obj, AnyOf):
        return {"any": list(obj.parts)}
    raise NotImplementedError(f"{type(obj).__name__} has no JSON form")


def _field(obj: dict[str, Any], key: str, kind: type, path: str) -> Any:
    if key not in obj:
        raise DecodeError(f"missing field {key!r}", path=path)
    value = obj[key]
    if type(value) is not kind:
        raise DecodeError(
            f"must be {kind.__name__}, not {type(value).__name__}", path=f"{path}.{key}"
        )
    return value


_OPS: Final = {op.value: op for op in Op}


_KNOWN_PREDICATES: Final[dict[tuple[Any, ...], Predicate]] = {}
"""Predicates already decoded, by their JSON items and the type of the last one (so that 1,
1.0 and true differ): routing carries the same ones again and again."""
_MAX_KNOWN_PREDICATES: Final = 8192


def _decode_predicate(item: Any, path: str) -> Predicate:
    if type(item) is not list or len(item) not in (2, 3):
        raise DecodeError(
            "a predicate is [attribute, operator] or [attribute, operator, value]", path=path
        )
    key = (*item, type(item[-1]))
    try:
        known = _KNOWN_PREDICATES.get(key)
    except TypeError:  # a variable operand (a dict), or a bad item: decoded below each time
        return _new_predicate(item, path)
    if known is None:
        known = _new_predicate(item, path)
        if len(_KNOWN_PREDICATES) >= _MAX_KNOWN_PREDICATES:
            _KNOWN_PREDICATES.clear()
        _KNOWN_PREDICATES[key] = known
    return known


def _new_predicate(item: list[Any], path: str) -> Predicate:
    attribute, op_text, *rest = item
    op = _OPS.get(op_text) if type(op_text) is str else None
    if op is None:
        raise DecodeError(f"unknown operator {op_text!r}", path=f"{path}[1]")
    value = rest[0] if rest else None
    if type(value) is dict:
        extra = sorted(set(value) - {"var", "type"})
        if extra:
            raise DecodeError(f"unknown field {extra[0]!r}", path=f"{path}[2]")
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
    now: datetime | None = None  # one instant for every "now" of the filter
    for i, item in enumerate(items):
        if type(item) is list and len(item) == 3 and item[0] == TIME:
            now = now or datetime.now(UTC)
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


_EXPECTED_EXPRESSION: Final = 'expected [predicates...], {"all": [...]} or {"any": [...]}'


def _decode_expression(obj: Any, path: str, depth: int = 0) -> Expression:
    if depth > _MAX_DEPTH:
        raise DecodeError(f"composite nested deeper than {_MAX_DEPTH}", path=path)
    if type(obj) is list:
        return _decode_filter(obj, path)
    if type(obj) is not dict or len(obj) != 1:
        raise DecodeError(_EXPECTED_EXPRESSION, path=path)
    ((key, value),) = obj.items()
    if key == "filter":
        return _decode_filter(value, f"{path}.filter")
    if key not in ("all", "any") or type(value) is not list:
        raise DecodeError(_EXPECTED_EXPRESSION, path=path)
    parts = tuple(
        _decode_expression(part, f"{path}.{key}[{i}]", depth + 1) for i, part in enumerate(value)
    )
    try:
        return AllOf(parts) if key == "all" else AnyOf(parts)
    except InvalidMessage as exc:
        raise DecodeError(str(exc), path=path) from None


_CUSTOM_DECODERS: Final[dict[Any, Callable[[Any, str], Any]]] = {
    Filter: _decode_filter,
    Expression: _decode_expression,
}


def _decode_custom(kind: type, obj: Any) -> Any:
    """Called by msgspec for the types that are not structs, with the JSON value decoded."""
    decoder = _CUSTOM_DECODERS.get(kind)
    if decoder is None:
        raise NotImplementedError(f"no JSON decoding for {kind.__name__}")
    return decoder(obj, "$")


# -- errors --------------------------------------------------------------------------------------

_REASONS: Final[list[tuple[re.Pattern[str], str]]] = [
    (re.compile(r"Object missing required field `(.*)`"), "missing field '{0}'"),
    (re.compile(r"Object contains unknown field `(.*)`"), "unknown field '{0}'"),
    (
        re.compile(r"Expected `datetime` with a timezone component"),
        "a timestamp needs a time zone (Z or +hh:mm)",
    ),
    (
        re.compile(r"Invalid RFC3339 encoded datetime"),
        "not an ISO 8601 timestamp with a time zone (2026-11-21T10:00:00Z)",
    ),
    (re.compile(r"Expected `(.*)`, got `(.*)`"), "must be {0}, not {1}"),
    (re.compile(r"Invalid enum value (.*)"), "unknown value {0}"),
    (re.compile(r"Number out of range"), "number out of range"),
]


def _message_types(types: Iterable[type]) -> str:
    return ", ".join(sorted(t.__struct_config__.tag for t in types))  # type: ignore[attr-defined]


def _translate(exc: msgspec.ValidationError, types: tuple[type, ...]) -> DecodeError:
    """msgspec's error as a ``DecodeError`` in the project's words, with its field path."""
    text, at, where = str(exc).rpartition(" - at `")
    reason, path = (text, where.removesuffix("`")) if at else (str(exc), "$")
    cause = exc.__cause__
    if isinstance(cause, DecodeError):  # from a filter or an expression: its path goes on
        return DecodeError(cause.reason, path=path + cause.path[1:])
    if isinstance(cause, InvalidMessage):  # a rule of the language, checked by the message
        return DecodeError(str(cause), path=path)
    if path.endswith(".type") and reason.startswith("Invalid value "):
        kind = reason.removeprefix("Invalid value ")
        if path != "$.type":
            return DecodeError(f"a message of type {kind} does not belong here", path=path)
        return DecodeError(
            f"unknown message type {kind} (one of {_message_types(types)})", path=path
        )
    for pattern, template in _REASONS:
        match = pattern.fullmatch(reason)
        if match:
            reason = template.format(*match.groups())
            break
    if path.endswith(".v"):
        value = reason.removeprefix("unknown value ")
        if value == reason:  # not a number
            reason = f"unsupported version ({reason}; this side speaks {VERSION})"
        else:
            reason = f"unsupported version {value} (this side speaks {VERSION})"
    elif path == "$" and reason.startswith("must be object"):
        reason = f"a message is a JSON object, not {reason.rpartition(', not ')[2]}"
    return DecodeError(reason, path=path)


# -- the codec -----------------------------------------------------------------------------------

T = TypeVar("T")

_ENCODER: Final = msgspec.json.Encoder(enc_hook=_encode_custom)
_RAW_ITEMS: Final = msgspec.json.Decoder(list[msgspec.Raw])


@dataclass(frozen=True, slots=True)
class Rejected:
    """A message of a frame that did not decode: why, and the id it carried if any."""

    error: DecodeError
    ref: str = ""


def _ref(raw: msgspec.Raw | bytes | str) -> str:
    try:
        item = msgspec.json.decode(raw)
    except msgspec.DecodeError:  # a number out of range, say
        return ""
    if type(item) is dict:
        for key in ("id", "subscription_id", "advertisement_id"):
            if type(item.get(key)) is str:
                return item[key]  # type: ignore[no-any-return]
    return ""


def _check_size(data: bytes | str, max_bytes: int, what: str) -> None:
    size = len(data.encode() if isinstance(data, str) else data)
    if size > max_bytes:
        raise DecodeError(f"{what} of {size} bytes exceeds the limit of {max_bytes} bytes")


class Codec(Generic[T]):
    """Encoding and decoding of the messages of ``kind``, a union of message structs."""

    def __init__(self, kind: Any) -> None:
        self._kind = kind
        self._types: tuple[type, ...] = getattr(kind, "__args__", (kind,))
        self._one = msgspec.json.Decoder(kind, dec_hook=_decode_custom)
        self._frame = msgspec.json.Decoder(list[kind] | kind, dec_hook=_decode_custom)

    def decode(self, data: bytes | str, max_bytes: int = MAX_FRAME_BYTES) -> T:
        """One message; anything wrong with it raises ``DecodeError``."""
        _check_size(data, max_bytes, "message")
        try:
            return self._one.decode(data)  # type: ignore[no-any-return]
        except msgspec.ValidationError as exc:
            raise _translate(exc, self._types) from None
        except msgspec.DecodeError as exc:
            raise DecodeError(f"not valid JSON: {exc}") from None

    def decode_frame(
        self, data: bytes | str, max_bytes: int = MAX_FRAME_BYTES
    ) -> list[T | Rejected]:
        """The messages of a frame, in order; one that does not decode is ``Rejected`` in its
        place. A frame that is too large or not JSON at all raises ``DecodeError``."""
        _check_size(data, max_bytes, "frame")
        try:
            out = self._frame.decode(data)
            return out if type(out) is list else [out]
        except msgspec.ValidationError:
            pass  # some message is bad: decode each on its own, below
        except msgspec.DecodeError as exc:
            raise DecodeError(f"not valid JSON: {exc}") from None
        is_batch = data.lstrip()[:1] in (b"[", "[")
        raws: list[msgspec.Raw] | list[bytes | str] = (
            _RAW_ITEMS.decode(data) if is_batch else [data]
        )
        results: list[T | Rejected] = []
        for raw in raws:
            try:
                results.append(self._one.decode(raw))
            except msgspec.ValidationError as exc:
                results.append(Rejected(_translate(exc, self._types), _ref(raw)))
        return results

    def from_dict(self, obj: Any) -> T:
        """The message a JSON object already parsed (by orjson, say) describes."""
        try:
            return msgspec.convert(obj, self._kind, dec_hook=_decode_custom)  # type: ignore[no-any-return]
        except msgspec.ValidationError as exc:
            raise _translate(exc, self._types) from None


MESSAGES: Final[Codec[Message]] = Codec(Message)
"""The codec of the language's messages; ``padres.protocol`` has the one of every message."""


def encode(message: WireMessage) -> bytes:
    """One message as JSON."""
    return _ENCODER.encode(message)


def encode_frame(messages: Iterable[WireMessage]) -> bytes:
    """One frame holding ``messages``: a JSON array (a batch)."""
    return _ENCODER.encode(list(messages))


def decode(data: bytes | str, *, max_bytes: int = MAX_FRAME_BYTES) -> Message:
    """Decode one JSON message; oversized or malformed input raises ``DecodeError``."""
    return MESSAGES.decode(data, max_bytes)


def to_dict(message: WireMessage) -> dict[str, Any]:
    """A message as a JSON-ready dict, the same object ``encode`` writes."""
    return msgspec.to_builtins(message, enc_hook=_encode_custom)  # type: ignore[no-any-return]


def from_dict(obj: Any) -> Message:
    """The language message a decoded JSON object describes; raises ``DecodeError``."""
    return MESSAGES.from_dict(obj)
