"""Reading and writing PADRES text: every construct, every error, round trips, fuzzing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from padres.errors import ParseError
from padres.language.parser import (
    _fast_attributes,
    _Parser,
    message_kind,
    parse_advertisement,
    parse_composite,
    parse_filter,
    parse_message,
    parse_publication,
    parse_subscription,
)
from padres.model.codec import encode
from padres.model.messages import AllOf, AnyOf, CompositeSubscription, Filter, Publication, VarType
from padres.model.printer import format_message
from rete.operators import Op
from tests.strategies import NOW, composites, publications, subscriptions


def pub(text: str) -> Publication:
    return parse_publication(text, id="p1", timestamp=NOW)


def test_publication_values_keep_their_types() -> None:
    p = pub("[class,'STOCK'],[symbol,'AAPL'],[open,63.30],[volume,10924200],[up,true],[e,1e3]")
    assert dict(p.attributes) == {
        "class": "STOCK",
        "symbol": "AAPL",
        "open": 63.3,
        "volume": 10924200,
        "up": True,
        "e": 1000.0,
    }
    assert [type(v) for v in p.attributes.values()] == [str, str, float, int, bool, float]
    assert p.class_name == "STOCK"


def test_whitespace_and_escapes() -> None:
    p = pub(" [ class , 'A' ] , [ note , 'it\\'s a \\\\ \\n\\t\\r' ] , [n, -5], [f, +.5] ")
    assert p.attributes["note"] == "it's a \\ \n\t\r"
    assert p.attributes["n"] == -5
    assert p.attributes["f"] == 0.5


def test_subscription_with_every_operator() -> None:
    text = ",".join(
        ["[class,eq,'Order']"]
        + [f"[a{i},{op.value},{v}]" for i, (op, v) in enumerate(_SAMPLE_OPERANDS.items())]
    )
    sub = parse_subscription(text, id="s1")
    assert [p.op for p in sub.filter.predicates[1:]] == list(_SAMPLE_OPERANDS)
    assert sub.filter.class_name == "Order"


_SAMPLE_OPERANDS = {
    Op.LT: "1",
    Op.LE: "1.5",
    Op.EQ_NUM: "2",
    Op.NE_NUM: "-3",
    Op.GT: "4e2",
    Op.GE: "5",
    Op.EQ: "'x'",
    Op.NEQ: "false",
    Op.STR_LT: "'b'",
    Op.STR_LE: "'b'",
    Op.STR_GT: "'b'",
    Op.STR_GE: "'b'",
    Op.STR_CONTAINS: "'oe'",
    Op.STR_PREFIX: "'sh'",
    Op.STR_POSTFIX: "'es'",
}


def test_is_present_with_or_without_dummy_value() -> None:
    with_dummy = parse_filter("[class,eq,'A'],[price,isPresent,100]")
    without = parse_filter("[class,eq,'A'],[price,isPresent]")
    assert with_dummy == without
    assert with_dummy.predicates[1].value is None
    assert format_message(parse_subscription("[class,eq,'A'],[p,isPresent,'x']", id="s")) == (
        "[class,eq,'A'],[p,isPresent]"
    )


def test_several_predicates_on_one_attribute_make_a_range() -> None:
    flt = parse_filter("[class,eq,'A'],[price,>,10],[price,<,20]")
    assert [(p.attribute, p.op) for p in flt.predicates[1:]] == [
        ("price", Op.GT),
        ("price", Op.LT),
    ]


def test_advertisement_reads_like_a_subscription() -> None:
    adv = parse_advertisement("[class,eq,'STOCK'],[open,isPresent,0.0]", id="a1")
    assert adv.filter.class_name == "STOCK"


def test_composite_structure_and_variables() -> None:
    cs = parse_composite(
        "{[class,eq,'Order'],[UserType,eq,$X]} & {[class,eq,'SysInfo'],[UserType,eq,$S$X]}".replace(
            "$S$X", "$X"
        ),
        id="s1",
    )
    assert isinstance(cs.expression, AllOf)
    assert [f.class_name for f in cs.filters] == ["Order", "SysInfo"]
    assert cs.patterns == ((0, 1),)
    typed = parse_composite("{[class,eq,'A'],[n,=,$I$N]} || {[class,eq,'B'],[n,=,$I$N]}", id="s2")
    assert isinstance(typed.expression, AnyOf)
    var = typed.filters[0].predicates[1].variable
    assert var is not None and var.name == "N" and var.type is VarType.INTEGER
    assert typed.patterns == ((0,), (1,))


def test_composite_precedence_grouping_and_normal_form() -> None:
    cs = parse_composite(
        "{[class,eq,'A']} & ({[class,eq,'B']} || {[class,eq,'C']}) || {[class,eq,'D']}", id="s1"
    )
    assert isinstance(cs.expression, AnyOf)
    assert [f.class_name for f in cs.filters] == ["A", "B", "C", "D"]
    assert cs.patterns == ((0, 1), (0, 2), (3,))
    flat = parse_composite("{[class,eq,'A']} & {[class,eq,'B']} & {[class,eq,'C']}", id="s2")
    assert isinstance(flat.expression, AllOf) and len(flat.expression.parts) == 3


def test_message_kind() -> None:
    assert message_kind("[class,'A'],[x,1]") == "p"
    assert message_kind("[class,'A,B']") == "p"
    assert message_kind("[class,eq,'A']") == "s"
    assert message_kind("[class,eq,'A'],[x,isPresent]") == "s"
    assert message_kind(" {[class,eq,'A']} & {[class,eq,'B']}") == "cs"
    assert message_kind("([class,eq,'A'])") == "cs"
    with pytest.raises(ParseError, match="expected a value for 'x'"):
        parse_message("[class,'A'],[x,<,1]", id="m")  # pairs and predicates do not mix


@pytest.mark.parametrize(
    ("text", "column", "reason"),
    [
        ("[class,eq,'STOCK'],[open,<,'x']", 20, "operator < of 'open' takes a number"),
        ("[class,eq,'STOCK'] [a,<,1]", 20, "expected ',' before '['"),
        ("[class,eq,ST#OCK]", 13, "unexpected character '#'"),
        ("[class,eq,'A'],[a,foo,1]", 19, "expected an operator"),
        ("[price,<,5]", 1, "exactly one class predicate"),
        ("[class,eq,'A'],[class,eq,'B']", 1, "exactly one class predicate"),
        ("[class,str-prefix,'A']", 1, "exactly one class predicate"),
        ("[class,eq,'A'],[x,eq,$X]", 1, "belong only in composite subscriptions"),
        ("[class,eq,'abc", 11, "unterminated string"),
        ('[class,eq,"abc"]', 11, "quoted with '"),
        ("[class,eq,'A'],[x,<]", 20, "expected ',' and a value after operator <"),
        ("[class,eq,'A'],[x,<,99999999999999999999]", 21, "does not fit in 64 bits"),
        ("[class,eq,'A'],[x,<,1e400]", 21, "out of the range of a 64-bit float"),
        ("[class,eq,'A'],[x,eq,'a\\q']", 25, "unknown escape"),
        ("[class,eq,'A'],[9x,eq,'a']", 17, "expected an attribute name"),
        ("[class,eq,'A'],[x,eq,'a'", 25, "expected ']'"),
        ("[class,eq,'A'],[x,eq,'a']]", 26, "unexpected ']'"),
        ("[class,eq,'A'],", 16, "expected '['"),
        ("", 1, "expected '['"),
        ("[class,eq,'A'] # x", 16, "unexpected character '#'"),
    ],
)
def test_subscription_errors(text: str, column: int, reason: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_subscription(text, id="s1")
    assert reason in info.value.reason
    assert (info.value.line, info.value.column) == (1, column)
    rendered = str(info.value).splitlines()
    assert rendered[1] == "  " + text
    assert rendered[2] == "  " + " " * (column - 1) + "^"


@pytest.mark.parametrize(
    ("text", "column", "reason"),
    [
        ("[symbol,'AAPL']", 1, "needs a string class"),
        ("[class,5]", 1, "needs a string class"),
        ("[class,'A'],[x,1],[x,2]", 19, "attribute 'x' appears twice"),
        ("[class,'A'],[x,eq,1]", 16, "'eq' is an operator"),
        ("[class,'A'],[x,99999999999999999999]", 16, "does not fit in 64 bits"),
        ("[class,'A'],[x,$X]", 16, "expected a value for 'x'"),
        ("[class,'A'],[x,'a'", 19, "expected ']'"),
    ],
)
def test_publication_errors(text: str, column: int, reason: str) -> None:
    with pytest.raises(ParseError) as info:
        pub(text)
    assert reason in info.value.reason
    assert info.value.column == column


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{[class,eq,'A'],[x,eq,$X]} & {[class,eq,'B'],[x,=,$X]}", "different types or operators"),
        ("{[class,eq,'A'],[x,<,$X]}", "needs operator eq or ="),
        ("{[class,eq,'A'],[x,eq,$I$X]}", "does not fit operator eq"),
        ("{[class,eq,'A'],[x,=,$S$X]}", "does not fit operator ="),
        ("{[class,eq,'A']} & ", "expected '{' or '('"),
        ("{[class,eq,'A']} | {[class,eq,'B']}", "unexpected character '|'"),
        ("({[class,eq,'A']} & {[class,eq,'B']}", "expected ')'"),
        ("{[class,eq,'A']", "expected '}'"),
        ("[class,eq,'A']", "expected '{' or '('"),
    ],
)
def test_composite_errors(text: str, reason: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_composite(text, id="s1")
    assert reason in info.value.reason


def test_composite_with_too_many_alternatives_is_refused() -> None:
    part = "({[class,eq,'A']} || {[class,eq,'B']})"
    with pytest.raises(ParseError, match="more than 256 alternatives"):
        parse_composite(" & ".join([part] * 9), id="s1")


@given(publications())
def test_publication_round_trip(p: Publication) -> None:
    again = parse_publication(
        format_message(p), id=p.id, timestamp=p.timestamp, publisher=p.publisher
    )
    assert encode(again) == encode(p)


@given(subscriptions())
def test_subscription_round_trip(s: object) -> None:
    from padres.model.messages import Subscription

    assert isinstance(s, Subscription)
    again = parse_subscription(format_message(s), id=s.id)
    assert encode(again) == encode(s)


@given(composites)
def test_composite_round_trip(c: CompositeSubscription) -> None:
    again = parse_composite(format_message(c), id=c.id)
    assert encode(again) == encode(c)
    assert again.patterns == c.patterns


_GRAMMAR_ALPHABET = "[]{}(),'$&|<>=-.\\ \n0123456789abceilnpqrstxSIFP"


@given(st.one_of(st.text(), st.text(alphabet=_GRAMMAR_ALPHABET, max_size=60)))
def test_fuzz_any_text_gives_a_message_or_a_parse_error(text: str) -> None:
    for parse in (parse_message, parse_composite, parse_subscription, parse_publication):
        try:
            parse(text, id="x1")
        except ParseError as exc:
            assert exc.column >= 1
            assert str(exc)


@given(
    st.one_of(st.text(alphabet=_GRAMMAR_ALPHABET, max_size=60), publications().map(format_message))
)
def test_fast_path_agrees_with_the_full_parser(text: str) -> None:
    fast = _fast_attributes(text)
    if fast is None:
        return
    parser = _Parser(text)
    full = parser.pairs()
    parser.finish()
    assert [(k, type(v), v) for k, v in fast.items()] == [(k, type(v), v) for k, v in full.items()]


def test_filter_requires_a_predicate() -> None:
    with pytest.raises(ValueError, match="at least one predicate"):
        Filter(())
