"""Reading PADRES text: publications, subscriptions, advertisements, composite subscriptions.

Grammar (whitespace may stand between any two tokens)::

    publication  := pair ("," pair)*
    pair         := "[" NAME "," literal "]"
    filter       := predicate ("," predicate)*
    predicate    := "[" NAME "," operator ("," operand)? "]" | "[" "time" "," operator "," time "]"
    composite    := sequence clause*
    sequence     := any ((";" | ";;") step)*      (";" then, ";;" strictly next)
    step         := "!" "{" filter "}" | any      (an absence, after the first step)
    any          := all ("||" all)*
    all          := primary ("&" primary)*
    primary      := "{" filter "}" | "(" sequence ")" | "{" sequence "}"   (PADRES' grouping)
    clause       := "within" (DURATION | INTEGER "events") | "late" DURATION
                  | "consume" ("first" | "last")
    DURATION     := NUMBER ("ms" | "s" | "m" | "h" | "d")
    literal      := STRING | NUMBER | "true" | "false" | WORD
    operand      := literal | VARIABLE            VARIABLE: $X, $S$X, $I$X, $F$X

Strings are single-quoted; inside them ``\\'``, ``\\\\``, ``\\n``, ``\\r`` and ``\\t`` are the only
escapes. As in PADRES, a string may also be written bare, as a WORD: a letter, ``_``, ``:`` or
``/``, then letters, digits, ``_``, ``.``, ``-``, ``:`` or ``/`` (``[symbol,eq,IBM]``); ``true``
and ``false`` are booleans, and what reads as a number is a number. A time is a quoted ISO 8601
time or ``now`` with an optional offset (``now-1h``); time predicates make the filter's window
(see ``padres.model.times``). PADRES' historic queries are read too (see ``_padres_query``). Any
failure raises ``ParseError`` with the column of the offending token.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Final, NamedTuple, TypeVar

from msgspec import UNSET

from padres.errors import InvalidMessage, ParseError
from padres.model.dates import DATE_FORM, DATETIME_FORM, is_date, is_datetime
from padres.model.messages import (
    MAX_DEPTH,
    MAX_PREDICATES,
    TIME,
    Absent,
    Advertisement,
    AllOf,
    AnyOf,
    CompositeSubscription,
    Expression,
    Filter,
    Predicate,
    Publication,
    Sequence,
    Subscription,
    Temporal,
    TimeWindow,
    Variable,
    VarType,
    check_value,
    quote,
)
from padres.model.times import narrow, parse_time
from rete.operators import Op, Value

__all__ = [
    "java_time",
    "message_kind",
    "parse_advertisement",
    "parse_composite",
    "parse_filter",
    "parse_message",
    "parse_predicates",
    "parse_publication",
    "parse_subscription",
]

_NAME_RE: Final = r"[A-Za-z_][A-Za-z0-9_.\-]*"
_WORD_RE: Final = r"[A-Za-z_:/][A-Za-z0-9_.\-:/]*"
_STRING_RE: Final = r"'(?:[^'\\]|\\.)*'"
_NUMBER_RE: Final = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"

_TOKEN: Final = re.compile(
    rf"""
     (?P<ws>\s+)
    |(?P<string>{_STRING_RE})
    |(?P<number>{_NUMBER_RE})
    |(?P<variable>\$(?:[SIF]\$)?{_NAME_RE})
    |(?P<word>{_WORD_RE})
    |(?P<symbol><=|>=|<>|\|\||;;|[<>=\[\],{{}}()&;!])
    |(?P<bad>.)
    """,
    re.VERBOSE | re.DOTALL,
)
_ESCAPES: Final = {"\\": "\\", "'": "'", "n": "\n", "r": "\r", "t": "\t"}
_OPERATORS: Final = {op.value: op for op in Op}
_DATED: Final = {"before": (Op.LT, Op.STR_LT), "after": (Op.GT, Op.STR_GT)}
"""PADRES' date operators: the operator they stand for on a timestamp (a number), and on a
date or datetime (a string of its form, ``padres.model.dates``)."""
_OPERATOR_LIST: Final = ", ".join([*(op.value for op in Op), *_DATED])

# Fast path for the common case, a well-formed publication line. Anything unusual (escapes in
# strings, long integers, broken rules) goes through the full parser, which is the reference and
# gives the precise error. Groups: name, string body, float, integer, boolean.
_PAIR: Final = (
    rf"\[\s*({_NAME_RE})\s*,\s*(?:'([^'\\]*)'"
    r"|([-+]?(?:\d+\.\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?\d+[eE][-+]?\d+)"
    r"|([-+]?\d{1,18})|(true|false))\s*\]"
)
_PUBLICATION_LINE: Final = re.compile(rf"\s*{_PAIR}(?:\s*,\s*{_PAIR})*\s*")
_PAIRS: Final = re.compile(_PAIR)


class _Token(NamedTuple):
    kind: str
    text: str
    pos: int


def _tokenize(text: str) -> list[_Token]:
    tokens = []
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup
        assert kind is not None
        if kind == "ws":
            continue
        if kind == "bad":
            char = m.group()
            reason = "unterminated string" if char == "'" else f"unexpected character {char!r}"
            if char == '"':
                reason = "strings are quoted with ' not \""
            raise ParseError(reason, source=text, column=m.start() + 1)
        tokens.append(_Token(kind, m.group(), m.start()))
    tokens.append(_Token("end", "", len(text)))
    return tokens


def _unescape(body: str, text: str, pos: int) -> str:
    if "\\" not in body:
        return body
    out = []
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            esc = _ESCAPES.get(body[i + 1])
            if esc is None:
                raise ParseError(
                    f"unknown escape '\\{body[i + 1]}' (use \\', \\\\, \\n, \\r or \\t)",
                    source=text,
                    column=pos + i + 2,
                )
            out.append(esc)
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _literal(kind: str, raw: str, text: str, pos: int) -> Value:
    """Convert a literal token (string, number, true/false) to its value."""
    if kind == "string":
        return _unescape(raw[1:-1], text, pos + 1)
    if kind == "number":
        if any(c in raw for c in ".eE"):
            number = _float(raw)
            if number is None:
                raise ParseError(
                    f"number {quote(raw)} is out of the range of a 64-bit float",
                    source=text,
                    column=pos + 1,
                )
            return number
        if len(raw.lstrip("+-").lstrip("0")) > 19:
            raise ParseError(
                f"integer {quote(raw)} does not fit in 64 bits", source=text, column=pos + 1
            )
        return int(raw)
    if raw == "true":
        return True
    if raw == "false":
        return False
    return raw  # a bare string, as PADRES writes them: [symbol,eq,IBM]


def _float(raw: str) -> float | None:
    """The float ``raw`` writes, or None if it is too large (infinite) or too small: a number
    that is not zero but would read as 0.0."""
    number = float(raw)
    if math.isinf(number):
        return None
    if number == 0.0 and raw.partition("e")[0].partition("E")[0].strip("+-0.") != "":
        return None
    return number


_T = TypeVar("_T")


class _TimeBound(NamedTuple):
    start: _Token
    op: Op
    at: datetime


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0
        self.now = _now()
        """What ``now`` means in this text: one instant for all of its time predicates."""
        self.depth = 0
        """How deep the groups of a composite are nested at the current token."""
        self.query_id: str | None = None
        """The ``_query_id`` of a PADRES historic query read by ``filter`` (the last one)."""

    # -- token helpers -------------------------------------------------------------------------

    def peek(self) -> _Token:
        return self.tokens[self.i]

    def take(self) -> _Token:
        tok = self.tokens[self.i]
        if tok.kind != "end":
            self.i += 1
        return tok

    def error(self, reason: str, tok: _Token | None = None) -> ParseError:
        tok = tok or self.peek()
        return ParseError(reason, source=self.text, column=tok.pos + 1)

    def found(self, tok: _Token) -> str:
        return "the end of the text" if tok.kind == "end" else repr(tok.text)

    def expect(self, symbol: str, context: str) -> _Token:
        tok = self.take()
        if tok.kind != "symbol" or tok.text != symbol:
            raise self.error(f"expected {symbol!r} {context} but found {self.found(tok)}", tok)
        return tok

    def finish(self) -> None:
        tok = self.peek()
        if tok.text in ("[", "{", "("):
            raise self.error(f"expected ',' before {tok.text!r}", tok)
        if tok.kind == "word" and tok.text in ("event", "events"):
            raise self.error("a count of events is a window: 'within 5 events'", tok)
        if tok.kind != "end":
            raise self.error(f"unexpected {tok.text!r} after the end of the message", tok)

    def build(self, tok: _Token, make: Callable[[], _T]) -> _T:
        """Construct a message part, turning a broken language rule into a positioned error."""
        try:
            return make()
        except InvalidMessage as exc:
            if isinstance(exc, ParseError):
                raise
            raise self.error(str(exc), tok) from None

    def name(self, what: str) -> str:
        tok = self.take()
        if tok.kind != "word":
            raise self.error(f"expected {what} but found {self.found(tok)}", tok)
        return tok.text

    def literal(self, attribute: str) -> Value:
        tok = self.take()
        if tok.kind not in ("string", "number", "word"):
            raise self.error(f"expected a value for {attribute!r} but found {self.found(tok)}", tok)
        value = _literal(tok.kind, tok.text, self.text, tok.pos)
        return self.build(tok, lambda: check_value(value, attribute))

    # -- brackets ------------------------------------------------------------------------------

    def pairs(self) -> dict[str, Value]:
        attrs: dict[str, Value] = {}
        while True:
            start = self.expect("[", "to open an attribute")
            attribute = self.name("an attribute name")
            self.expect(",", f"after attribute {attribute!r}")
            if self.peek().kind == "word" and self.peek().text in _OPERATORS:
                raise self.error(
                    f"{self.peek().text!r} is an operator: publications are [attribute,value]"
                )
            value = self.literal(attribute)
            self.expect("]", f"to close [{attribute},...]")
            if attribute in attrs:
                raise self.error(f"attribute {attribute!r} appears twice", start)
            attrs[attribute] = value
            if self.peek().text != ",":
                return attrs
            self.take()

    def predicate(self) -> Predicate | _TimeBound:
        start = self.expect("[", "to open a predicate")
        attribute = self.name("an attribute name")
        self.expect(",", f"after attribute {attribute!r}")
        tok = self.take()
        op = _OPERATORS.get(tok.text) if tok.kind in ("word", "symbol") else None
        dated = _DATED.get(tok.text) if tok.kind == "word" else None
        if dated is not None:
            op = dated[0]
        if op is None:
            raise self.error(
                f"expected an operator ({_OPERATOR_LIST}) but found {self.found(tok)}", tok
            )
        if attribute == TIME:
            return self.time_bound(start, op)
        value: Value | Variable | None = None
        if self.peek().text == ",":
            self.take()
            vtok = self.peek()
            if vtok.kind == "variable":
                self.take()
                value = self.variable(vtok)
            else:
                value = self.literal(attribute)
        elif op is not Op.IS_PRESENT:
            raise self.error(f"expected ',' and a value after operator {tok.text}")
        if dated is not None:
            op = self.dated(tok, dated, value)
        self.expect("]", f"to close [{attribute},{op},...]")
        return self.build(start, lambda: Predicate(attribute, op, value))

    def dated(self, tok: _Token, ops: tuple[Op, Op], value: Value | Variable | None) -> Op:
        """The operator ``before`` or ``after`` (``tok``) stands for with operand ``value``."""
        if type(value) in (int, float):
            return ops[0]
        if is_date(value) or is_datetime(value):
            return ops[1]
        raise self.error(
            f"{tok.text!r} takes a date {DATE_FORM}, a datetime {DATETIME_FORM} or a timestamp "
            f"(a number), not {value if isinstance(value, Variable) else repr(value)}",
            tok,
        )

    def time_bound(self, start: _Token, op: Op) -> _TimeBound:
        """The rest of ``[time, op, <time>]``: a quoted time, or ``now`` with an offset."""
        self.expect(",", f"and a time after [time,{op}")
        first = self.peek()
        while self.peek().text != "]" and self.peek().kind != "end":
            self.take()
        end = self.expect("]", f"to close [time,{op},...]")
        raw = self.text[first.pos : end.pos].strip()
        if first.kind == "string" and raw == first.text:
            raw = _unescape(raw[1:-1], self.text, first.pos)
        at = self.build(first, lambda: parse_time(raw, self.now))
        return _TimeBound(start, op, at)

    def variable(self, tok: _Token) -> Variable:
        body = tok.text[1:]
        vtype = VarType.ANY
        if len(body) > 2 and body[1] == "$":
            vtype = VarType(body[0])
            body = body[2:]
        return self.build(tok, lambda: Variable(body, vtype))

    def filter(self) -> Filter:
        start = self.peek()
        preds: list[Predicate] = []
        window: TimeWindow | None = None
        while True:
            item = self.predicate()
            if isinstance(item, _TimeBound):
                window = self.build(item.start, partial(narrow, window, item.op, item.at))
            else:
                preds.append(item)
            if self.peek().text != ",":
                break
            self.take()
        query = self.build(start, lambda: _padres_query(preds, window, self.now))
        if query.query_id is not None:
            self.query_id = query.query_id
        return self.build(start, lambda: Filter(query.predicates, query.window))

    # -- composites ----------------------------------------------------------------------------

    def composite(self) -> tuple[Expression, Temporal | None]:
        """A whole composite subscription: its expression, then its clauses."""
        expr = self.sequence()
        return expr, self.clauses()

    def sequence(self) -> Expression:
        """``any (; step)*``: ``;`` and ``;;`` chain left to right; where the two alternate, the
        chain so far becomes the first step of the next (``a ; b ;; c`` is ``(a ; b) ;; c``)."""
        start = self.peek()
        expr = self.any_of()
        steps: list[Expression] = [expr]
        strict = False
        while self.peek().text in (";", ";;"):
            op = self.take()
            now_strict = op.text == ";;"
            if len(steps) > 1 and now_strict != strict:
                steps = [self.build(start, partial(Sequence, tuple(steps), strict))]
            strict = now_strict
            steps.append(self.step(op))
        if len(steps) == 1:
            return steps[0]
        return self.build(start, partial(Sequence, tuple(steps), strict))

    def step(self, op: _Token) -> Expression:
        if self.peek().text != "!":
            return self.any_of()
        bang = self.take()
        if op.text == ";;":
            raise self.error("an absence follows ';', not ';;': '{A} ; !{B}'", bang)
        self.expect("{", "after '!': an absence is !{filter}")
        flt = self.filter()
        self.expect("}", "to close the absent part")
        if self.peek().text in ("&", "||"):
            raise self.error(
                f"an absence stands alone between ';': nothing joins it with {self.peek().text!r}"
            )
        return self.build(bang, lambda: Absent(flt))

    def clauses(self) -> Temporal | None:
        """``within 10s``, ``within 5 events``, ``late 2s``, ``consume first``: each once (a
        window may be given both ways)."""
        fields: dict[str, float | int | str] = {}
        first: _Token | None = None
        while self.peek().kind == "word" and self.peek().text in _CLAUSES:
            tok = self.take()
            first = first or tok
            field, value = self.clause(tok)
            if field in fields:
                what = {"seconds": "a time window", "events": "a count window"}.get(field, tok.text)
                raise self.error(f"{what} is given twice", tok)
            fields[field] = value
        if first is None:
            return None
        return self.build(first, lambda: Temporal(**fields))  # type: ignore[arg-type]

    def clause(self, tok: _Token) -> tuple[str, float | int | str]:
        """The field and value of the clause ``tok`` starts."""
        if tok.text == "consume":
            which = self.take()
            if which.text not in ("first", "last"):
                raise self.error(
                    f"expected 'first' or 'last' after 'consume' but found {self.found(which)}",
                    which,
                )
            return "consume", which.text
        number = self.take()
        if number.kind != "number" or number.text[:1] in "+-":
            raise self.error(
                f"expected a duration after {tok.text!r} (10s, 500ms, 2m) "
                f"but found {self.found(number)}",
                number,
            )
        unit = self.take()
        if tok.text == "within" and unit.text in ("events", "event"):
            if not number.text.isdigit():
                raise self.error("a count of events is a whole number", number)
            return "events", int(number.text)
        scale = _UNITS.get(unit.text) if unit.kind == "word" else None
        if scale is None:
            what = "ms, s, m, h or d" + (", or 'events'" if tok.text == "within" else "")
            raise self.error(f"expected a unit ({what}) but found {self.found(unit)}", unit)
        return ("seconds" if tok.text == "within" else "late"), float(number.text) * scale

    def any_of(self) -> Expression:
        start = self.peek()
        parts = [self.all_of()]
        while self.peek().text == "||":
            self.take()
            parts.append(self.all_of())
        return parts[0] if len(parts) == 1 else self.build(start, lambda: AnyOf(tuple(parts)))

    def all_of(self) -> Expression:
        start = self.peek()
        parts = [self.primary()]
        while self.peek().text == "&":
            self.take()
            parts.append(self.primary())
        return parts[0] if len(parts) == 1 else self.build(start, lambda: AllOf(tuple(parts)))

    def primary(self) -> Expression:
        tok = self.take()
        if tok.text in ("{", "(") and self.depth >= MAX_DEPTH:
            raise self.error(
                f"a composite subscription is nested deeper than {MAX_DEPTH} groups", tok
            )
        self.depth += 1
        try:
            return self.group(tok)
        finally:
            self.depth -= 1

    def expect_group_end(self, symbol: str) -> None:
        tok = self.peek()
        if tok.kind == "word" and tok.text in _CLAUSES:
            raise self.error(
                f"{tok.text!r} applies to the whole composite subscription: write it at the end"
            )
        self.expect(symbol, "to close the group")

    def group(self, tok: _Token) -> Expression:
        if tok.text == "{" and self.peek().text in ("{", "("):
            expr = self.sequence()  # PADRES groups with braces: {{[...]}&{[...]}}
            self.expect_group_end("}")
            return expr
        if tok.text == "{":
            flt = self.filter()
            self.expect("}", "to close the part")
            return flt
        if tok.text == "(":
            expr = self.sequence()
            self.expect_group_end(")")
            return expr
        if tok.text == "!":
            raise self.error("an absence !{...} stands in a sequence, after ';'", tok)
        raise self.error(
            f"expected '{{' or '(' to open a part of a composite subscription "
            f"but found {self.found(tok)}",
            tok,
        )


_CLAUSES: Final = ("within", "late", "consume")
_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _now() -> datetime:
    return datetime.now(UTC)


_HISTORIC: Final = "historic"
"""The class of PADRES' historic queries."""
_QUERY_ID: Final = "_query_id"
_QUERY_ATTRIBUTES: Final = ("class", "subclass", _QUERY_ID, "_start_time", "_end_time")
_JAVA_DATE: Final = re.compile(
    r"[A-Za-z]{3} ([A-Za-z]{3}) +(\d{1,2}) (\d{1,2}):(\d{2}):(\d{2}) "
    r"([A-Za-z]+|GMT[+-]\d{2}:?\d{2}) (\d{4})"
)
_MONTHS: Final = {
    m: i
    for i, m in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1
    )
}
_ZONES: Final = {
    **dict.fromkeys(("UTC", "GMT", "UT", "Z", "WET"), 0.0),
    **{"EST": -5.0, "EDT": -4.0, "CST": -6.0, "CDT": -5.0, "MST": -7.0, "MDT": -6.0},
    **{"PST": -8.0, "PDT": -7.0, "AKST": -9.0, "AKDT": -8.0, "HST": -10.0, "AST": -4.0},
    **{"ADT": -3.0, "NST": -3.5, "NDT": -2.5, "BST": 1.0, "WEST": 1.0, "CET": 1.0},
    **{"CEST": 2.0, "EET": 2.0, "EEST": 3.0, "MSK": 3.0, "JST": 9.0, "KST": 9.0},
    **{"AEST": 10.0, "AEDT": 11.0, "NZST": 12.0, "NZDT": 13.0},
}


