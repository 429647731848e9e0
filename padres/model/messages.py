"""The message model: small immutable types that every layer converts into and out of.

Every constructor checks the rules of the language and raises ``InvalidMessage`` naming what is
wrong, so a message that exists is a valid one, however it was made (parsed, decoded, built).

The messages are ``msgspec`` structs derived from ``WireMessage``: their declaration is also their
JSON form (``padres.model.codec`` holds the codec). Filters and composite expressions have a compact
JSON form of their own (lists of predicates), written and read by ``padres.model.codec``.
"""

from __future__ import annotations

import math
import re
import sys
import unicodedata
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from functools import cached_property
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    Final,
    Literal,
    NamedTuple,
    NoReturn,
    TypeAlias,
    TypeGuard,
)

import msgspec
from msgspec import UNSET, UnsetType
from msgspec.structs import force_setattr

from padres.errors import InvalidMessage
from rete.conditions import Absence, Gap, Order
from rete.operators import NUMERIC, Op, OperandKind, Value, operand_kind

__all__ = [
    "MAX_ATTRIBUTES",
    "MAX_DEPTH",
    "MAX_ID",
    "MAX_PARTS",
    "MAX_PATTERNS",
    "MAX_PREDICATES",
    "MAX_STRING_BYTES",
    "TIME",
    "VERSION",
    "Absent",
    "Advertisement",
    "AllOf",
    "AnyOf",
    "Attributes",
    "CompositeSubscription",
    "Expression",
    "Filter",
    "Message",
    "Origin",
    "Predicate",
    "Publication",
    "Sequence",
    "Subscription",
    "Temporal",
    "TimeWindow",
    "Unadvertise",
    "Unsubscribe",
    "VarType",
    "Variable",
    "WireMessage",
    "check_id",
    "check_name",
    "check_value",
    "checked_before",
    "quote",
]

_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,255}")
MAX_ID: Final = 256
"""Characters of an id at most (publication, subscription, client and broker ids)."""
_ID: Final = re.compile(r"[^\x00-\x20\x7f,\[\]{}()'\"/\\]{1," + str(MAX_ID) + "}")
_INT64: Final = range(-(2**63), 2**63)
MAX_PATTERNS: Final = 256
"""A composite subscription may expand to at most this many alternative conjunctions."""
MAX_PREDICATES: Final = 256
"""A filter holds at most this many predicates."""
MAX_ATTRIBUTES: Final = 1024
"""A publication holds at most this many attributes."""
MAX_STRING_BYTES: Final = 1 << 20
"""A string value is at most this long, in bytes of UTF-8."""
MAX_DEPTH: Final = 32
"""A composite subscription nests groups at most this deep."""
MAX_PARTS: Final = 64
"""A composite subscription joins at most this many filters."""
VERSION: Final = 1
"""The protocol version every message carries as ``"v"``."""


class WireMessage(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    tag_field="type",
    forbid_unknown_fields=True,
    repr_omit_defaults=True,
    gc=False,
):
    """The base of every message: written as a JSON object with ``"type"`` (the class's tag),
    its fields, and ``"v"``, the protocol version, which decoding checks (``padres.model.codec``).

    A subclass declares its tag and fields; ``__post_init__`` checks what the types cannot, and
    runs both when a message is built and when it is decoded. Messages hold no reference cycles,
    so the garbage collector does not track them (``gc=False``): decoding many is cheaper."""

    v: Literal[1] = VERSION


class _Valid:
    """Whether a string matches ``pattern``; the strings already found to, a bounded set, skip
    the regular expression (messages carry the same names and ids again and again)."""

    def __init__(
        self, pattern: re.Pattern[str], most: int = 4096, also: Callable[[str], bool] | None = None
    ) -> None:
        self.pattern = pattern
        self.also = also
        self.most = most
        self.seen: set[str] = set()

    def __call__(self, text: object) -> TypeGuard[str]:
        if type(text) is not str:
            return False
        if text in self.seen:
            return True
        if not self.pattern.fullmatch(text) or (self.also is not None and not self.also(text)):
            return False
        if len(self.seen) >= self.most:
            self.seen.clear()
        self.seen.add(text)
        return True


