"""The JSON wire format: round trips and every kind of malformed input."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from padres.errors import DecodeError
from padres.language.parser import parse_advertisement, parse_composite
from padres.model.codec import decode, encode, to_dict
from padres.model.messages import (
    CompositeSubscription,
    Message,
    Publication,
    Subscription,
    Unadvertise,
    Unsubscribe,
)
from padres.model.protocol import Rejected, decode_frame
from tests.strategies import composites, publications, subscriptions


@given(st.one_of(publications(), subscriptions(), composites))
def test_round_trip(message: Publication | Subscription | CompositeSubscription) -> None:
    again = decode(encode(message))
    assert again == message
    assert encode(again) == encode(message)


@pytest.mark.parametrize(
    "message",
    [
        parse_advertisement("[class,eq,'A'],[x,isPresent]", id="a1"),
        parse_composite("{[class,eq,'A'],[u,eq,$S$X]} || {[class,eq,'B'],[n,=,$F$N]}", id="s2"),
        Unsubscribe("s1"),
        Unadvertise("a1"),
    ],
)
def test_round_trip_other_kinds(message: Message) -> None:
    assert decode(encode(message)) == message


def test_publication_envelope() -> None:
    ts = datetime(2026, 11, 21, 13, 44, 2, tzinfo=UTC)
    pub = Publication("p1", {"class": "STOCK", "open": 63.3, "n": 2, "ok": True}, ts, "c1")
    assert orjson.loads(encode(pub)) == {
        "v": 1,
        "type": "publication",
        "id": "p1",
        "publisher": "c1",
        "timestamp": "2026-11-21T13:44:02Z",
        "attributes": {"class": "STOCK", "open": 63.3, "n": 2, "ok": True},
    }


def _sub() -> dict[str, object]:
    return {"v": 1, "type": "subscription", "id": "s1", "filter": [["class", "eq", "A"]]}


@pytest.mark.parametrize(
    ("change", "path", "reason"),
    [
        ({"v": 2}, "$.v", "unsupported version 2"),
        ({"v": "1"}, "$.v", "unsupported version"),
        ({"type": "gossip"}, "$.type", "unknown message type 'gossip'"),
        ({"extra": 1}, "$", "unknown field 'extra'"),
        ({"id": 5}, "$.id", "must be str"),
        ({"filter": "x"}, "$.filter", "a filter is a list"),
        ({"filter": [["class", "eq"]]}, "$.filter[0]", "needs a value"),
        ({"filter": [["x", "eq", "A"]]}, "$.filter", "exactly one class predicate"),
        ({"filter": [["class", "eq", "A"], ["x", "~", 1]]}, "$.filter[1][1]", "unknown operator"),
        ({"filter": [["class", "eq", "A"], ["x", "<", "1"]]}, "$.filter[1]", "takes a number"),
        ({"filter": [["class", "eq", "A"], ["x"]]}, "$.filter[1]", "a predicate is"),
        (
            {"filter": [["class", "eq", "A"], [["x"], "<", 1]]},
            "$.filter[1]",
            "invalid attribute name",
        ),
        ({"filter": [["class", "eq", "A"], ["x", "<", [1]]]}, "$.filter[1]", "must be a string"),
        ({"filter": [["class", "eq", "A"], ["x", "eq", {"var": "X"}]]}, "$", "only in composite"),
    ],
)
def test_decode_errors_name_the_field(change: dict[str, object], path: str, reason: str) -> None:
    obj = _sub() | change
    with pytest.raises(DecodeError) as info:
        decode(orjson.dumps(obj))
    assert info.value.path == path
    assert reason in info.value.reason


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "a message is a JSON object, not array"),
        (
            b'{"v": 1, "type": "publication", "id": "p1", "attributes": {"class": "A"}}',
            "missing field 'timestamp'",
        ),
        (
            b'{"v":1,"type":"publication","id":"p1","timestamp":"2026-01-01T00:00:00","attributes":{"class":"A"}}',
            "needs a time zone",
        ),
        (
            b'{"v":1,"type":"publication","id":"p1","timestamp":"yesterday","attributes":{"class":"A"}}',
            "not an ISO 8601 timestamp",
        ),
        (
            b'{"v":1,"type":"publication","id":"p1","timestamp":"2026-01-01T00:00:00Z","attributes":{"x":1}}',
            "needs a string class",
        ),
        (
            b'{"v":1,"type":"publication","id":"p1","timestamp":"2026-01-01T00:00:00Z",'
            b'"attributes":{"class":"A","x":null}}',
            "must be bool | int | float | str, not null",
        ),
        (
            b'{"v":1,"type":"composite_subscription","id":"s1","expression":{"all":[]}}',
            "at least two",
        ),
        (b'{"v":1,"type":"composite_subscription","id":"s1","expression":{"some":[]}}', "expected"),
        (b'{"v":1,"type":"unsubscribe","subscription_id":"has space"}', "invalid subscription id"),
    ],
)
def test_decode_rejects_malformed_input(data: bytes, reason: str) -> None:
    with pytest.raises(DecodeError, match=None) as info:
        decode(data)
    assert reason in str(info.value)


def test_oversized_message_is_refused_before_parsing() -> None:
    big = encode(Publication("p1", {"class": "A", "blob": "x" * 2000}, datetime.now(UTC)))
    with pytest.raises(DecodeError, match="exceeds the limit of 1000 bytes"):
        decode(big, max_bytes=1000)


def test_deep_nesting_is_refused() -> None:
    leaf: dict[str, object] = {"filter": [["class", "eq", "A"]]}
    expr: dict[str, object] = leaf
    for _ in range(40):
        expr = {"all": [expr, leaf]}
    data = orjson.dumps({"v": 1, "type": "composite_subscription", "id": "s1", "expression": expr})
    with pytest.raises(DecodeError, match="nested deeper than 32"):
        decode(data)


@given(
    st.one_of(
        st.binary(max_size=200),
        st.recursive(
            st.one_of(
                st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=5)
            ),
            lambda inner: st.one_of(
                st.lists(inner, max_size=4),
                st.dictionaries(st.text(max_size=12), inner, max_size=5),
            ),
            max_leaves=15,
        ).map(orjson.dumps),
    )
)
def test_fuzz_decode_gives_a_message_or_a_decode_error(data: bytes) -> None:
    try:
        decode(data)
    except DecodeError as exc:
        assert str(exc)


@given(publications())
def test_fuzz_mutated_fields(pub: Publication) -> None:
    base = to_dict(pub)
    for key in base:
        junks: tuple[object, ...] = (None, 1, "x", [], {}, 1.5, True)
        for junk in junks:
            with contextlib.suppress(DecodeError):
                decode(orjson.dumps(base | {key: junk}))


def test_checked_input_skips_the_language_rules_but_not_the_types() -> None:
    def publication(attributes: dict[str, object], ident: str = "p1") -> dict[str, object]:
        return {
            "type": "publication",
            "id": ident,
            "attributes": attributes,
            "timestamp": "2026-11-21T13:44:02Z",
        }

    breaks_a_rule = orjson.dumps([publication({"class": "T", "1bad": 1}, "p 1")])
    [refused] = decode_frame(breaks_a_rule)
    assert isinstance(refused, Rejected) and "invalid publication id" in str(refused.error)
    [taken] = decode_frame(breaks_a_rule, checked=True)
    assert isinstance(taken, Publication) and taken.attributes["1bad"] == 1
    with pytest.raises(TypeError, match="cannot be changed"):
        taken.attributes["class"] = "U"  # type: ignore[index]
    with pytest.raises(DecodeError, match="must be"):
        decode(orjson.dumps(publication({"class": "T", "x": [1]})), checked=True)
    with pytest.raises(DecodeError):  # not JSON: the rules are back on afterwards all the same
        decode_frame(b"[{", checked=True)
    [again] = decode_frame(breaks_a_rule)
    assert isinstance(again, Rejected)
    # A broker writes its numbers itself: the scan for ones too small for a float is skipped.
    tiny = orjson.dumps([publication({"class": "T", "x": 1.5})]).replace(b"1.5", b"1e-400")
    with pytest.raises(DecodeError, match="too small"):
        decode_frame(tiny)
    [zero] = decode_frame(tiny, checked=True)
    assert isinstance(zero, Publication) and zero.attributes["x"] == 0.0


@pytest.mark.parametrize(
    "number",
    [
        "1e-400",
        "1E-400",
        "-2.5e-999",
        "0." + "0" * 330 + "1",
        "0." + "0" * 224 + "1e-99",
        "1e-00400",
        "123e-330",
    ],
)
def test_a_number_too_small_for_a_float_is_refused_however_written(number: str) -> None:
    assert float(number) == 0.0
    frame = '[{"type":"publication","id":"p","attributes":{"class":"T","x":' + number + "},"
    frame += '"timestamp":"2026-01-01T00:00:00Z","v":1}]'
    for data in (frame, frame.encode()):
        with pytest.raises(DecodeError, match="too small"):
            decode_frame(data)
        with pytest.raises(DecodeError, match="too small"):
            decode(data[1:-1])


@pytest.mark.parametrize(
    "number", ["1e-300", "5e-324", "-123", "-1234.5", "1e-3", "0.0", "-0e-999", "2E-307"]
)
def test_a_number_a_float_holds_is_taken_as_it_reads(number: str) -> None:
    frame = '{"type":"publication","id":"p","attributes":{"class":"T","x":' + number + "},"
    frame += '"timestamp":"2026-01-01T00:00:00Z","v":1}'
    pub = decode(frame)
    assert isinstance(pub, Publication) and pub.attributes["x"] == float(number)
