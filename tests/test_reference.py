"""The reference matcher's semantics, case by case (docs/language.md states them)."""

from __future__ import annotations

from datetime import timedelta
from itertools import count

import pytest

from padres.errors import DuplicateId, UnknownId
from padres.language.parser import parse_composite, parse_publication, parse_subscription
from padres.matching.matcher import MatchResult
from padres.matching.reference import ReferenceMatcher
from padres.model.messages import Publication
from rete.limits import CompositeLimits, Policy
from tests.strategies import NOW

_ids = count(1)


def pub(text: str, seconds: int = 0) -> Publication:
    return parse_publication(text, id=f"p{next(_ids)}", timestamp=NOW + timedelta(seconds=seconds))


def matcher_with(*subs: str, limits: CompositeLimits | None = None) -> ReferenceMatcher:
    m = ReferenceMatcher(limits)
    for i, text in enumerate(subs, 1):
        if text.lstrip().startswith(("{", "(")):
            m.add(parse_composite(text, id=f"s{i}"))
        else:
            m.add(parse_subscription(text, id=f"s{i}"))
    return m


def atomic(m: ReferenceMatcher, text: str) -> set[str]:
    return set(m.match(pub(text)).subscriptions)


def test_atomic_conjunction_and_ranges() -> None:
    m = matcher_with(
        "[class,eq,'STOCK'],[symbol,eq,'AAPL']",
        "[class,eq,'STOCK'],[open,>,60],[open,<,65]",
        "[class,eq,'STOCK'],[symbol,str-prefix,'A'],[volume,>=,1000]",
        "[class,eq,'NEWS']",
    )
    assert atomic(m, "[class,'STOCK'],[symbol,'AAPL'],[open,63.3],[volume,1000]") == {
        "s1",
        "s2",
        "s3",
    }
    assert atomic(m, "[class,'STOCK'],[symbol,'AMZN'],[open,65],[volume,999]") == set()
    assert atomic(m, "[class,'NEWS'],[symbol,'AAPL']") == {"s4"}


def test_missing_attribute_never_matches_even_negations() -> None:
    m = matcher_with("[class,eq,'A'],[x,neq,'b']", "[class,eq,'A'],[n,<>,3]", "[class,eq,'A']")
    assert atomic(m, "[class,'A']") == {"s3"}
    assert atomic(m, "[class,'A'],[x,'c'],[n,4]") == {"s1", "s2", "s3"}


def test_type_mismatch_never_matches() -> None:
    m = matcher_with(
        "[class,eq,'A'],[x,<,10]", "[class,eq,'A'],[x,neq,'a']", "[class,eq,'A'],[x,eq,true]"
    )
    assert atomic(m, "[class,'A'],[x,'5']") == {"s2"}
    assert atomic(m, "[class,'A'],[x,5]") == {"s1"}
    assert atomic(m, "[class,'A'],[x,true]") == {"s3"}
    assert atomic(m, "[class,'A'],[x,1]") == {"s1"}


def test_int_and_float_compare_by_value() -> None:
    m = matcher_with("[class,eq,'A'],[x,=,10]", "[class,eq,'A'],[x,=,10.5]")
    assert atomic(m, "[class,'A'],[x,10.0]") == {"s1"}
    assert atomic(m, "[class,'A'],[x,10.5]") == {"s2"}


def test_class_is_case_sensitive() -> None:
    m = matcher_with("[class,eq,'Stock']")
    assert atomic(m, "[class,'STOCK']") == set()
    assert atomic(m, "[class,'Stock']") == {"s1"}


def test_add_remove_and_errors() -> None:
    m = matcher_with("[class,eq,'A']")
    with pytest.raises(DuplicateId, match="subscription 's1' already exists"):
        m.add(parse_subscription("[class,eq,'B']", id="s1"))
    m.remove("s1")
    assert atomic(m, "[class,'A']") == set()
    with pytest.raises(UnknownId, match="no subscription 's1'"):
        m.remove("s1")
    assert len(m) == 0


ORDER_SYSINFO = (
    "{[class,eq,'Order'],[UserType,eq,$X]} & "
    "{[class,eq,'SysInfo'],[UserType,eq,$X],[Status,eq,'overloaded']}"
)


def composite_keys(result: MatchResult) -> list[tuple[list[str], dict[str, object]]]:
    return [([p.id for p in c.publications], dict(c.bindings)) for c in result.composites]


def test_composite_and_with_variable_consume_and_remain() -> None:
    m = matcher_with(ORDER_SYSINFO)
    gold = pub("[class,'Order'],[UserType,'gold'],[Item,'shoes']")
    silver = pub("[class,'Order'],[UserType,'silver']")
    assert not m.match(gold) and not m.match(silver)
    overload = pub("[class,'SysInfo'],[UserType,'gold'],[Status,'overloaded']")
    result = m.match(overload)
    assert composite_keys(result) == [([gold.id, overload.id], {"X": "gold"})]
    # consume-and-remain: the SysInfo stays, so a later gold order matches it again
    gold2 = pub("[class,'Order'],[UserType,'gold']")
    assert composite_keys(m.match(gold2)) == [([gold2.id, overload.id], {"X": "gold"})]
    # and a second overloaded report matches both gold orders
    overload2 = pub("[class,'SysInfo'],[UserType,'gold'],[Status,'overloaded']")
    assert len(m.match(overload2).composites) == 2
    assert not m.match(pub("[class,'SysInfo'],[UserType,'silver'],[Status,'healthy']"))