def _visible(text: str) -> bool:
    """Whether every character is a letter, mark, number, punctuation or symbol: no spaces,
    control or format characters (NUL, right-to-left overrides, zero-width joiners, ...)."""
    return text.isascii() or all(unicodedata.category(c)[0] in "LMNPS" for c in text)


_VALID_NAME: Final = _Valid(_NAME)
_VALID_ID: Final = _Valid(_ID, also=_visible)


def quote(value: object, most: int = 40) -> str:
    """``repr(value)``, cut short in the middle: errors quote what they refuse, never at
    length."""
    text = repr(value)
    if len(text) <= most:
        return text
    half = (most - 5) // 2
    return f"{text[:half]}[...]{text[-half:]} ({len(text):,} characters)"


def check_name(name: object, what: str = "attribute name") -> str:
    """Return ``name`` if it is a valid attribute (or variable) name, else raise
    ``InvalidMessage``."""
    if not _VALID_NAME(name):
        raise InvalidMessage(
            f"invalid {what} {quote(name)}: 1 to 256 letters, digits, '_', '.', '-', "
            "starting with a letter or '_'"
        )
    return name


def check_id(ident: object, what: str) -> str:
    """Return ``ident`` if it is a valid id: 1 to 256 visible characters, none of which are
    quotes, commas, brackets or slashes."""
    if type(ident) is str and ident.isalnum() and ident.isascii() and len(ident) <= MAX_ID:
        return ident  # letters and digits only, the common case: no pattern to match
    if not _VALID_ID(ident):
        raise InvalidMessage(
            f"invalid {what} {quote(ident)}: 1 to 256 visible characters, no spaces, quotes, "
            "commas, brackets, slashes or control characters"
        )
    return ident


def _check_string(text: str, attribute: str) -> str:
    """A string value: valid Unicode (no lone surrogates), no NUL, at most
    ``MAX_STRING_BYTES`` bytes of UTF-8."""
    if len(text) > MAX_STRING_BYTES // 4:
        try:
            size = len(text.encode())
        except UnicodeEncodeError:
            size = 0  # reported below
        if size > MAX_STRING_BYTES:
            raise InvalidMessage(
                f"string of {attribute!r} is {size:,} bytes long; the limit is "
                f"{MAX_STRING_BYTES:,} bytes"
            )
    if "\0" in text:
        raise InvalidMessage(f"string {quote(text)} of {attribute!r} holds a NUL character")
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            raise InvalidMessage(
                f"string {quote(text)} of {attribute!r} is not valid Unicode (a lone surrogate)"
            ) from None
    return text


def check_value(value: object, attribute: str) -> Value:
    """Return ``value`` if it is a valid attribute value, else raise ``InvalidMessage``."""
    t = type(value)
    if t is str:
        return _check_string(value, attribute)  # type: ignore[arg-type]
    if t is bool:
        return value  # type: ignore[return-value]
    if t is int:
        if value not in _INT64:
            raise InvalidMessage(f"integer {quote(value)} of {attribute!r} does not fit in 64 bits")
        return value  # type: ignore[return-value]
    if t is float:
        if not math.isfinite(value):  # type: ignore[arg-type]
            raise InvalidMessage(f"value {value} of {attribute!r} is not a finite number")
        return value  # type: ignore[return-value]
    raise InvalidMessage(
        f"value of {attribute!r} must be a string, integer, float or boolean, not {t.__name__}"
    )


_FLOAT_MAX: Final = sys.float_info.max
_SHORT: Final = MAX_STRING_BYTES // 4


