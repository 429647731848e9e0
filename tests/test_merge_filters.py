"""Merging filters (``padres.matching.merging``), against matching publication by publication."""

from __future__ import annotations

import random
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from padres.language.parser import parse_filter
from padres.matching.matcher import matches
from padres.matching.merging import Interval, contains, group, merge, merge_key
from padres.model.messages import Filter, Predicate, Publication
from rete.operators import Op
from tests.strategies import scaled

_T = datetime(2026, 1, 1, tzinfo=UTC)
_NUMBERS = [v / 2 for v in range(-2, 24)] + [0, 5, 10, 20, -1e300, 1e300]
_STRINGS = ["", "a", "ab", "b", "m", "ma", "n", "z", "zz"]


def _f(text: str) -> Filter:
    return parse_filter(f"[class,eq,'T'],{text}")


def _pubs() -> list[Publication]:
    """Publications over a grid of values of x (numbers), s (strings) and y, some without
    an attribute or of another type."""
    out = [Publication("p", {"class": "T"}, _T)]
    for x in [*_NUMBERS, "5", True]:
        for y in (-1, 1, 2, 5.5, 11, None):
            attrs: dict[str, object] = {"class": "T", "x": x}
            if y is not None:
                attrs["y"] = y
            out.append(Publication("p", attrs, _T))  # type: ignore[arg-type]
    for s in _STRINGS:
        out.append(Publication("p", {"class": "T", "s": s, "x": 1, "y": 1}, _T))
    return out


PUBS = _pubs()

_NUM_OPS = [Op.LT, Op.LE, Op.GT, Op.GE, Op.EQ_NUM]
_STR_OPS = [Op.STR_LT, Op.STR_LE, Op.STR_GT, Op.STR_GE, Op.EQ]


@st.composite
def _filters(draw: st.DrawFn) -> Filter:
    """Filters on x (numbers), s (strings) and y, as merging meets them: ranges, points,
    and now and then a predicate that makes no interval."""
    preds = [Predicate("class", Op.EQ, "T")]
    for _ in range(draw(st.integers(1, 2))):
        preds.append(
            Predicate("x", draw(st.sampled_from(_NUM_OPS)), draw(st.sampled_from(_NUMBERS)))
        )
    if draw(st.booleans()):
        preds.append(
            Predicate("s", draw(st.sampled_from(_STR_OPS)), draw(st.sampled_from(_STRINGS)))
        )
    y = draw(st.sampled_from(["none", "eq", "ne", "present"]))
    if y == "eq":
        preds.append(Predicate("y", Op.EQ_NUM, draw(st.sampled_from([1, 2]))))
    elif y == "ne":
        preds.append(Predicate("y", Op.NE_NUM, 1))
    elif y == "present":
        preds.append(Predicate("y", Op.IS_PRESENT))
    return Filter(tuple(preds))


@settings(max_examples=scaled(600), deadline=None)
@given(_filters(), _filters())
def test_a_perfect_merge_matches_exactly_what_either_matches(a: Filter, b: Filter) -> None:
    merged = merge(a, b)
    if merged is None:
        return
    assert merged.useful == 1.0
    for pub in PUBS:
        assert matches(merged.filter, pub) == (matches(a, pub) or matches(b, pub)), pub


@st.composite
def _ranges(draw: st.DrawFn) -> Filter:
    """Filters of number ranges on x and y: what imperfect merging meets."""
    preds = [Predicate("class", Op.EQ, "T")]
    for attribute in ("x", "y"):
        for _ in range(draw(st.integers(1, 2))):
            op = draw(st.sampled_from(_NUM_OPS))
            preds.append(Predicate(attribute, op, draw(st.sampled_from(_NUMBERS))))
    return Filter(tuple(preds))


@settings(max_examples=scaled(600), deadline=None)
@given(_filters() | _ranges(), _filters() | _ranges(), st.sampled_from([0.1, 0.5, 0.9]))
def test_an_imperfect_merge_covers_both_and_contains_is_sound(
    a: Filter, b: Filter, bound: float
) -> None:
    domain = Interval(True, -1, False, 12, False)
    merged = merge(a, b, bound=bound, domain=lambda attribute: domain)
    if merged is not None:
        assert 1.0 - merged.useful <= bound + 1e-9
        for pub in PUBS:
            if matches(a, pub) or matches(b, pub):
                assert matches(merged.filter, pub), pub
    if contains(a, b):
        assert all(matches(a, pub) for pub in PUBS if matches(b, pub))


def test_perfect_merges_of_touching_and_overlapping_ranges() -> None:
    cases = [
        ("[x,>=,0],[x,<,5]", "[x,>=,5],[x,<=,9]", "[x,>=,0],[x,<=,9]"),
        ("[x,<,5]", "[x,>=,2]", "[x,>=,-1.7976931348623157e+308]"),
        ("[x,=,3]", "[x,>,3]", "[x,>=,3]"),
        ("[s,eq,'m']", "[s,str-gt,'m'],[s,str-lt,'z']", "[s,str-ge,'m'],[s,str-lt,'z']"),
        ("[s,str-lt,'m']", "[s,str-ge,'m']", "[s,str-ge,'']"),
        ("[x,>,1],[y,=,2]", "[x,<=,1],[y,=,2]", "[x,>=,-1.7976931348623157e+308],[y,=,2]"),
    ]
    for a, b, want in cases:
        merged = merge(_f(a), _f(b))
        assert merged is not None and merged.filter == _f(want), (a, b)
    not_perfect = [
        ("[x,<,5]", "[x,>,5]"),  # 5 is in neither
        ("[x,<=,4]", "[x,>=,5]"),  # 4.5 is in neither
        ("[x,<,5],[y,=,1]", "[x,>,3],[y,=,2]"),  # they differ on two attributes
        ("[s,eq,'a']", "[s,eq,'b']"),  # no 'in' in the language
        ("[x,<,5],[y,<>,1]", "[x,>,3]"),  # not the same other predicates
    ]
    for a, b in not_perfect:
        assert merge(_f(a), _f(b)) is None, (a, b)
    assert merge_key(parse_filter("[class,eq,'T'],[time,>,'2026-01-01']")) is None


