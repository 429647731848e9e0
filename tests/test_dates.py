"""Dates and times as attribute types: ``date``, ``datetime`` and ``timestamp`` values, written as
``padres.model.dates`` says, match as time orders them in every engine (against Python's own
comparison of the dates, and the reference matcher); ``before`` and ``after``; and the schema
checks of the three types."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, date, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from padres.errors import ParseError, SchemaViolation
from padres.language.parser import message_kind, parse_filter, parse_publication
from padres.matching.engines import ENGINES, make_engine
from padres.model.classes import (
    AttributeType,
    Schema,
    check_filter,
    check_publication,
    format_attributes,
    parse_attributes,
)
from padres.model.dates import date_value, is_date, is_datetime, parse_value, timestamp_value
from padres.model.messages import Publication, Subscription
from padres.model.printer import format_filter
from rete.operators import Value
from tests import strategies

NOW = datetime(2026, 11, 1, tzinfo=UTC)

instants = st.datetimes(timezones=st.just(UTC)).map(lambda at: at.replace(microsecond=0))
"""Whole seconds: a datetime value keeps no fraction, and a timestamp of one is exact."""

_COMPARE: dict[str, Callable[[object, object], bool]] = {
    "before": lambda a, b: a < b,  # type: ignore[operator]
    "after": lambda a, b: a > b,  # type: ignore[operator]
    "str-le": lambda a, b: a <= b,  # type: ignore[operator]
    "str-ge": lambda a, b: a >= b,  # type: ignore[operator]
    "eq": lambda a, b: a == b,
    "neq": lambda a, b: a != b,
}


def _publication(n: int, at: datetime) -> Publication:
    attributes: dict[str, Value] = {
        "class": "T",
        "at": date_value(at),
        "on": date_value(at.date()),
        "ts": timestamp_value(at),
    }
    return Publication(f"p{n}", attributes, NOW)


def _truth(attribute: str, word: str, at: datetime, operand: datetime) -> bool:
    """Whether ``at`` is ``word`` ``operand``, by Python's comparison of dates and times."""
    if attribute == "on":
        return _COMPARE[word](at.date(), operand.date())
    return _COMPARE[word](at, operand)


@settings(max_examples=strategies.scaled(150), deadline=None)
@given(
    st.lists(instants, min_size=1, max_size=12),
    instants,
    st.sampled_from(["at", "on", "ts"]),
    st.sampled_from(list(_COMPARE)),
)
def test_dates_and_times_match_as_time_orders_them_in_every_engine(
    stream: list[datetime], operand: datetime, attribute: str, word: str
) -> None:
    if attribute == "ts":  # a number: the numeric operators
        op = {"str-le": "<=", "str-ge": ">=", "eq": "=", "neq": "<>"}.get(word, word)
        text = f"[class,eq,'T'],[ts,{op},{timestamp_value(operand)!r}]"
    else:
        value = date_value(operand.date() if attribute == "on" else operand)
        text = f"[class,eq,'T'],[{attribute},{word},'{value}']"
    flt = parse_filter(text)
    assert parse_filter(format_filter(flt)) == flt  # printed with the operator it stands for
    expected = [_truth(attribute, word, at, operand) for at in stream]
    for name in ENGINES:
        engine = make_engine(name)
        engine.add(Subscription("s1", flt))
        got = [bool(engine.match(_publication(n, at))) for n, at in enumerate(stream)]
        assert got == expected, name


@settings(max_examples=strategies.scaled(100), deadline=None)
@given(instants, st.sampled_from(["0", "4", "7"]))
def test_a_prefix_picks_a_year_or_a_month(at: datetime, width: str) -> None:
    """``str-prefix`` on a date or datetime: the year (4 characters) or the month (7)."""
    prefix = date_value(at)[: int(width)]
    flt = parse_filter(f"[class,eq,'T'],[at,str-prefix,'{prefix}'],[on,str-prefix,'{prefix}']")
    for probe in (at, at.replace(day=1), at.replace(month=1, day=1)):
        same = date_value(probe)[: int(width)] == prefix
        reference, rete = make_engine("naive"), make_engine("rete")
        for engine in (reference, rete):
            engine.add(Subscription("s1", flt))
        pub = _publication(1, probe)
        assert bool(reference.match(pub)) == bool(rete.match(pub)) == same