def _check_attributes(attrs: Mapping[str, object]) -> None:
    """Check every name and value of a publication, quickly for the common ones."""
    if len(attrs) > MAX_ATTRIBUTES:
        raise InvalidMessage(
            f"a publication has {len(attrs):,} attributes; the limit is {MAX_ATTRIBUTES:,}"
        )
    if not attrs.keys() <= _VALID_NAME.seen:
        for name in attrs:
            check_name(name)
    for name, value in attrs.items():
        t = type(value)
        if (
            (t is str and value.isascii() and len(value) <= _SHORT and "\0" not in value)  # type: ignore[attr-defined, operator, arg-type]
            or t is bool
            or (t is float and -_FLOAT_MAX <= value <= _FLOAT_MAX)  # type: ignore[operator]
            or (t is int and value in _INT64)
        ):
            continue
        check_value(value, name)  # raises, saying why


class VarType(StrEnum):
    """The type prefix of a variable: ``$X`` (any), ``$S$X``, ``$I$X``, ``$F$X``."""

    ANY = ""
    STRING = "S"
    INTEGER = "I"
    FLOAT = "F"


@dataclass(frozen=True, slots=True)
class Variable:
    """A variable of a composite subscription; it binds to an attribute's value."""

    name: str
    type: VarType = VarType.ANY

    def __post_init__(self) -> None:
        check_name(self.name, "variable name")

    def __str__(self) -> str:
        prefix = f"${self.type.value}" if self.type is not VarType.ANY else ""
        return f"{prefix}${self.name}"

    def accepts(self, value: Value) -> bool:
        """Whether a value of this type may be bound (the operator's type is checked apart)."""
        if self.type is VarType.STRING:
            return type(value) is str
        if self.type is VarType.INTEGER:
            return type(value) is int
        if self.type is VarType.FLOAT:
            return type(value) is float or type(value) is int
        return True


_VARIABLE_OPS: Final = {
    Op.EQ: frozenset({VarType.ANY, VarType.STRING}),
    Op.EQ_NUM: frozenset({VarType.ANY, VarType.INTEGER, VarType.FLOAT}),
}


@dataclass(frozen=True, slots=True)
class Predicate:
    """``[attribute, op, value]``; ``value`` is None for ``isPresent`` and may be a Variable."""

    attribute: str
    op: Op
    value: Value | Variable | None = None

    def __post_init__(self) -> None:
        check_name(self.attribute)
        if not isinstance(self.op, Op):
            raise InvalidMessage(f"unknown operator {self.op!r}")
        kind = operand_kind(self.op)
        value = self.value
        if kind is OperandKind.NONE:
            if value is not None:
                object.__setattr__(self, "value", None)  # PADRES writes a dummy value; drop it
            return
        if value is None:
            raise InvalidMessage(f"operator {self.op} of {self.attribute!r} needs a value")
        if isinstance(value, Variable):
            allowed = _VARIABLE_OPS.get(self.op)
            if allowed is None:
                raise InvalidMessage(
                    f"variable {value} of {self.attribute!r} needs operator eq or =, not {self.op}"
                )
            if value.type not in allowed:
                raise InvalidMessage(
                    f"variable {value} does not fit operator {self.op} of {self.attribute!r}"
                )
            return
        check_value(value, self.attribute)
        if kind is OperandKind.NUMBER:
            ok = type(value) is int or type(value) is float
        elif kind is OperandKind.STRING:
            ok = type(value) is str
        else:
            ok = type(value) is str or type(value) is bool
        if not ok:
            raise InvalidMessage(
                f"operator {self.op} of {self.attribute!r} takes a {kind.value}, "
                f"not {type(value).__name__} {quote(value)}"
            )

    @property
    def variable(self) -> Variable | None:
        return self.value if isinstance(self.value, Variable) else None


TIME: Final = "time"
"""The reserved attribute that names a publication's timestamp in subscriptions."""


