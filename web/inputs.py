"""REST inputs into messages: PADRES text or the JSON wire format, checked in full.

Every function here either returns valid messages or raises a ``Problem`` (400) listing every
bad input with where it is, so that a request is accepted whole or not at all.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from padres.errors import InvalidMessage, ParseError
from padres.language.parser import parse_composite, parse_filter, parse_publication
from padres.model.codec import VERSION, from_dict
from padres.model.messages import (
    Advertisement,
    CompositeSubscription,
    Filter,
    Publication,
    Subscription,
)
from padres.model.times import narrow, parse_time
from rete.operators import Op, Value
from web.problems import bad_input, located

__all__ = [
    "FilterInput",
    "PublicationInput",
    "composite_from",
    "filter_from",
    "publications_from_json",
    "publications_from_text",
    "window_filter",
]

PublicationInput = str | Mapping[str, Value]
"""PADRES text (``[class,'STOCK'],[price,5]``) or the attributes as a JSON object."""
FilterInput = str | Sequence[Sequence[Any]]
"""PADRES text (``[class,eq,'STOCK']``) or the wire format's list of predicates."""

_ids = itertools.count(1)
_RUN = secrets.token_hex(3)
"""Ids made here differ from those of an earlier run of the broker."""


def _new_id(prefix: str) -> str:
    return f"{prefix}{_RUN}.{next(_ids)}"


def _publication(item: object, now: datetime) -> Publication:
    if isinstance(item, str):
        return parse_publication(item, id=_new_id("p"), timestamp=now)
    if isinstance(item, Mapping):
        return Publication(_new_id("p"), dict(item), now)
    raise InvalidMessage(
        f"a publication is PADRES text or an object of attributes, not {type(item).__name__}"
    )


def publications_from_json(items: Sequence[object]) -> list[Publication]:
    """Publications given as JSON (each PADRES text or attributes); all valid, or a 400."""
    now = datetime.now(UTC)
    out: list[Publication] = []
    errors: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        try:
            out.append(_publication(item, now))
        except InvalidMessage as exc:
            errors.append(located(exc, f"publications[{i}]"))
    if errors:
        raise bad_input(errors, "publications")
    return out


def publications_from_text(text: str) -> list[Publication]:
    """One publication per non-empty line of PADRES text (``#`` starts a comment line)."""
    now = datetime.now(UTC)
    out: list[Publication] = []
    errors: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            out.append(_publication(line, now))
        except ParseError as exc:
            errors.append(located(exc.at_line(number, source=line), f"line {number}"))
        except InvalidMessage as exc:
            errors.append(located(exc, f"line {number}"))
    if errors:
        raise bad_input(errors, "publications")
    return out


def _filter(value: FilterInput) -> Filter:
    if isinstance(value, str):
        return parse_filter(value)
    message = from_dict({"v": VERSION, "type": "subscription", "id": "f", "filter": value})
    if not isinstance(message, Subscription):  # pragma: no cover - the type asked for
        raise InvalidMessage("not a filter")
    return message.filter


def filter_from(value: FilterInput, where: str = "filter") -> Filter:
    """A filter from PADRES text or wire predicates; a 400 naming what is wrong."""
    try:
        return _filter(value)
    except InvalidMessage as exc:
        raise bad_input([located(exc, where)], where) from None


def composite_from(value: str | Mapping[str, Any], sid: str) -> CompositeSubscription:
    """A composite subscription from PADRES text or a wire expression."""
    try:
        if isinstance(value, str):
            return parse_composite(value, id=sid)
        message = from_dict(
            {"v": VERSION, "type": "composite_subscription", "id": sid, "expression": value}
        )
        if not isinstance(message, CompositeSubscription):  # pragma: no cover
            raise InvalidMessage("not a composite subscription")
        return message
    except InvalidMessage as exc:
        raise bad_input([located(exc, "expression")], "expression") from None


def advertisement_from(value: FilterInput, aid: str) -> Advertisement:
    flt = filter_from(value)
    try:
        return Advertisement(aid, flt)
    except InvalidMessage as exc:
        raise bad_input([located(exc, "filter")], "advertisement") from None


def window_filter(text: str, start: str | None, end: str | None) -> Filter:
    """A historic filter: ``text`` with the window ``start <= time < end`` (``end`` defaults to
    now); times are ISO 8601 or relative (``now-1h``)."""
    flt = filter_from(text)
    window = flt.window
    errors: list[dict[str, Any]] = []
    for where, bound, op in (("from", start, Op.GE), ("to", end or "now", Op.LT)):
        if bound is None:
            continue
        try:
            window = narrow(window, op, parse_time(bound))
        except InvalidMessage as exc:
            errors.append(located(exc, where))
    if errors:
        raise bad_input(errors, "time range")
    return Filter(flt.predicates, window)
