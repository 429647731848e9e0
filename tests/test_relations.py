"""Overlap and covering against a brute-force oracle over a finite universe of values."""

from __future__ import annotations

import itertools
import math
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from padres.language.parser import parse_filter
from padres.matching.relations import covers, overlaps
from padres.model.messages import Filter, Predicate
from rete.operators import NUMERIC, STRING, Op, Value, evaluate
from tests.strategies import scaled

NUMBERS: list[Value] = [-1, 0, 1, 2, 0.5, 1.5]
STRINGS: list[Value] = ["", "a", "b", "ab", "ba", "aa", "bb", "aba"]
_POINTS = sorted({float(x) for x in NUMBERS})
UNIVERSE: list[Value] = (
    # every operand, every midpoint between neighbours, and a value beyond each end
    [*_POINTS, *((x + y) / 2 for x, y in itertools.pairwise(_POINTS))]
    + [_POINTS[0] - 1, _POINTS[-1] + 1]
    + ["".join(t) for n in range(4) for t in itertools.product("ab", repeat=n)]
    + [True, False, "A"]  # "A": the class of every filter here
)


def operands(op: Op) -> list[Value | None]:
    if op in NUMERIC:
        return list(NUMBERS)
    if op in STRING:
        return list(STRINGS)
    if op is Op.IS_PRESENT:
        return [None]
    return [*STRINGS, True, False]


def allowed(preds: list[Predicate]) -> set[int]:
    """Indices of universe values passing every predicate (the attribute present)."""
    return {
        i
        for i, v in enumerate(UNIVERSE)
        if all(evaluate(p.op, p.value, v) for p in preds)  # type: ignore[arg-type]
    }


def by_attribute(f: Filter) -> dict[str, list[Predicate]]:
    out: dict[str, list[Predicate]] = {}
    for p in f.predicates:
        out.setdefault(p.attribute, []).append(p)
    return out


def oracle_overlap(a: Filter, b: Filter) -> bool:
    pa, pb = by_attribute(a), by_attribute(b)
    return all(allowed(pa.get(x, []) + pb.get(x, [])) for x in pa.keys() | pb.keys())


def oracle_covers(a: Filter, b: Filter) -> bool:
    pa, pb = by_attribute(a), by_attribute(b)
    if any(x not in pb and allowed(pa[x]) != set(range(len(UNIVERSE))) for x in pa):
        return False  # b allows the attribute to be absent
    if any(x not in pb for x in pa):
        return False
    return all(allowed(pb[x]) <= allowed(pa[x]) for x in pa)


def flt(*preds: Predicate) -> Filter:
    return Filter((Predicate("class", Op.EQ, "A"), *preds))


ALL_SINGLE = [Predicate("x", op, v) for op in Op for v in operands(op)]


def test_every_operator_pair_is_sound() -> None:
    """Each pair of single predicates (every operator with every operand of the pools)."""
    seen_overlap = seen_cover = 0
    for p, q in itertools.product(ALL_SINGLE, repeat=2):
        a, b = flt(p), flt(q)
        if oracle_overlap(a, b):
            seen_overlap += 1
            assert overlaps(a, b), (p, q)
        if covers(a, b):
            seen_cover += 1
            assert oracle_covers(a, b), (p, q)
    assert seen_overlap > 1000 and seen_cover > 300  # the check is not vacuous


def test_numeric_and_boolean_pairs_are_exact() -> None:
    exact = [p for p in ALL_SINGLE if p.op in NUMERIC or type(p.value) is bool]
    for p, q in itertools.product(exact, repeat=2):
        a, b = flt(p), flt(q)
        # The universe holds every operand and points between them, so it decides overlap.
        assert overlaps(a, b) == oracle_overlap(a, b), (p, q)


@st.composite
def filters(draw: st.DrawFn) -> Filter:
    preds = draw(
        st.lists(
            st.builds(
                lambda attr, op_value: Predicate(attr, *op_value),
                st.sampled_from(["x", "y"]),
                st.sampled_from([(p.op, p.value) for p in ALL_SINGLE]),
            ),
            max_size=4,
        )
    )
    return flt(*preds)