@dataclass(frozen=True, slots=True)
class TimeWindow:
    """The publication times a subscription asks for: ``start <= timestamp < end``.

    Written as time predicates (``[time,>=,'2026-11-01T08:00'],[time,<,now]``); a bound left
    out is open. A window reaching into the past makes a historic or hybrid subscription.
    """

    start: datetime | None = None
    end: datetime | None = None

    def __post_init__(self) -> None:
        for bound in (self.start, self.end):
            if bound is not None and bound.tzinfo is None:
                raise InvalidMessage("a time bound must carry a time zone")
        if self.start is not None and self.end is not None and self.start >= self.end:
            raise InvalidMessage(
                f"impossible time range: nothing is at or after {self.start.isoformat()} "
                f"and before {self.end.isoformat()}"
            )

    def __contains__(self, timestamp: datetime) -> bool:
        return (self.start is None or timestamp >= self.start) and (
            self.end is None or timestamp < self.end
        )


class _Immutable:
    """Fields named by ``__match_args__``, set once by ``_set``; equality, hash, repr and
    pickling over them.

    The base of ``Filter``, ``AllOf`` and ``AnyOf``: their JSON form is not an object of their
    fields, so they are plain classes that ``padres.model.codec`` maps by hand, not structs."""

    __slots__ = ("_hash", "_values")
    __match_args__: tuple[str, ...] = ()
    _values: tuple[Any, ...]
    _hash: int

    def _set(self, *values: Any) -> None:
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_hash", hash(values))  # asked for at every cache lookup
        for name, value in zip(self.__match_args__, values, strict=True):
            object.__setattr__(self, name, value)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._values == other._values

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__match_args__)
        return f"{type(self).__name__}({fields})"

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        return type(self), self._values

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"{type(self).__name__} is immutable")


class Filter(_Immutable):
    """A conjunction of predicates, one of them ``[class, eq, '<name>']``, and an optional time
    window over the publications' timestamps (only subscriptions may have one)."""

    __slots__ = ("predicates", "window")
    __match_args__ = ("predicates", "window")
    predicates: tuple[Predicate, ...]
    window: TimeWindow | None

    def __init__(self, predicates: tuple[Predicate, ...], window: TimeWindow | None = None) -> None:
        if not predicates:
            raise InvalidMessage("a filter needs at least one predicate")
        if len(predicates) > MAX_PREDICATES:
            raise InvalidMessage(
                f"a filter has {len(predicates):,} predicates; the limit is {MAX_PREDICATES}"
            )
        if any(p.attribute == TIME for p in predicates):
            raise InvalidMessage(
                "[time,...] is the publication timestamp: compare it with <, <=, > or >= "
                "and a time ('2026-11-01T08:00' or now-1h)"
            )
        classes = [p for p in predicates if p.attribute == "class"]
        if len(classes) != 1 or classes[0].op is not Op.EQ or type(classes[0].value) is not str:
            raise InvalidMessage("a filter needs exactly one class predicate, [class,eq,'<name>']")
        self._set(predicates, window)

    @property
    def class_name(self) -> str:
        for p in self.predicates:
            if p.attribute == "class":
                return p.value  # type: ignore[return-value]
        raise AssertionError("unreachable: checked at construction")

    @property
    def variables(self) -> frozenset[Variable]:
        return frozenset(p.value for p in self.predicates if isinstance(p.value, Variable))


def _constant_filter(flt: Filter, what: str) -> Filter:
    if flt.window is not None and what == "an advertisement":
        raise InvalidMessage("time predicates belong in subscriptions, not in an advertisement")
    if flt.variables:
        raise InvalidMessage(
            f"variables such as {min(map(str, flt.variables))} belong only in "
            f"composite subscriptions, not in {what}"
        )
    return flt


class Subscription(WireMessage, frozen=True, tag="subscription"):
    id: str
    filter: Filter

    def __post_init__(self) -> None:
        check_id(self.id, "subscription id")
        _constant_filter(self.filter, "a subscription")


class Advertisement(WireMessage, frozen=True, tag="advertisement"):
    id: str
    filter: Filter

    def __post_init__(self) -> None:
        check_id(self.id, "advertisement id")
        _constant_filter(self.filter, "an advertisement")