def java_time(text: str, now: datetime | None = None) -> datetime:
    """A time as Java's ``Date.toString`` writes it, ``'Thu Jul 20 22:23:59 EDT 2010'`` (the
    zone an abbreviation or ``GMT+05:30``), or any time ``parse_time`` reads (``now`` is what
    ``now`` means there)."""
    m = _JAVA_DATE.fullmatch(text.strip())
    if m is None:
        return parse_time(text, now)
    month, day, hour, minute, second, zone, year = m.groups()
    if zone.startswith("GMT") and len(zone) > 3:
        digits = zone[4:].replace(":", "")
        offset = int(digits[:2]) + int(digits[2:]) / 60
        offset = -offset if zone[3] == "-" else offset
    elif zone in _ZONES:
        offset = _ZONES[zone]
    else:
        raise InvalidMessage(f"unknown time zone {zone!r} in {text!r} (use UTC or GMT+hh:mm)")
    if month not in _MONTHS:
        raise InvalidMessage(f"unknown month {month!r} in {text!r}")
    try:
        local = datetime(int(year), _MONTHS[month], int(day), int(hour), int(minute), int(second))
        utc = local - timedelta(hours=offset)
    except (ValueError, OverflowError) as exc:
        raise InvalidMessage(f"not a time: {text!r} ({exc})") from None
    return parse_time(utc.isoformat())


