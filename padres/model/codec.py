"""The JSON codec of every message: one versioned object per message, a frame of several.

The message types (``padres.model.messages`` and ``padres.model.protocol``) are ``msgspec``
structs; their declarations are their JSON form: ``"type"`` is the class's tag, ``"v"`` the
protocol version, then one key per field. Only filters and composite expressions are written by
hand here::

    {"type": "publication", "id": "p1", "attributes": {"class": "STOCK", "open": 63.3},
     "timestamp": "2026-11-21T13:44:02.123456Z", "publisher": "c1", "v": 1}
    {"type": "subscription", "id": "s1", "filter": [["class", "eq", "STOCK"], ["open", "<", 70]],
     "v": 1}
    {"type": "advertisement", "id": "a1",
     "filter": [["class", "eq", "STOCK"], ["open", "isPresent"]], "v": 1}
    {"type": "composite_subscription", "id": "s2",
     "expression": {"all": [[...], {"any": [[...], [...]]}]}, "v": 1}
    {"type": "composite_subscription", "id": "s3",
     "expression": {"seq": [[...], {"not": [...]}]}, "temporal": {"seconds": 10.0}, "v": 1}
    {"type": "unsubscribe", "subscription_id": "s1", "v": 1}
    {"type": "unadvertise", "advertisement_id": "a1", "v": 1}

A filter is its list of predicates, its time window written as ``["time", op, "<ISO time>"]``
predicates; in an expression, ``{"filter": [...]}`` is read as the same filter. A sequence is
``{"seq": [...]}`` (``;``) or ``{"next": [...]}`` (``;;``), an absence ``{"not": [...]}``. A
variable operand is ``{"var": "X", "type": "S"}`` (``type`` is ``""``, ``S``, ``I`` or ``F``).

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
from padres.model.messages import (
    MAX_DEPTH,
    MAX_PREDICATES,
    TIME,
    VERSION,
    Absent,
    AllOf,
    AnyOf,
    Expression,
    Filter,
    Message,
    Predicate,
    Sequence,
    TimeWindow,
    Variable,
    VarType,
    WireMessage,
    checked_before,
    quote,
)
from padres.model.times import narrow, parse_time, window_predicates
from rete.operators import Op

__all__ = [
    "MAX_FRAME_BYTES",
    "MAX_FRAME_MESSAGES",
    "MESSAGES",
    "VERSION",
    "Codec",
    "Rejected",
    "decode",
    "encode",
    "encode_frame",
    "from_dict",
    "loads",
    "to_dict",
]

MAX_FRAME_BYTES: Final = 4 << 20
"""A frame (one message or a batch) may not be larger than this."""
MAX_FRAME_MESSAGES: Final = 10_000
"""A broker refuses a frame of more messages than this (by default); a client sends no more
in one frame."""

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
    if isinstance(obj, Sequence):
        return {"next" if obj.strict else "seq": list(obj.parts)}
    if isinstance(obj, Absent):
        return {"not": obj.filter}
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
        raise DecodeError(f"unknown operator {quote(op_text)}", path=f"{path}[1]")
    value = rest[0] if rest else None
    if type(value) is dict:
        extra = sorted(set(value) - {"var", "type"})
        if extra:
            raise DecodeError(f"unknown field {quote(extra[0])}", path=f"{path}[2]")
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
            if len(preds) > MAX_PREDICATES:  # said before decoding the rest
                raise DecodeError(
                    f"a filter has {len(items):,} items; the limit is {MAX_PREDICATES} predicates",
                    path=path,
                )
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


_EXPECTED_EXPRESSION: Final = (
    'expected [predicates...], {"all": [...]}, {"any": [...]}, {"seq": [...]}, {"next": [...]} '
    'or, in a sequence, {"not": [predicates...]}'
)


def _decode_expression(obj: Any, path: str, depth: int = 0) -> Expression:
    if depth >= MAX_DEPTH:
        raise DecodeError(
            f"a composite subscription is nested deeper than {MAX_DEPTH} groups", path=path
        )
    if type(obj) is list:
        return _decode_filter(obj, path)
    if type(obj) is not dict or len(obj) != 1:
        raise DecodeError(_EXPECTED_EXPRESSION, path=path)
    ((key, value),) = obj.items()
    if key == "filter":
        return _decode_filter(value, f"{path}.filter")
    if key == "not":
        flt = _decode_filter(value, f"{path}.not")
        return Absent(flt)
    if key not in _JUNCTIONS or type(value) is not list:
        raise DecodeError(_EXPECTED_EXPRESSION, path=path)
    parts = tuple(
        _decode_expression(part, f"{path}.{key}[{i}]", depth + 1) for i, part in enumerate(value)
    )
    try:
        return _JUNCTIONS[key](parts)
    except InvalidMessage as exc:
        raise DecodeError(str(exc), path=path) from None


_JUNCTIONS: Final[dict[str, Callable[[tuple[Expression, ...]], Expression]]] = {
    "all": AllOf,
    "any": AnyOf,
    "seq": Sequence,
    "next": lambda parts: Sequence(parts, strict=True),
}

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


_LONG_QUOTE: Final = re.compile(r"'[^']{40,}'")
"""A long value quoted in msgspec's words: an error repeats it cut short (``quote``)."""