def _measure(parts: tuple[Expression, ...]) -> tuple[int, int]:
    """The depth and size (filters joined) of a junction of ``parts``, refused past the
    limits."""
    depth = 1 + max(p.depth if isinstance(p, _Junction) else 0 for p in parts)
    if depth > MAX_DEPTH:
        raise InvalidMessage(f"a composite subscription is nested deeper than {MAX_DEPTH} groups")
    size = sum(p.size if isinstance(p, _Junction) else 1 for p in parts)
    if size > MAX_PARTS:
        raise InvalidMessage(
            f"a composite subscription joins {size:,} filters; the limit is {MAX_PARTS}"
        )
    return depth, size


class _Junction(_Immutable):
    __slots__ = ("depth", "parts", "size")
    __match_args__: tuple[str, ...] = ("parts",)
    parts: tuple[Expression, ...]
    depth: int
    """How deep groups nest in it: 1 when its parts are filters."""
    size: int
    """How many filters it joins."""
    _symbol = ""

    def __init__(self, parts: tuple[Expression, ...]) -> None:
        if len(parts) < 2:
            raise InvalidMessage(f"'{self._symbol}' joins at least two parts")
        if any(isinstance(p, Absent) for p in parts):
            raise InvalidMessage(
                f"an absence (!{{...}}) stands in a sequence, after ';', not in '{self._symbol}'"
            )
        depth, size = _measure(parts)
        self._set(parts)
        object.__setattr__(self, "depth", depth)
        object.__setattr__(self, "size", size)


class AllOf(_Junction):
    """``a & b & ...``: every part must match, each by a different publication."""

    __slots__ = ()
    _symbol = "&"


class AnyOf(_Junction):
    """``a || b || ...``: one part must match."""

    __slots__ = ()
    _symbol = "||"


class Absent(_Immutable):
    """``!{...}`` in a sequence: no publication matching the filter (with the match's
    bindings) comes between the parts around it, or, at the end, before the window closes."""

    __slots__ = ("filter",)
    __match_args__ = ("filter",)
    filter: Filter

    def __init__(self, filter: Filter) -> None:
        if not isinstance(filter, Filter):
            raise InvalidMessage("an absence (!{...}) takes one filter, not a group")
        self._set(filter)


class Sequence(_Junction):
    """``a ; b ; ...``: the parts match in this order of timestamps; ``strict`` (``a ;; b``):
    and nothing matching a part of the pattern comes between two of them. Absences
    (``!{...}``) may stand after the first part."""

    __slots__ = ("strict",)
    __match_args__ = ("parts", "strict")
    strict: bool
    _symbol = ";"

    def __init__(self, parts: tuple[Expression, ...], strict: bool = False) -> None:
        if len(parts) < 2:
            raise InvalidMessage("';' joins at least two parts")
        if isinstance(parts[0], Absent):
            raise InvalidMessage("a sequence cannot start with an absence: '{A} ; !{B}'")
        if strict and any(isinstance(p, Absent) for p in parts):
            raise InvalidMessage("an absence follows ';', not ';;'")
        depth, size = _measure(parts)
        self._set(parts, strict)
        object.__setattr__(self, "depth", depth)
        object.__setattr__(self, "size", size)


if TYPE_CHECKING:
    Expression: TypeAlias = Filter | AllOf | AnyOf | Sequence | Absent
else:
    Expression = _Immutable
    """At run time the common base class, so that the codec maps expressions as one type."""


def _leaves(expr: Expression) -> Iterator[Filter]:
    if isinstance(expr, Filter):
        yield expr
    elif isinstance(expr, Absent):
        yield expr.filter
    else:
        for part in expr.parts:
            yield from _leaves(part)


class _Alternative(NamedTuple):
    """One conjunction of the disjunctive normal form: leaf numbers by slot, and the order
    its slots keep (empty outside sequences)."""

    leaves: tuple[int, ...]
    gaps: tuple[Gap, ...] = ()
    absences: tuple[Absence, ...] = ()