class _Query(NamedTuple):
    predicates: tuple[Predicate, ...]
    window: TimeWindow | None
    query_id: str | None


def _padres_query(predicates: list[Predicate], window: TimeWindow | None, now: datetime) -> _Query:
    """A PADRES historic query in this language's terms; any other filter as it is.

    ``[class,eq,'historic'],[subclass,eq,'stock'],[_query_id,eq,'q1'],...`` with optional
    ``[_start_time,eq,'<time>']`` and ``[_end_time,eq,'<time>']`` (exclusive bounds, in Java's
    date format) asks the databases for stored ``stock`` publications: it becomes
    ``[class,eq,'stock'],...`` with the window ``start < time < end``, the end ``now`` when none
    is given (a historic query asks only for the past).
    """
    named: dict[str, list[Predicate]] = {}
    for p in predicates:
        named.setdefault(p.attribute, []).append(p)
    if _QUERY_ID not in named or [p.value for p in named.get("class", [])] != [_HISTORIC]:
        return _Query(tuple(predicates), window, None)
    values: dict[str, str] = {}
    for attribute in _QUERY_ATTRIBUTES:
        found = named.get(attribute, [])
        if len(found) > 1 or any(p.op is not Op.EQ or type(p.value) is not str for p in found):
            raise InvalidMessage(f"a historic query takes one [{attribute},eq,'<text>']")
        if found:
            values[attribute] = found[0].value  # type: ignore[assignment]
    if "subclass" not in values:
        raise InvalidMessage("a historic query names its class: [subclass,eq,'<class>']")
    if "_start_time" in values:
        window = narrow(window, Op.GT, java_time(values["_start_time"], now))
    end = java_time(values["_end_time"], now) if "_end_time" in values else now
    window = narrow(window, Op.LT, end)
    rest = (p for p in predicates if p.attribute not in _QUERY_ATTRIBUTES)
    return _Query((Predicate("class", Op.EQ, values["subclass"]), *rest), window, values[_QUERY_ID])