def test_values_have_one_form_each() -> None:
    assert date_value(date(2026, 12, 1)) == "2026-12-01"
    local = datetime.fromisoformat("2026-12-01T09:30:15.75+01:00")
    assert date_value(local) == "2026-12-01T08:30:15Z"  # in UTC, to the second
    assert date_value(datetime(999, 1, 2, 3, 4, 5)) == "0999-01-02T03:04:05Z"  # naive: UTC
    assert timestamp_value(datetime(1970, 1, 2, tzinfo=UTC)) == 86400
    assert parse_value("2026-12-01") == date(2026, 12, 1)
    assert parse_value("2026-12-01T08:30:15Z") == datetime(2026, 12, 1, 8, 30, 15, tzinfo=UTC)
    for bad in ("2026-12-1", "2026-02-30", "2026-12-01T08:30", "2026-12-01T08:30:15+01:00"):
        assert not is_date(bad) and not is_datetime(bad)
        with pytest.raises(ValueError, match="neither a date"):
            parse_value(bad)
    assert not is_datetime("2026-12-01T08:30:15.5Z") and not is_date(20261201)


def test_before_and_after_need_a_date_a_datetime_or_a_number() -> None:
    for bad in ("[due,before,'2026/12/01']", "[due,after,$X]", "[due,before,true]"):
        with pytest.raises(ParseError, match="takes a date 'YYYY-MM-DD'"):
            parse_filter(bad)
    window = parse_filter(
        "[class,eq,'T'],[time,after,'2026-01-01'],[time,before,'2026-02-01']"
    ).window
    assert window is not None and window.start is not None and window.end is not None
    assert (window.start.month, window.end.month) == (1, 2)
    # a bare line: an operator only with an operand after it
    assert message_kind("[due,before,'2026-12-01']") == "s"
    assert message_kind("[state,before],[class,'T']") == "p"
    assert parse_publication("[class,'T'],[state,after]", id="p1").attributes["state"] == "after"


def test_a_schema_declares_and_checks_dates_and_times() -> None:
    attributes = parse_attributes("due:date at:datetime? ts:timestamp?")
    assert [spec.type for spec in attributes.values()] == [
        AttributeType.DATE,
        AttributeType.DATETIME,
        AttributeType.TIMESTAMP,
    ]
    schema = Schema(class_name="Task", attributes=attributes)
    assert format_attributes(schema) == "at:datetime? due:date ts:timestamp?"

    def publish(text: str) -> None:
        check_publication(schema, parse_publication(text, id="p1", timestamp=NOW), "p1")

    publish("[class,'Task'],[due,'2026-12-01'],[at,'2026-12-01T08:30:00Z'],[ts,1795941000]")
    publish("[class,'Task'],[due,'2026-12-01'],[ts,1795941000.5]")
    refusals = {
        "[class,'Task'],[due,'01/12/2026']": "expected date 'YYYY-MM-DD', found string '01/12",
        "[class,'Task'],[due,'2026-12-01'],[at,'2026-12-01']": "expected datetime 'YYYY-MM-DD",
        "[class,'Task'],[due,20261201]": "expected date 'YYYY-MM-DD', found integer 20261201",
        "[class,'Task'],[due,'2026-12-01'],[ts,'2026-12-01']": "expected timestamp, found string",
    }
    for text, reason in refusals.items():
        with pytest.raises(SchemaViolation, match=re.escape(reason)):
            publish(text)

    def subscribe(text: str) -> None:
        check_filter(schema, parse_filter(f"[class,eq,'Task'],{text}"), "subscription 's1'")

    for fine in (
        "[due,before,'2026-12-01']",
        "[at,after,'2026-12-01T08:30:00Z']",
        "[ts,before,1795941000]",
        "[due,str-prefix,'2026-12']",
        "[due,eq,$S$D]",
        "[at,isPresent]",
    ):
        subscribe(fine)
    for bad, reason in {
        "[due,str-lt,'2026/12/01']": "expected date 'YYYY-MM-DD', found string '2026/12/01'",
        "[at,before,'2026-12-01']": "expected datetime 'YYYY-MM-DDTHH:MM:SSZ' (UTC), found",
        "[due,<,5]": "expected date 'YYYY-MM-DD', found number",
        "[ts,after,'2026-12-01']": "expected timestamp, found string",
    }.items():
        with pytest.raises(SchemaViolation, match=re.escape(reason)):
            subscribe(bad)
