"""Time predicates: the window of a subscription, in text and on the wire."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from padres.errors import DecodeError, ParseError
from padres.language.parser import (
    parse_advertisement,
    parse_composite,
    parse_publication,
    parse_subscription,
)
from padres.model.codec import from_dict, to_dict
from padres.model.messages import TimeWindow
from padres.model.printer import format_filter

T = datetime(2026, 11, 1, 8, 0, tzinfo=UTC)
US = timedelta(microseconds=1)


@pytest.mark.parametrize(
    ("predicates", "window"),
    [
        ("[time,>=,'2026-11-01T08:00']", TimeWindow(T)),
        ("[time,>,'2026-11-01T08:00']", TimeWindow(T + US)),
        ("[time,<,'2026-11-01T08:00']", TimeWindow(None, T)),
        ("[time,<=,'2026-11-01T08:00']", TimeWindow(None, T + US)),
        (
            "[time,>=,'2026-11-01T09:00+01:00'],[time,<,'2026-11-01T12:00Z']",
            TimeWindow(T, T + 4 * timedelta(hours=1)),
        ),
        (
            "[time,>,'2026-10-01'],[time,>=,'2026-11-01T08:00'],[time,<,'2026-12-01']",
            TimeWindow(T, datetime(2026, 12, 1, tzinfo=UTC)),
        ),
    ],
)
def test_time_predicates_make_a_window(predicates: str, window: TimeWindow) -> None:
    sub = parse_subscription(f"[class,eq,'Order'],{predicates},[item,eq,'shoes']", id="s")
    assert sub.filter.window == window
    assert [p.attribute for p in sub.filter.predicates] == ["class", "item"]
    again = parse_subscription(format_filter(sub.filter), id="s")
    assert again == sub and from_dict(to_dict(sub)) == sub


def test_relative_times_are_resolved_when_read() -> None:
    before = datetime.now(UTC)
    sub = parse_subscription("[class,eq,'A'],[time,>=,now-1h],[time,<,now+30m]", id="s")
    after = datetime.now(UTC)
    window = sub.filter.window
    assert window is not None and window.start is not None and window.end is not None
    assert before - timedelta(hours=1) <= window.start <= after - timedelta(hours=1)
    assert window.end - window.start == timedelta(minutes=90)
    quoted = parse_subscription("[class,eq,'A'],[time,>,'now-2d']", id="s").filter.window
    assert quoted is not None and quoted.start is not None
    assert abs(quoted.start - (datetime.now(UTC) - timedelta(days=2))) < timedelta(seconds=5)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[class,eq,'A'],[time,>,'yesterday']", "not a time: 'yesterday'"),
        ("[class,eq,'A'],[time,eq,now]", "the time can be compared with >, >=, <, <=, not eq"),
        ("[class,eq,'A'],[time,>,now],[time,<,now-1h]", "impossible time range"),
        ("[class,eq,'A'],[time,>=,'2026-11-01'],[time,<,'2026-11-01']", "impossible time range"),
        ("[class,eq,'A'],[time,>]", "expected ',' and a time"),
        ("[class,eq,'A'],[time,isPresent]", "expected ',' and a time"),
    ],
)
def test_bad_time_predicates_are_refused_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_subscription(text, id="s")


def test_only_subscriptions_have_windows() -> None:
    with pytest.raises(ParseError, match="time predicates belong in subscriptions"):
        parse_advertisement("[class,eq,'A'],[time,>,now]", id="a")
    composite = parse_composite(
        "{[class,eq,'A'],[k,eq,$X],[time,>=,'2026-11-01T08:00']} & {[class,eq,'B'],[k,eq,$X]}",
        id="c",
    )
    assert [f.window for f in composite.filters] == [TimeWindow(T), None]
    assert from_dict(to_dict(composite)) == composite


def test_a_publication_sets_its_timestamp_with_time() -> None:
    pub = parse_publication("[class,'Order'],[time,'2026-11-01T08:00'],[price,3]", id="p")
    assert pub.timestamp == T and dict(pub.attributes) == {"class": "Order", "price": 3}
    with pytest.raises(ParseError, match="takes a quoted time"):
        parse_publication("[class,'Order'],[time,5]", id="p")


def test_json_time_bounds_are_checked_by_path() -> None:
    obj = {
        "v": 1,
        "type": "subscription",
        "id": "s",
        "filter": [["class", "eq", "A"], ["time", ">", 5]],
    }
    with pytest.raises(DecodeError, match=r"\$\.filter\[1\]\[2\]: a time is a string"):
        from_dict(obj)
    obj["filter"] = [["class", "eq", "A"], ["time", "~", "now"]]
    with pytest.raises(DecodeError, match=r"\$\.filter\[1\]"):
        from_dict(obj)


@pytest.mark.parametrize(
    "value", ["now-99999999999999d", "'0001-01-01'", "'9999-12-31T23:59:59.999999'", "now+1e5w"]
)
def test_times_out_of_range_are_refused(value: str) -> None:
    with pytest.raises(ParseError, match=r"out of range|not a time"):
        parse_subscription(f"[class,eq,'A'],[time,>,{value}]", id="s")