def _fast_attributes(text: str) -> dict[str, Value] | None:
    """The attributes of a plain, well-formed publication line, or None to use the full parser."""
    if not _PUBLICATION_LINE.fullmatch(text):
        return None
    pairs = _PAIRS.findall(text)
    attrs: dict[str, Value] = {}
    for name, string, real, integer, boolean in pairs:
        if real:
            number = _float(real)
            if number is None:
                return None  # the full parser says why
            attrs[name] = number
        elif integer:
            attrs[name] = int(integer)
        elif boolean:
            attrs[name] = boolean == "true"
        else:
            attrs[name] = string
    return attrs if len(attrs) == len(pairs) else None


def parse_publication(
    text: str, *, id: str, timestamp: datetime | None = None, publisher: str = ""
) -> Publication:
    """Parse ``[class,'STOCK'],[symbol,'AAPL'],[open,63.30]``; the header comes as arguments."""
    attrs = _fast_attributes(text)
    if attrs is not None and TIME not in attrs:
        try:
            return Publication(id, attrs, timestamp or _now(), publisher)
        except InvalidMessage:
            pass  # the full parser below names the offending token
    parser = _Parser(text)
    attrs = parser.pairs()
    parser.finish()
    try:
        if TIME in attrs:
            # [time,'2026-11-01T08:00'] sets the header's timestamp.
            given = attrs.pop(TIME)
            if type(given) is not str:
                raise InvalidMessage(f"[time,...] takes a quoted time, not {given!r}")
            timestamp = parse_time(given)
        return Publication(id, attrs, timestamp or _now(), publisher)
    except InvalidMessage as exc:
        raise ParseError(str(exc), source=text, column=1) from None


