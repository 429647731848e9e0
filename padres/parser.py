"""Reading PADRES text: publications, subscriptions, advertisements, composite subscriptions.

Grammar (whitespace may stand between any two tokens)::

    publication  := pair ("," pair)*
    pair         := "[" NAME "," literal "]"
    filter       := predicate ("," predicate)*
    predicate    := "[" NAME "," operator ("," operand)? "]" | "[" "time" "," operator "," time "]"
    composite    := all ("||" all)*
    all          := primary ("&" primary)*
    primary      := "{" filter "}" | "(" composite ")"
    literal      := STRING | NUMBER | "true" | "false"
    operand      := literal | VARIABLE            VARIABLE: $X, $S$X, $I$X, $F$X

Strings are single-quoted; inside them ``\\'``, ``\\\\``, ``\\n``, ``\\r`` and ``\\t`` are the only
escapes. A time is a quoted ISO 8601 time or ``now`` with an optional offset (``now-1h``); time
predicates make the filter's window (see ``padres.times``). Any failure raises ``ParseError``
with the column of the offending token.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Final, NamedTuple, TypeVar

from padres.errors import InvalidMessage, ParseError
from padres.messages import (
    TIME,
    Advertisement,
    AllOf,
    AnyOf,
    CompositeSubscription,
    Expression,
    Filter,
    Predicate,
    Publication,
    Subscription,
    TimeWindow,
    Variable,
    VarType,
    check_value,
)
from padres.times import narrow, parse_time
from rete.operators import Op, Value

__all__ = [
    "message_kind",
    "parse_advertisement",
    "parse_composite",
    "parse_filter",
    "parse_message",
    "parse_publication",
    "parse_subscription",
]

_NAME_RE: Final = r"[A-Za-z_][A-Za-z0-9_.\-]*"
_STRING_RE: Final = r"'(?:[^'\\]|\\.)*'"
_NUMBER_RE: Final = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"

_TOKEN: Final = re.compile(
    rf"""
     (?P<ws>\s+)
    |(?P<string>{_STRING_RE})
    |(?P<number>{_NUMBER_RE})
    |(?P<variable>\$(?:[SIF]\$)?{_NAME_RE})
    |(?P<word>{_NAME_RE})
    |(?P<symbol><=|>=|<>|\|\||[<>=\[\],{{}}()&])
    |(?P<bad>.)
    """,
    re.VERBOSE | re.DOTALL,
)
_ESCAPES: Final = {"\\": "\\", "'": "'", "n": "\n", "r": "\r", "t": "\t"}
_OPERATORS: Final = {op.value: op for op in Op}
_OPERATOR_LIST: Final = ", ".join(op.value for op in Op)

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
            return float(raw)
        if len(raw.lstrip("+-").lstrip("0")) > 19:
            raise ParseError(f"integer {raw} does not fit in 64 bits", source=text, column=pos + 1)
        return int(raw)
    if raw == "true":
        return True
    if raw == "false":
        return False
    raise ParseError(
        f"expected a value but found {raw!r} (string values are quoted: '{raw}')",
        source=text,
        column=pos + 1,
    )


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
            raise self.error(f"expected ',' and a value after operator {op}")
        self.expect("]", f"to close [{attribute},{op},...]")
        return self.build(start, lambda: Predicate(attribute, op, value))

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
        return self.build(start, lambda: Filter(tuple(preds), window))

    # -- composites ----------------------------------------------------------------------------

    def composite(self) -> Expression:
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
        if tok.text == "{":
            flt = self.filter()
            self.expect("}", "to close the part")
            return flt
        if tok.text == "(":
            expr = self.composite()
            self.expect(")", "to close the group")
            return expr
        raise self.error(
            f"expected '{{' or '(' to open a part of a composite subscription "
            f"but found {self.found(tok)}",
            tok,
        )


def _now() -> datetime:
    return datetime.now(UTC)


def _fast_attributes(text: str) -> dict[str, Value] | None:
    """The attributes of a plain, well-formed publication line, or None to use the full parser."""
    if not _PUBLICATION_LINE.fullmatch(text):
        return None
    pairs = _PAIRS.findall(text)
    attrs: dict[str, Value] = {}
    for name, string, real, integer, boolean in pairs:
        if real:
            attrs[name] = float(real)
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


def _with_filter(text: str, make: Callable[[Filter], _T]) -> _T:
    flt = parse_filter(text)
    try:
        return make(flt)
    except InvalidMessage as exc:
        raise ParseError(str(exc), source=text, column=1) from None


def parse_subscription(text: str, *, id: str) -> Subscription:
    return _with_filter(text, lambda f: Subscription(id, f))


def parse_advertisement(text: str, *, id: str) -> Advertisement:
    return _with_filter(text, lambda f: Advertisement(id, f))


def parse_composite(text: str, *, id: str) -> CompositeSubscription:
    """Parse ``{[class,eq,'A'],[x,eq,$X]} & {[class,eq,'B'],[x,eq,$X]}``."""
    parser = _Parser(text)
    expr = parser.composite()
    parser.finish()
    try:
        return CompositeSubscription(id, expr)
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
    return "s" if second in _OPERATORS or second[:1] in ("<", ">", "=") else "p"


def parse_message(text: str, *, id: str) -> Publication | Subscription | CompositeSubscription:
    """Parse a bare publication, subscription or composite subscription (see ``message_kind``)."""
    kind = message_kind(text)
    if kind == "cs":
        return parse_composite(text, id=id)
    if kind == "p":
        return parse_publication(text, id=id)
    return parse_subscription(text, id=id)