@settings(max_examples=scaled(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(filters(), filters())
def test_relations_are_sound_on_random_filters(a: Filter, b: Filter) -> None:
    if oracle_overlap(a, b):
        assert overlaps(a, b)
    if covers(a, b):
        assert oracle_covers(a, b)
    assert covers(a, a)  # reflexive: a filter covers itself


@pytest.mark.parametrize(
    ("a", "b", "overlap", "cover"),
    [
        ("[price,>,10],[price,<,20]", "[price,>=,15]", True, False),
        ("[price,>,10]", "[price,>=,15],[price,<,18]", True, True),
        ("[price,>,10],[price,<,20]", "[price,>=,20]", False, False),
        ("[price,<>,5]", "[price,=,5]", False, False),
        ("[price,<>,5]", "[price,>,5]", True, True),
        ("[sym,str-prefix,'IB']", "[sym,eq,'IBM']", True, True),
        ("[sym,str-prefix,'IB']", "[sym,str-prefix,'IBM']", True, True),
        ("[sym,str-prefix,'IBM']", "[sym,str-prefix,'MS']", False, False),
        ("[sym,str-postfix,'M']", "[sym,eq,'IBM']", True, True),
        ("[sym,str-contains,'B']", "[sym,str-prefix,'IBM']", True, True),
        ("[sym,neq,'IBM']", "[sym,eq,'MSFT']", True, True),
        ("[sym,neq,'IBM']", "[sym,str-prefix,'MS']", True, True),
        ("[sym,str-lt,'C']", "[sym,str-prefix,'IB']", False, False),
        ("[sym,str-gt,'M']", "[sym,str-prefix,'N']", True, True),
        ("[sym,isPresent]", "[sym,eq,'IBM']", True, True),
        ("[sym,eq,'IBM']", "[sym,isPresent]", True, False),
        ("[sym,eq,'IBM']", "[sym,eq,true]", False, False),
        ("[sym,eq,'IBM']", "[price,<,5]", True, False),
    ],
)
def test_expected_relations(a: str, b: str, overlap: bool, cover: bool) -> None:
    fa = parse_filter(f"[class,eq,'A'],{a}")
    fb = parse_filter(f"[class,eq,'A'],{b}")
    assert overlaps(fa, fb) is overlap
    assert covers(fa, fb) is cover


def test_class_decides_everything() -> None:
    assert not overlaps(parse_filter("[class,eq,'A']"), parse_filter("[class,eq,'B']"))
    assert covers(parse_filter("[class,eq,'A']"), parse_filter("[class,eq,'A'],[x,<,1]"))


def test_closed_advertisement_names_every_attribute_a_subscription_may_use() -> None:
    sub = parse_filter("[class,eq,'STOCK'],[volume,>,1000]")
    adv = parse_filter("[class,eq,'STOCK'],[symbol,isPresent],[open,isPresent]")
    assert overlaps(sub, adv)
    assert not overlaps(sub, adv, b_closed=True)


# -- exact numbers at the edges of both types ---------------------------------------------------

_BIG = 2**53
EDGE_OPERANDS: list[int | float] = [
    _BIG - 1,
    _BIG,
    _BIG + 1,
    _BIG + 2,
    float(_BIG),
    float(_BIG + 2),
    -_BIG - 1,
    -float(_BIG),
    2**63 - 1,
    -(2**63),
    float(2**63),
    sys.float_info.max,
    -sys.float_info.max,
    0,
    5e-324,
]


def _neighbours(x: int | float) -> list[int | float]:
    """``x`` and the values just beside it, of both types."""
    out: list[int | float] = [
        x,
        math.nextafter(float(x), math.inf),
        math.nextafter(float(x), -math.inf),
    ]
    if type(x) is int or (float(x).is_integer() and math.isfinite(x)):
        out += [int(x) - 1, int(x), int(x) + 1]
    return out


EDGE_VALUES = sorted({v for x in EDGE_OPERANDS for v in _neighbours(x)}, key=float)
EDGE_SINGLE = [Predicate("n", op, x) for op in NUMERIC for x in EDGE_OPERANDS]


def _numbers_matching(f: Filter) -> list[int | float]:
    tests = [(p.op, p.value) for p in f.predicates[1:]]
    return [v for v in EDGE_VALUES if all(evaluate(op, x, v) for op, x in tests)]  # type: ignore[arg-type]


@st.composite
def edge_filters(draw: st.DrawFn) -> Filter:
    return flt(*draw(st.lists(st.sampled_from(EDGE_SINGLE), min_size=1, max_size=3)))


def test_covering_compares_integers_and_floats_by_exact_value() -> None:
    """A grant of n >= 2**53 + 1 does not cover n = 2**53 written as a float, nor does a
    grant excluding 2**53 + 1 cover the float next to it."""
    grant = parse_filter("[class,eq,'A'],[n,>=,9007199254740993]")
    assert not covers(grant, parse_filter("[class,eq,'A'],[n,=,9007199254740992.0]"))
    assert covers(grant, parse_filter("[class,eq,'A'],[n,=,9007199254740993]"))
    assert not covers(
        parse_filter("[class,eq,'A'],[n,<>,9007199254740992]"),
        parse_filter("[class,eq,'A'],[n,=,9007199254740992.0]"),
    )
    assert not overlaps(
        parse_filter("[class,eq,'A'],[n,=,9007199254740993]"),
        parse_filter("[class,eq,'A'],[n,=,9007199254740992.0]"),
    )


def test_every_edge_pair_is_sound_on_concrete_numbers() -> None:
    """Every pair of single predicates over operands at 2**53 and the limits of both types,
    decided against matching on the values at and beside each operand."""
    covered = 0
    for p, q in itertools.product(EDGE_SINGLE, repeat=2):
        a, b = flt(p), flt(q)
        if covers(a, b):
            covered += 1
            assert set(_numbers_matching(b)) <= set(_numbers_matching(a)), (p, q)
        if set(_numbers_matching(a)) & set(_numbers_matching(b)):
            assert overlaps(a, b), (p, q)
    assert covered > 500  # not vacuous


@settings(max_examples=scaled(600), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edge_filters(), edge_filters())
def test_relations_are_sound_at_the_edges_of_exact_numbers(a: Filter, b: Filter) -> None:
    mine, theirs = _numbers_matching(a), _numbers_matching(b)
    if covers(a, b):
        assert set(theirs) <= set(mine)
    if set(mine) & set(theirs):
        assert overlaps(a, b)