def parse_filter(text: str) -> Filter:
    """Parse a conjunction of predicates, ``[class,eq,'STOCK'],[open,<,70]``."""
    parser = _Parser(text)
    flt = parser.filter()
    parser.finish()
    return flt


def parse_predicates(text: str) -> tuple[Predicate, ...]:
    """Parse a conjunction of predicates that stands without a class, ``[price,>,100],
    [status,eq,'paid']``: a condition over something other than a publication (the rows of a
    table, ``historic.rules``). A time window or a variable has no meaning there: refused."""
    parser = _Parser(text)
    predicates: list[Predicate] = []
    while True:
        start = parser.peek()
        item = parser.predicate()
        if isinstance(item, _TimeBound):
            raise parser.error("a condition has no time window", item.start)
        if item.variable is not None:
            raise parser.error(f"a condition has no variables ({item.variable})", start)
        predicates.append(item)
        if len(predicates) > MAX_PREDICATES:
            raise parser.error(f"a condition has at most {MAX_PREDICATES} predicates", start)
        if parser.peek().text != ",":
            break
        parser.take()
    parser.finish()
    return tuple(predicates)


def _with_filter(text: str, make: Callable[[Filter], _T]) -> _T:
    flt = parse_filter(text)
    try:
        return make(flt)
    except InvalidMessage as exc:
        raise ParseError(str(exc), source=text, column=1) from None