def _message_types(types: Iterable[type]) -> str:
    return ", ".join(sorted(t.__struct_config__.tag for t in types))  # type: ignore[attr-defined]


class _Reading:
    """Input that is not JSON, not UTF-8 or nested too deep, as ``DecodeError``; a
    ``msgspec.ValidationError`` (JSON of the wrong shape) goes on to the caller, which says
    where."""

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if exc is None or isinstance(exc, msgspec.ValidationError):
            return
        if isinstance(exc, msgspec.DecodeError):
            raise DecodeError(f"not valid JSON: {exc}") from None
        if isinstance(exc, UnicodeDecodeError):
            raise _not_utf8(exc) from None
        if isinstance(exc, RecursionError):
            raise _too_deep(exc) from None


_READING: Final = _Reading()


def _translate(exc: msgspec.ValidationError, types: tuple[type, ...]) -> DecodeError:
    """msgspec's error as a ``DecodeError`` in the project's words, with its field path."""
    text, at, where = str(exc).rpartition(" - at `")
    reason, path = (text, where.removesuffix("`")) if at else (str(exc), "$")
    reason = _LONG_QUOTE.sub(lambda m: quote(m.group()[1:-1]), reason)
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


_FIELDS: Final = msgspec.json.Decoder(dict[str, msgspec.Raw])
"""A message's fields, undecoded: finding its id costs no more than reading it."""


def _ref(raw: msgspec.Raw | bytes | str) -> str:
    try:
        fields = _FIELDS.decode(raw)
        for key in ("id", "subscription_id", "advertisement_id", "ref"):
            if key in fields:
                value = msgspec.json.decode(fields[key])
                if type(value) is str and len(value) <= _MAX_REF:
                    return value
    except (msgspec.DecodeError, ValueError, RecursionError):  # not an object, not UTF-8, ...
        pass
    return ""


_MAX_REF: Final = 256
"""The longest id a refusal names (an id is at most that long)."""
_EXPONENT: Final = re.compile(rb"-\d{3}")
"""A hint that a frame may hold a number too small for a float (``1e-400``) where an ``e`` or
``E`` comes before it (searched for ``-`` first, which is much rarer than ``e`` in JSON)."""
_ZEROS: Final = b"." + b"0" * 200
"""The other hint: a number written with 200 zeros after its point (``0.000...01``): with an
exponent of -99 or more (the first hint catches lower ones), one needs 224 to read as 0."""
_TOKENS: Final = re.compile(rb'"(?:[^"\\]|\\.)*"|(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)')
"""A JSON string, or a number (group 1)."""


def _check_size(data: bytes | str, max_bytes: int, what: str) -> None:
    try:
        size = len(data.encode() if isinstance(data, str) else data)
    except UnicodeEncodeError:
        raise DecodeError(f"{what} is not valid Unicode (a lone surrogate)") from None
    if size > max_bytes:
        raise DecodeError(f"{what} of {size} bytes exceeds the limit of {max_bytes} bytes")


def _check_numbers(data: bytes | str) -> None:
    """Refuse a number that is not zero but reads as 0.0 (``1e-400``): msgspec would take it
    for zero. Numbers too large are refused by msgspec itself."""
    raw = data.encode() if isinstance(data, str) else data
    if _ZEROS not in raw and not any(raw[m.start() - 1] in b"eE" for m in _EXPONENT.finditer(raw)):
        return
    for match in _TOKENS.finditer(raw):
        number = match.group(1)
        if number is None:
            continue
        mantissa = number.partition(b"e")[0].partition(b"E")[0]
        if float(number) == 0.0 and mantissa.strip(b"-0.") != b"":
            raise DecodeError(
                f"number {quote(number.decode())} is too small for a 64-bit float "
                "(it would read as 0)"
            )


def _not_utf8(exc: UnicodeDecodeError) -> DecodeError:
    return DecodeError(f"not UTF-8 text ({exc.reason})")


def _too_deep(exc: RecursionError) -> DecodeError:
    return DecodeError(f"JSON nested too deep ({exc})")


