"""Sequences, windows and absences: the Rete engine against the reference matcher on random
streams (timestamps out of order within the lateness and beyond), and the semantics case by
case."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from itertools import count

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from padres.language.parser import parse_composite, parse_publication
from padres.matching.matcher import CompositeMatch
from padres.matching.reference import ReferenceMatcher
from padres.matching.rete_matcher import ReteMatcher
from padres.model.messages import (
    Absent,
    AllOf,
    AnyOf,
    CompositeSubscription,
    Expression,
    Filter,
    Predicate,
    Publication,
    Sequence,
    Temporal,
    Variable,
    VarType,
)
from rete.limits import CompositeLimits, Policy
from rete.operators import Op, Value
from tests.strategies import NOW, scaled

CLASSES = ["A", "B", "C"]
KEYS: list[Value] = ["k1", "k2"]


@st.composite
def leaf(draw: st.DrawFn) -> Filter:
    preds = [Predicate("class", Op.EQ, draw(st.sampled_from(CLASSES)))]
    if draw(st.booleans()):
        preds.append(Predicate("k", Op.EQ, Variable("K", VarType.ANY)))
    if draw(st.booleans()):
        preds.append(Predicate("n", Op.LT, draw(st.sampled_from([1, 2, 3]))))
    return Filter(tuple(preds))


def _group(inner: st.SearchStrategy[Expression]) -> st.SearchStrategy[Expression]:
    return st.one_of(
        st.lists(inner, min_size=2, max_size=2).map(lambda ps: AllOf(tuple(ps))),
        st.lists(inner, min_size=2, max_size=2).map(lambda ps: AnyOf(tuple(ps))),
    )


@st.composite
def sequences(draw: st.DrawFn) -> Expression:
    """A sequence of two or three steps (a step: a filter or a small group), absences after
    the first, ';' or ';;'."""
    step = st.one_of(leaf(), _group(leaf()))
    parts: list[Expression] = [draw(step)]
    strict = draw(st.booleans())
    for _ in range(draw(st.integers(1, 2))):
        if not strict and draw(st.integers(0, 3)) == 0:
            parts.append(Absent(draw(leaf())))
        parts.append(draw(step))
    if not strict and draw(st.booleans()):
        parts.append(Absent(draw(leaf())))
    return Sequence(tuple(parts), strict)


expressions = st.one_of(sequences(), _group(leaf()))


@st.composite
def temporals(draw: st.DrawFn) -> Temporal:
    seconds = draw(st.sampled_from([None, 3.0, 10.0]))
    events = draw(st.sampled_from([None, None, 3, 6]))
    if seconds is None and events is None:
        seconds = 5.0
    late = draw(st.sampled_from([0.0, 2.0, 5.0]))
    consume = draw(st.sampled_from([None, None, "first", "last"]))
    return Temporal(seconds, events, late, consume)  # type: ignore[arg-type]


_ids = count(1)


@st.composite
def streams(draw: st.DrawFn) -> list[Publication]:
    """Publications whose timestamps move forward, each shifted back at random (so that some
    come out of order, within a lateness of 5 s or beyond)."""
    out = []
    at = 0.0
    for _ in range(draw(st.integers(0, 25))):
        at += draw(st.sampled_from([0.0, 0.5, 1.0, 2.0, 4.0]))
        back = draw(st.sampled_from([0.0, 0.0, 0.0, 1.0, 3.0, 7.0]))
        attrs: dict[str, Value] = {"class": draw(st.sampled_from(CLASSES))}
        if draw(st.integers(0, 3)):
            attrs["k"] = draw(st.sampled_from(KEYS))
        attrs["n"] = draw(st.sampled_from([0, 1, 2]))
        out.append(Publication(f"p{next(_ids)}", attrs, NOW + timedelta(seconds=at - back)))
    return out


def keys(matches: tuple[CompositeMatch, ...]) -> list[str]:
    return sorted(str(m.key()) for m in matches)


@settings(max_examples=scaled(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(expressions, temporals()), min_size=1, max_size=3),
    streams(),
    st.sampled_from([10_000, 3]),
    st.sampled_from(list(Policy)),
)
def test_temporal_matches_equal_the_reference(
    subs: list[tuple[Expression, Temporal]],
    pubs: list[Publication],
    max_facts: int,
    policy: Policy,
) -> None:
    limits = CompositeLimits(policy, max_facts)
    reference, rete = ReferenceMatcher(limits), ReteMatcher(limits, small_cluster=0)
    for i, (expr, temporal) in enumerate(subs):
        try:
            sub = CompositeSubscription(f"c{i}", expr, temporal)
        except ValueError:
            continue  # an absence at the end with a window that cannot close
        reference.add(sub)
        rete.add(sub)
    for pub in pubs:
        assert keys(rete.match(pub).composites) == keys(reference.match(pub).composites)
    end = NOW + timedelta(hours=1)
    assert keys(rete.advance(end)) == keys(reference.advance(end))
    assert rete.late == reference.late


# -- the semantics, case by case ---------------------------------------------------------------

_pub_ids = count(1)


def pub(text: str, seconds: float) -> Publication:
    return parse_publication(
        text, id=f"q{next(_pub_ids)}", timestamp=NOW + timedelta(seconds=seconds)
    )


def run(
    text: str, events: Iterable[tuple[str, float]], until: float = 3600.0
) -> tuple[list[list[Value]], int]:
    """Both engines over ``events``, then time advanced to ``until``: the matches (each as the
    ``n`` of its publications) and the late count, the same for both."""
    outs = []
    for engine in (ReferenceMatcher(), ReteMatcher()):
        engine.add(parse_composite(text, id="c"))
        found: list[CompositeMatch] = []
        for event, seconds in events:
            found += engine.match(pub(event, seconds)).composites
        found += engine.advance(NOW + timedelta(seconds=until))
        outs.append(([[p.attributes["n"] for p in m.publications] for m in found], engine.late))
    assert outs[0] == outs[1]
    return outs[0]


def test_a_sequence_needs_its_order_and_its_window() -> None:
    seq = "{[class,eq,'A']} ; {[class,eq,'B']} within 10s"
    events = [("[class,'B'],[n,0]", 0), ("[class,'A'],[n,1]", 1), ("[class,'B'],[n,2]", 5)]
    events += [("[class,'A'],[n,3]", 20), ("[class,'B'],[n,4]", 31)]
    assert run(seq, events) == ([[1, 2]], 0)
    # '&' with a window: either order, within the window
    assert run(seq.replace(";", "&"), events) == ([[1, 0], [1, 2]], 0)


def test_strictly_next_allows_nothing_of_the_pattern_in_between() -> None:
    events = [("[class,'A'],[n,1]", 0), ("[class,'A'],[n,2]", 1), ("[class,'B'],[n,3]", 2)]
    assert run("{[class,eq,'A']} ;; {[class,eq,'B']} within 10s", events)[0] == [[2, 3]]
    assert run("{[class,eq,'A']} ; {[class,eq,'B']} within 10s", events)[0] == [[1, 3], [2, 3]]


def test_variables_partition_strictness_and_absence() -> None:
    text = "{[class,eq,'A'],[k,eq,$K]} ;; {[class,eq,'B'],[k,eq,$K]} within 10s"
    events = [("[class,'A'],[k,'x'],[n,1]", 0), ("[class,'A'],[k,'y'],[n,2]", 1)]
    events += [("[class,'B'],[k,'x'],[n,3]", 2)]
    assert run(text, events)[0] == [[1, 3]]


def test_an_absence_fires_when_its_window_closes() -> None:
    text = "{[class,eq,'Order'],[id,eq,$I]} ; !{[class,eq,'Paid'],[id,eq,$I]} within 5s"
    events = [("[class,'Order'],[id,'o1'],[n,1]", 0), ("[class,'Order'],[id,'o2'],[n,2]", 1)]
    events += [("[class,'Paid'],[id,'o1'],[n,3]", 3)]
    assert run(text, events, until=5.5) == ([], 0)  # o2's window is open until 6 s
    assert run(text, events, until=6.5) == ([[2]], 0)
    # a payment after the window does not save the order
    late_pay = [("[class,'Order'],[id,'o1'],[n,1]", 0), ("[class,'Paid'],[id,'o1'],[n,3]", 6)]
    assert run(text, late_pay) == ([[1]], 0)


def test_an_absence_between_two_parts() -> None:
    text = "{[class,eq,'A']} ; !{[class,eq,'C']} ; {[class,eq,'B']} within 10s"
    events = [("[class,'A'],[n,1]", 0), ("[class,'C'],[n,2]", 1), ("[class,'A'],[n,3]", 2)]
    events += [("[class,'B'],[n,4]", 3)]
    assert run(text, events)[0] == [[3, 4]]


def test_count_windows() -> None:
    text = "{[class,eq,'A']} ; {[class,eq,'B']} within 2 events"
    events = [("[class,'A'],[n,1]", 0), ("[class,'A'],[n,2]", 1), ("[class,'B'],[n,3]", 9)]
    assert run(text, events)[0] == [[2, 3]]
    absent = "{[class,eq,'A']} ; !{[class,eq,'B']} within 3 events"
    events = [(f"[class,'A'],[n,{i}]", i) for i in (1, 2, 3)] + [("[class,'B'],[n,4]", 4)]
    # A1's window is A1, A2, A3: no B. A2's and A3's hold B4. Publications that satisfy no
    # part (C) do not count.
    assert run(absent, events)[0] == [[1]]
    assert run(absent, [*events[:1], ("[class,'C'],[n,0]", 1.5), *events[1:]])[0] == [[1]]


def test_out_of_order_within_the_lateness_and_beyond() -> None:
    text = "{[class,eq,'A']} ; {[class,eq,'B']} within 10s late 2s"
    events = [("[class,'B'],[n,1]", 5), ("[class,'A'],[n,2]", 4), ("[class,'A'],[n,3]", 1)]
    # A at 4 s is within 2 s of the newest (5 s): taken in its place. A at 1 s is late.
    assert run(text, events) == ([[2, 1]], 1)
    # the same publications in timestamp order give the same matches
    ordered = sorted(events, key=lambda e: e[1])[1:]
    assert run(text, ordered) == ([[2, 1]], 0)


def test_consumption_first_and_last() -> None:
    events = [("[class,'A'],[n,1]", 0), ("[class,'A'],[n,2]", 1), ("[class,'B'],[n,3]", 2)]
    events += [("[class,'B'],[n,4]", 3), ("[class,'B'],[n,5]", 4)]
    text = "{[class,eq,'A']} ; {[class,eq,'B']} within 10s"
    assert run(text, events)[0] == [[1, 3], [2, 3], [1, 4], [2, 4], [1, 5], [2, 5]]
    assert run(text + " consume first", events)[0] == [[1, 3], [2, 4]]
    assert run(text + " consume last", events)[0] == [[2, 3], [1, 4]]


def test_state_is_bounded_by_the_window() -> None:
    """A long stream through a windowed sequence: what the network holds stays bounded."""
    rete = ReteMatcher()
    text = "{[class,eq,'A'],[k,eq,$K]} ; !{[class,eq,'B'],[k,eq,$K]} within 10s"
    rete.add(parse_composite(text, id="c"))
    sizes = []
    fired = 0
    for i in range(6000):
        cls = "B" if i % 10 == 0 else "A"  # only keys k0 and k10 see a B
        publication = pub(f"[class,'{cls}'],[k,'k{i % 20}'],[n,{i}]", i * 0.1)
        fired += len(rete.match(publication).composites)
        if i % 1000 == 999:
            sizes.append(rete.network.stats()["temporal_facts"])
    assert fired > 0
    assert max(sizes) <= 2 * 10 / 0.1  # facts of the last 10 s, held and waiting
    assert max(sizes) - min(sizes) <= 10


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("{[class,eq,'A']} ; !{[class,eq,'B']}", "needs a window to close"),
        ("!{[class,eq,'A']} ; {[class,eq,'B']}", "stands in a sequence, after ';'"),
        ("{[class,eq,'A']} ;; !{[class,eq,'B']} within 1s", "follows ';', not ';;'"),
        ("{[class,eq,'A']} ; {[class,eq,'B']} within 10", "expected a unit"),
        ("({[class,eq,'A']} ; {[class,eq,'B']} within 1s)", "applies to the whole composite"),
        ("{[class,eq,'A']} ; {[class,eq,'B']} within 0s", "more than 0"),
        ("{[class,eq,'A']} ; {[class,eq,'B']} within 1s within 2s", "given twice"),
        ("{[class,eq,'A']} ; {[class,eq,'B']} consume most", "'first' or 'last'"),
        ("{[class,eq,'A']} ; {[class,eq,'B']} within 1.5 events", "whole number"),
        ("{[class,eq,'A']} ; {[class,eq,'B']} late 2h", "at most 3,600"),
    ],
)
def test_errors_say_what_is_wrong(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_composite(text, id="c")