def parse_subscription(text: str, *, id: str) -> Subscription:
    """Parse a subscription; a PADRES historic query takes its ``_query_id`` as its id."""
    parser = _Parser(text)
    flt = parser.filter()
    parser.finish()
    try:
        return Subscription(parser.query_id or id, flt)
    except InvalidMessage as exc:
        raise ParseError(str(exc), source=text, column=1) from None


def parse_advertisement(text: str, *, id: str) -> Advertisement:
    return _with_filter(text, lambda f: Advertisement(id, f))


def parse_composite(text: str, *, id: str) -> CompositeSubscription:
    """Parse ``{[class,eq,'A'],[x,eq,$X]} & {[class,eq,'B'],[x,eq,$X]}``, or a sequence,
    ``{[class,eq,'A']} ; !{[class,eq,'B']} within 10s``."""
    parser = _Parser(text)
    expr, temporal = parser.composite()
    parser.finish()
    try:
        return CompositeSubscription(id, expr, temporal or UNSET)
    except InvalidMessage as exc:
        raise ParseError(str(exc), source=text, column=1) from None


_FIRST_PAIR: Final = re.compile(r"\s*\[[^,\]]*,\s*([^,\]\s]*)")


def message_kind(text: str) -> str:
    """``"cs"``, ``"p"`` or ``"s"``: which kind of message a bare line of text holds.

    ``{`` or ``(`` starts a composite subscription. Otherwise the second item of the first
    bracket decides: an operator makes a predicate (subscription), a value a publication pair.
    An advertisement reads like a subscription; only its command, ``a``, tells them apart.
    """
    stripped = text.lstrip()
    if stripped[:1] in ("{", "("):
        return "cs"
    m = _FIRST_PAIR.match(text)
    if m is None:
        return "s"
    second = m.group(1)
    if second in _DATED:  # an operator only with an operand after it: [due,before,'...']
        return "s" if text[m.end() :].lstrip().startswith(",") else "p"
    return "s" if second in _OPERATORS or second[:1] in ("<", ">", "=") else "p"


def parse_message(text: str, *, id: str) -> Publication | Subscription | CompositeSubscription:
    """Parse a bare publication, subscription or composite subscription (see ``message_kind``)."""
    kind = message_kind(text)
    if kind == "cs":
        return parse_composite(text, id=id)
    if kind == "p":
        return parse_publication(text, id=id)
    return parse_subscription(text, id=id)