def _shift(slots: tuple[int, ...], by: int) -> tuple[int, ...]:
    return tuple(s + by for s in slots)


def _join(a: _Alternative, b: _Alternative) -> _Alternative:
    """Both alternatives at once: ``b``'s slots come after ``a``'s."""
    n = len(a.leaves)
    gaps = tuple(Gap(_shift(g.left, n), _shift(g.right, n), g.strict) for g in b.gaps)
    absences = tuple(
        Absence(x.part, _shift(x.left, n), None if x.right is None else _shift(x.right, n))
        for x in b.absences
    )
    return _Alternative(a.leaves + b.leaves, a.gaps + gaps, a.absences + absences)


def _too_many(count: int) -> None:
    if count > MAX_PATTERNS:
        raise InvalidMessage(
            f"composite subscription expands to more than {MAX_PATTERNS} alternatives"
        )


def _alternatives(expr: Expression, first: int = 0) -> tuple[list[_Alternative], int]:
    """Disjunctive normal form over leaf numbers; also returns the next free leaf number."""
    if isinstance(expr, Filter):
        return [_Alternative((first,))], first + 1
    if isinstance(expr, Absent):
        raise InvalidMessage("an absence (!{...}) stands in a sequence, after ';'")
    if isinstance(expr, AnyOf):
        out: list[_Alternative] = []
        for part in expr.parts:
            sub, first = _alternatives(part, first)
            out += sub
            _too_many(len(out))
        return out, first
    if isinstance(expr, AllOf):
        out = [_Alternative(())]
        for part in expr.parts:
            sub, first = _alternatives(part, first)
            out = [_join(c, p) for c in out for p in sub]
            _too_many(len(out))
        return out, first
    return _sequence(expr, first)


def _sequence(expr: Sequence, first: int) -> tuple[list[_Alternative], int]:
    """A sequence's alternatives: each with, besides its parts' own order, a gap between
    consecutive positive parts and an absence for each ``!{...}``."""
    # Per alternative: the slot ranges of the positive parts so far, and the absences waiting
    # for the next positive part (leaf, index of the positive part before it).
    combos: list[tuple[_Alternative, list[tuple[int, ...]], list[tuple[int, int]]]] = [
        (_Alternative(()), [], [])
    ]
    for part in expr.parts:
        if isinstance(part, Absent):
            combos = [
                (alt, ranges, [*waiting, (first, len(ranges) - 1)])
                for alt, ranges, waiting in combos
            ]
            first += 1
            continue
        sub, first = _alternatives(part, first)
        joined: list[tuple[_Alternative, list[tuple[int, ...]], list[tuple[int, int]]]] = []
        for alt, ranges, waiting in combos:
            for p in sub:
                n = len(alt.leaves)
                new = _join(alt, p)
                slots = tuple(range(n, n + len(p.leaves)))
                gaps = new.gaps
                absences = new.absences
                if ranges:
                    gaps += (Gap(ranges[-1], slots, expr.strict),)
                absences += tuple(Absence(leaf, ranges[k], slots) for leaf, k in waiting)
                joined.append((_Alternative(new.leaves, gaps, absences), [*ranges, slots], []))
        combos = joined
        _too_many(len(combos))
    out = []
    for alt, ranges, waiting in combos:
        ends = tuple(Absence(leaf, ranges[k]) for leaf, k in waiting)
        out.append(_Alternative(alt.leaves, alt.gaps, alt.absences + ends))
    return out, first


def _has_sequence(expr: Expression) -> bool:
    if isinstance(expr, Sequence):
        return True
    return isinstance(expr, _Junction) and any(_has_sequence(p) for p in expr.parts)


MAX_WITHIN: Final = 7 * 24 * 3600.0
"""The longest time window of a composite subscription, in seconds (a week)."""
MAX_WITHIN_EVENTS: Final = 1_000_000
"""The largest count window of a composite subscription, in publications."""
MAX_LATE: Final = 3600.0
"""The longest lateness of a composite subscription, in seconds (an hour)."""