def test_composite_parts_need_distinct_publications() -> None:
    m = matcher_with("{[class,eq,'A']} & {[class,eq,'A'],[x,>,5]}")
    first = pub("[class,'A'],[x,10]")
    assert not m.match(first)  # one publication cannot fill both parts
    second = pub("[class,'A'],[x,1]")
    result = m.match(second)
    assert composite_keys(result) == [([second.id, first.id], {})]
    third = pub("[class,'A'],[x,7]")
    # third fills part 1 with first or second as part 0... and part 0 with first as part 1;
    # {third, first} is found twice but is one match
    assert sorted(sorted(ids) for ids, _ in composite_keys(m.match(third))) == [
        sorted([first.id, third.id]),
        sorted([second.id, third.id]),
    ]


def test_composite_or_and_nesting() -> None:
    m = matcher_with("{[class,eq,'A']} & ({[class,eq,'B']} || {[class,eq,'C']})")
    a = pub("[class,'A']")
    assert not m.match(a)
    c = pub("[class,'C']")
    assert composite_keys(m.match(c)) == [([a.id, c.id], {})]
    m2 = matcher_with("{[class,eq,'A']} || {[class,eq,'B']}")
    assert len(m2.match(pub("[class,'B']")).composites) == 1


def test_numeric_variables_and_types() -> None:
    m = matcher_with("{[class,eq,'A'],[n,=,$I$N]} & {[class,eq,'B'],[n,=,$I$N]}")
    assert not m.match(pub("[class,'A'],[n,3]"))
    assert not m.match(pub("[class,'B'],[n,3.0]"))  # $I binds integers only
    assert len(m.match(pub("[class,'B'],[n,3]")).composites) == 1
    f = matcher_with("{[class,eq,'A'],[n,=,$F$N]} & {[class,eq,'B'],[n,=,$F$N]}")
    assert not f.match(pub("[class,'A'],[n,2]"))
    assert composite_keys(f.match(pub("[class,'B'],[n,2.0]")))[0][1] == {"N": 2}
    s = matcher_with("{[class,eq,'A'],[u,eq,$U]} & {[class,eq,'B'],[u,eq,$U]}")
    assert not s.match(pub("[class,'A'],[u,1]"))  # eq binds strings and booleans, not numbers
    assert not s.match(pub("[class,'B'],[u,1]"))


def test_variable_repeated_in_one_part() -> None:
    m = matcher_with("{[class,eq,'A'],[x,eq,$X],[y,eq,$X]}")
    assert not m.match(pub("[class,'A'],[x,'a'],[y,'b']"))
    assert len(m.match(pub("[class,'A'],[x,'a'],[y,'a']")).composites) == 1


def test_consume_policy_uses_each_publication_once() -> None:
    limits = CompositeLimits(policy=Policy.CONSUME)
    m = matcher_with("{[class,eq,'A'],[k,eq,$K]} & {[class,eq,'B'],[k,eq,$K]}", limits=limits)
    a1 = pub("[class,'A'],[k,'x']")
    a2 = pub("[class,'A'],[k,'x']")
    m.match(a1)
    m.match(a2)
    b1 = pub("[class,'B'],[k,'x']")
    assert composite_keys(m.match(b1)) == [([a1.id, b1.id], {"K": "x"})]  # the oldest partner
    b2 = pub("[class,'B'],[k,'x']")
    assert composite_keys(m.match(b2)) == [([a2.id, b2.id], {"K": "x"})]
    assert not m.match(pub("[class,'B'],[k,'x']"))  # every A was used


def test_max_facts_evicts_the_oldest() -> None:
    m = matcher_with("{[class,eq,'A']} & {[class,eq,'B']}", limits=CompositeLimits(max_facts=2))
    a = [pub("[class,'A']") for _ in range(3)]
    for p in a:
        m.match(p)
    assert m.evicted == 1
    result = m.match(pub("[class,'B']"))
    assert sorted(c.publications[0].id for c in result.composites) == sorted([a[1].id, a[2].id])


def test_window_forgets_old_publications() -> None:
    limits = CompositeLimits(window=timedelta(seconds=60))
    m = matcher_with("{[class,eq,'A']} & {[class,eq,'B']}", limits=limits)
    old = pub("[class,'A']", seconds=0)
    recent = pub("[class,'A']", seconds=100)
    m.match(old)
    m.match(recent)
    result = m.match(pub("[class,'B']", seconds=130))
    assert [c.publications[0].id for c in result.composites] == [recent.id]
    assert m.evicted == 1


def test_composite_sees_only_publications_after_it_was_added() -> None:
    m = ReferenceMatcher()
    m.match(pub("[class,'A']"))
    m.add(parse_composite("{[class,eq,'A']} & {[class,eq,'B']}", id="s1"))
    assert not m.match(pub("[class,'B']"))


def test_removing_a_composite_drops_its_state() -> None:
    m = matcher_with("{[class,eq,'A']} & {[class,eq,'B']}")
    m.match(pub("[class,'A']"))
    m.remove("s1")
    m.add(parse_composite("{[class,eq,'A']} & {[class,eq,'B']}", id="s1"))
    assert not m.match(pub("[class,'B']"))


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="max_facts"):
        CompositeLimits(max_facts=0)
    with pytest.raises(ValueError, match="window"):
        CompositeLimits(window=timedelta(0))