class Codec(Generic[T]):
    """Encoding and decoding of the messages of ``kind``, a union of message structs."""

    def __init__(self, kind: Any) -> None:
        self._kind = kind
        self._types: tuple[type, ...] = getattr(kind, "__args__", (kind,))
        self._one = msgspec.json.Decoder(kind, dec_hook=_decode_custom)
        self._frame = msgspec.json.Decoder(list[kind] | kind, dec_hook=_decode_custom)

    def decode(
        self, data: bytes | str, max_bytes: int = MAX_FRAME_BYTES, *, checked: bool = False
    ) -> T:
        """One message; anything wrong with it raises ``DecodeError``. ``checked``: as for
        ``decode_frame``."""
        _check_size(data, max_bytes, "message")
        if not checked:
            _check_numbers(data)
        try:
            with _READING, checked_before(checked):
                return self._one.decode(data)  # type: ignore[no-any-return]
        except msgspec.ValidationError as exc:
            raise _translate(exc, self._types) from None

    def decode_frame(
        self, data: bytes | str, max_bytes: int = MAX_FRAME_BYTES, *, checked: bool = False
    ) -> list[T | Rejected]:
        """The messages of a frame, in order; one that does not decode is ``Rejected`` in its
        place. A frame that is too large or not JSON at all raises ``DecodeError``.
        ``checked``: the frame comes from a broker (see ``checked_before``), which wrote its
        numbers itself: none of them is too small for a float."""
        with checked_before(checked):
            return self._decode_frame(data, max_bytes, checked)

    def _decode_frame(self, data: bytes | str, max_bytes: int, checked: bool) -> list[T | Rejected]:
        _check_size(data, max_bytes, "frame")
        if not checked:
            _check_numbers(data)
        try:
            with _READING:
                out = self._frame.decode(data)
            return out if type(out) is list else [out]
        except msgspec.ValidationError as exc:
            if data.lstrip()[:1] in (b"{", "{"):  # one message: it is the bad one
                return [Rejected(_translate(exc, self._types), _ref(data))]
            # some message of a batch is bad: decode each on its own, below
        is_batch = data.lstrip()[:1] in (b"[", "[")
        try:
            raws: list[msgspec.Raw] | list[bytes | str] = (
                _RAW_ITEMS.decode(data) if is_batch else [data]
            )
        except msgspec.DecodeError as exc:  # found malformed past the first bad message
            raise DecodeError(f"not valid JSON: {exc}") from None
        except UnicodeDecodeError as exc:
            raise _not_utf8(exc) from None
        except RecursionError as exc:
            raise _too_deep(exc) from None
        results: list[T | Rejected] = []
        for raw in raws:
            try:
                results.append(self._one.decode(raw))
            except msgspec.ValidationError as exc:
                results.append(Rejected(_translate(exc, self._types), _ref(raw)))
            except UnicodeDecodeError as exc:
                results.append(Rejected(_not_utf8(exc)))
            except RecursionError as exc:
                results.append(Rejected(_too_deep(exc)))
        return results

    def from_dict(self, obj: Any) -> T:
        """The message a JSON object already parsed (by orjson, say) describes."""
        try:
            return msgspec.convert(obj, self._kind, dec_hook=_decode_custom)  # type: ignore[no-any-return]
        except msgspec.ValidationError as exc:
            raise _translate(exc, self._types) from None


MESSAGES: Final[Codec[Message]] = Codec(Message)
"""The codec of the language's messages; ``padres.model.protocol`` has the one of every message."""


def encode(message: WireMessage) -> bytes:
    """One message as JSON."""
    return _ENCODER.encode(message)


def encode_frame(messages: Iterable[WireMessage]) -> bytes:
    """One frame holding ``messages``: a JSON array (a batch)."""
    return _ENCODER.encode(list(messages))


def decode(
    data: bytes | str, *, max_bytes: int = MAX_FRAME_BYTES, checked: bool = False
) -> Message:
    """Decode one JSON message; oversized or malformed input raises ``DecodeError``.
    ``checked``: it comes from a broker (``padres.model.messages.checked_before``)."""
    return MESSAGES.decode(data, max_bytes, checked=checked)


_ANY: Final = msgspec.json.Decoder()


def loads(data: bytes | str) -> Any:
    """JSON as Python values, its numbers exact: an integer of any size stays an integer (the
    language then refuses one beyond 64 bits, never rounding it to a float), and a number too
    large or too small for a float is refused. Anything wrong raises ``DecodeError``."""
    _check_numbers(data)
    try:
        with _READING:
            return _ANY.decode(data)
    except msgspec.ValidationError as exc:  # a number too large for a float
        raise DecodeError(_translate(exc, ()).reason) from None


def to_dict(message: WireMessage) -> dict[str, Any]:
    """A message as a JSON-ready dict, the same object ``encode`` writes."""
    return msgspec.to_builtins(message, enc_hook=_encode_custom)  # type: ignore[no-any-return]


def from_dict(obj: Any) -> Message:
    """The language message a decoded JSON object describes; raises ``DecodeError``."""
    return MESSAGES.from_dict(obj)