def test_the_false_positive_estimate_and_its_bound() -> None:
    """[0,10] and [12,20] within an advertised [0,100]: the hull [0,20] is useful on 18 of
    its 20 units, an estimated 10% of false positives."""
    a, b = _f("[x,>=,0],[x,<=,10]"), _f("[x,>=,12],[x,<=,20]")
    advertised = Interval(True, 0, False, 100, False)
    merged = merge(a, b, bound=0.1, domain=lambda attribute: advertised)
    assert merged is not None and merged.filter == _f("[x,>=,0],[x,<=,20]")
    assert abs(merged.useful - 0.9) < 1e-9
    assert merge(a, b, bound=0.09, domain=lambda attribute: advertised) is None
    # Two squares of side 4 overlapping on a square of side 2: 28 of the hull's 36.
    c = _f("[x,>,0],[x,<,4],[y,>,0],[y,<,4]")
    d = _f("[x,>,2],[x,<,6],[y,>,2],[y,<,6]")
    merged = merge(c, d, bound=0.5)
    assert merged is not None and abs(merged.useful - 28 / 36) < 1e-9
    # Unbounded where they differ, with no advertised bound: nothing to estimate.
    assert merge(_f("[x,<,5],[y,<,1]"), _f("[x,<,7],[y,<,2]"), bound=0.9) is None
    # The advertisement bounds it: [0,5)x[0,1) and [0,7)x[0,2) in [0,10]x[0,10].
    merged = merge(
        _f("[x,<,5],[y,<,1]"),
        _f("[x,<,7],[y,<,2]"),
        bound=0.9,
        domain=lambda attribute: Interval(True, 0, False, 10, False),
    )
    assert merged is not None and abs(merged.useful - (5 + 14 - 5) / 14) < 1e-9


def test_the_estimate_bounds_the_false_positives_of_evenly_spread_publications() -> None:
    """Merged step by step, as a broker merges a filter at a time: the share of even
    publications in the merged box that none of the members matches stays at most the
    estimate (and is not far below it for two boxes)."""
    rng = random.Random(5)
    advertised = Interval(True, 0, False, 100, False)
    points = [(rng.uniform(0, 100), rng.uniform(0, 100)) for _ in range(20_000)]
    checked = 0
    for _ in range(60):
        members = []
        for _ in range(rng.randint(2, 4)):
            x, y = rng.uniform(20, 60), rng.uniform(20, 60)
            members.append((x, x + rng.uniform(5, 20), y, y + rng.uniform(5, 20)))
        box = list(members[0])
        useful = 1.0
        for other in members[1:]:
            merged = merge(_box(*box), _box(*other), (useful, 1.0), 0.99, lambda a: advertised)
            assert merged is not None
            useful = merged.useful
            box = [
                min(box[0], other[0]),
                max(box[1], other[1]),
                min(box[2], other[2]),
                max(box[3], other[3]),
            ]
            assert merged.filter == _box(*box)
        inside = [(x, y) for x, y in points if box[0] <= x <= box[1] and box[2] <= y <= box[3]]
        wasted = sum(
            1
            for x, y in inside
            if not any(m[0] <= x <= m[1] and m[2] <= y <= m[3] for m in members)
        )
        assert wasted / len(inside) <= (1.0 - useful) + 0.03
        if len(members) == 2:
            assert wasted / len(inside) >= (1.0 - useful) - 0.03  # exact for two
        checked += 1
    assert checked == 60


def _box(x0: float, x1: float, y0: float, y1: float) -> Filter:
    return _f(f"[x,>=,{x0!r}],[x,<=,{x1!r}],[y,>=,{y0!r}],[y,<=,{y1!r}]")


@settings(max_examples=scaled(300), deadline=None)
@given(st.lists(_filters() | _ranges(), min_size=1, max_size=8), st.sampled_from([0.0, 0.5]))
def test_grouping_partitions_the_filters_into_groups_matching_what_their_members_do(
    filters: list[Filter], bound: float
) -> None:
    domain = Interval(True, -1, False, 12, False)
    named = [(f"f{i}", flt) for i, flt in enumerate(filters)]
    groups = group(named, bound, lambda attribute: domain, most=3)
    members = [m for g in groups for m in g.members]
    assert sorted(members) == sorted(name for name, _ in named)
    by_name = dict(named)
    for g in groups:
        assert len(g.members) <= 3 and 1.0 - g.useful <= bound + 1e-9
        for pub in PUBS:
            either = any(matches(by_name[m], pub) for m in g.members)
            if g.useful == 1.0:
                assert matches(g.filter, pub) == either, pub
            elif either:
                assert matches(g.filter, pub), pub