class Temporal(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True, gc=False
):
    """The clauses after a composite's expression: ``within 10s`` (``seconds``) or ``within
    100 events`` (``events``), ``late 2s`` and ``consume first`` / ``consume last``. A
    composite with any of them, or with a sequence, is matched in timestamp order
    (docs/language.md, "Sequences and windows")."""

    seconds: float | None = None
    events: int | None = None
    late: float = 0.0
    consume: Literal["first", "last"] | None = None

    def __post_init__(self) -> None:
        s = self.seconds
        if s is not None and (type(s) not in (int, float) or not 0 < s <= MAX_WITHIN):
            raise InvalidMessage(
                f"a window of {quote(s)} seconds: more than 0, at most {MAX_WITHIN:,.0f} (a week)"
            )
        e = self.events
        if e is not None and (type(e) is not int or not 1 <= e <= MAX_WITHIN_EVENTS):
            raise InvalidMessage(
                f"a window of {quote(e)} events: at least 1, at most {MAX_WITHIN_EVENTS:,}"
            )
        late = self.late
        if type(late) not in (int, float) or not 0 <= late <= MAX_LATE:
            raise InvalidMessage(
                f"lateness of {quote(late)} seconds: at least 0, at most {MAX_LATE:,.0f} (an hour)"
            )


class CompositeSubscription(
    WireMessage, frozen=True, dict=True, gc=True, tag="composite_subscription"
):
    """Atomic filters combined with ``&``, ``||`` and ``;``; variables bind equal values across
    parts.

    ``filters`` lists the atomic parts in the order written (absent ones, ``!{...}``,
    included); ``patterns`` is the expression in disjunctive normal form, each pattern a tuple of
    indices into ``filters``, and ``orders`` the time order each pattern's slots keep. A match
    is a set of distinct publications, one per filter of one pattern, whose variable bindings
    agree. ``temporal`` holds the clauses written after the expression (``within 10s``, ...).
    """

    id: str
    expression: Expression
    temporal: Temporal | UnsetType = UNSET

    def __post_init__(self) -> None:
        check_id(self.id, "subscription id")
        seen: dict[str, tuple[VarType, bool]] = {}
        for leaf in self.filters:
            for p in leaf.predicates:
                var = p.variable
                if var is None:
                    continue
                kind = (var.type, p.op in NUMERIC)
                if seen.setdefault(var.name, kind) != kind:
                    raise InvalidMessage(
                        f"variable ${var.name} is used with different types or operators"
                    )
        alternatives = self._alternatives  # refuses an expression with too many alternatives
        timing = self.timing
        if any(x.right is None for alt in alternatives for x in alt.absences) and (
            timing is None or (timing.seconds is None and timing.events is None)
        ):
            raise InvalidMessage(
                "an absence at the end of a sequence needs a window to close: "
                "'{A} ; !{B} within 10s' (or 'within 5 events')"
            )

    @cached_property
    def filters(self) -> tuple[Filter, ...]:
        return tuple(_leaves(self.expression))

    @cached_property
    def _alternatives(self) -> list[_Alternative]:
        return _alternatives(self.expression)[0]

    @cached_property
    def patterns(self) -> tuple[tuple[int, ...], ...]:
        return tuple(alt.leaves for alt in self._alternatives)

    @cached_property
    def orders(self) -> tuple[Order, ...]:
        """Per pattern, the order of its slots in time (empty without sequences)."""
        return tuple(Order(alt.gaps, alt.absences) for alt in self._alternatives)

    @cached_property
    def timing(self) -> Temporal | None:
        """The clauses of a composite matched in timestamp order (defaults for a sequence
        written without any); None for one matched in arrival order."""
        if isinstance(self.temporal, Temporal):
            return self.temporal
        return Temporal() if _has_sequence(self.expression) else None


class Attributes(dict[str, Value]):
    """A publication's attributes: a dict that refuses changes."""

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("a publication's attributes cannot be changed")

    def __reduce__(self) -> tuple[type, tuple[dict[str, Value]]]:
        return Attributes, (dict(self),)

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _refuse
    __ior__ = _refuse


_CHECKED: Final[ContextVar[bool]] = ContextVar("checked", default=False)


@contextmanager
def checked_before(checked: bool = True) -> Iterator[None]:
    """Publications built here come from a broker, which checked each one at its edge (if
    ``checked``): their fields' types are still checked (the codec does), the rules of the
    language are not again.

    For what a client reads from its broker, a broker from a neighbour it dialled, from its
    own journal, and from a replay node's answers (publications the node stored from a broker
    that checked them: ``padres.runtime.node``); never for what else a client sends to a
    broker. The rules cost about three quarters of decoding a publication."""
    token = _CHECKED.set(checked)
    try:
        yield
    finally:
        _CHECKED.reset(token)


MAX_COUNT: Final = 2**53
"""The largest count, sequence number or position a message may carry: arithmetic on it stays
exact in every broker (a journal's 64-bit integers, a JSON reader's doubles)."""


class Origin(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Who made a guaranteed publication, whichever broker it goes through: its producer (a
    publisher's run) and its number in that run (1, 2, ...). Durable subscriptions take each
    once, so that a publisher may send again through any broker what one did not
    acknowledge. Written ``[producer, seq]``."""

    producer: str
    seq: Annotated[int, msgspec.Meta(ge=1, le=MAX_COUNT)]


class Publication(WireMessage, frozen=True, tag="publication"):
    """An attribute/value set with a mandatory string ``class``, and a header."""

    id: str
    attributes: Mapping[str, Value]
    timestamp: Annotated[datetime, msgspec.Meta(tz=True)]
    publisher: str = ""
    """Set by the broker it was published at: ``<client>@<broker>``."""
    origin: Origin | UnsetType = UNSET
    """Of a guaranteed publication, when its publisher numbers them (the client does)."""

    def __post_init__(self) -> None:
        if _CHECKED.get():
            force_setattr(self, "attributes", Attributes(self.attributes))
            return
        check_id(self.id, "publication id")
        if self.publisher:
            check_id(self.publisher, "publisher id")
        if isinstance(self.origin, Origin):
            check_id(self.origin.producer, "producer id")
        if self.timestamp.tzinfo is None:
            raise InvalidMessage("publication timestamp must carry a time zone")
        if self.timestamp.year in (1, 9999):  # only there can the shift to UTC overflow
            try:
                self.timestamp.astimezone(UTC)
            except OverflowError:
                raise InvalidMessage(
                    f"publication timestamp {self.timestamp.isoformat()} is out of range: "
                    "in UTC it falls outside the years 1 to 9999"
                ) from None
        attrs = Attributes(self.attributes)
        if TIME in attrs:
            raise InvalidMessage(
                "'time' is the publication's timestamp, not an attribute: set the timestamp"
            )
        _check_attributes(attrs)
        if type(attrs.get("class")) is not str:
            raise InvalidMessage("a publication needs a string class: [class,'<name>']")
        force_setattr(self, "attributes", attrs)

    def __hash__(self) -> int:
        return hash(self.id)

    @property
    def class_name(self) -> str:
        return self.attributes["class"]  # type: ignore[return-value]


class Unsubscribe(WireMessage, frozen=True, tag="unsubscribe"):
    subscription_id: str

    def __post_init__(self) -> None:
        check_id(self.subscription_id, "subscription id")


class Unadvertise(WireMessage, frozen=True, tag="unadvertise"):
    advertisement_id: str

    def __post_init__(self) -> None:
        check_id(self.advertisement_id, "advertisement id")


Message: TypeAlias = (
    Publication | Subscription | Advertisement | CompositeSubscription | Unsubscribe | Unadvertise
)
