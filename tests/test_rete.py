"""The Rete engine against the reference matcher and experta, on random conditions and facts."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from itertools import count

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from padres.matching.experta_matcher import ExpertaMatcher
from padres.matching.matcher import Matcher, MatchResult
from padres.matching.reference import ReferenceMatcher
from padres.matching.rete_matcher import ReteMatcher
from padres.model.messages import (
    AllOf,
    AnyOf,
    CompositeSubscription,
    Expression,
    Filter,
    Predicate,
    Publication,
    Subscription,
    Variable,
    VarType,
)
from rete import Network, Op, Test, Value
from rete.limits import CompositeLimits, Policy
from rete.operators import NUMERIC, STRING
from tests.strategies import NOW, scaled

# Small domains, so that random conditions and facts often meet.
ATTRS = ["a", "b", "c"]
NUMBERS: list[Value] = [
    -1,
    0,
    1,
    2,
    2.5,
    3.0,
    2**53 + 1,
    2**53 + 2,
    2**60,
    -(2**60),
    2.0**53,
    1e300,
]
STRINGS: list[Value] = ["", "a", "ab", "abc", "b", "ba", "A"]
VALUES = NUMBERS + STRINGS + [True, False]
CLASSES = ["A", "B"]


@st.composite
def predicate(draw: st.DrawFn) -> Predicate:
    op = draw(st.sampled_from(list(Op)))
    if op in NUMERIC:
        value: Value | None = draw(st.sampled_from(NUMBERS))
    elif op in STRING:
        value = draw(st.sampled_from(STRINGS))
    elif op is Op.IS_PRESENT:
        value = None
    else:
        value = draw(st.sampled_from([*STRINGS, True, False]))
    return Predicate(draw(st.sampled_from(ATTRS)), op, value)


@st.composite
def filters(draw: st.DrawFn, variables: bool = False) -> Filter:
    preds = [Predicate("class", Op.EQ, draw(st.sampled_from(CLASSES)))]
    preds += draw(st.lists(predicate(), max_size=4))
    if variables:
        for attr in draw(st.lists(st.sampled_from(ATTRS), max_size=2, unique=True)):
            name, op, vtype = draw(
                st.sampled_from(
                    [
                        ("X", Op.EQ, VarType.ANY),
                        ("N", Op.EQ_NUM, VarType.FLOAT),
                        ("I", Op.EQ_NUM, VarType.INTEGER),
                    ]
                )
            )
            preds.append(Predicate(attr, op, Variable(name, vtype)))
    return Filter(tuple(draw(st.permutations(preds))))


def expressions() -> st.SearchStrategy[Expression]:
    return st.recursive(
        filters(variables=True),
        lambda inner: st.one_of(
            st.lists(inner, min_size=2, max_size=3).map(lambda ps: AllOf(tuple(ps))),
            st.lists(inner, min_size=2, max_size=2).map(lambda ps: AnyOf(tuple(ps))),
        ),
        max_leaves=4,
    )


_pub_ids = count(1)


@st.composite
def publications(draw: st.DrawFn) -> Publication:
    attrs: dict[str, Value] = {"class": draw(st.sampled_from(CLASSES))}
    attrs.update(draw(st.dictionaries(st.sampled_from(ATTRS), st.sampled_from(VALUES))))
    seconds = draw(st.integers(0, 100))
    return Publication(f"p{next(_pub_ids)}", attrs, NOW + timedelta(seconds=seconds))


def add_all(subs: Sequence[Subscription | CompositeSubscription], *matchers: Matcher) -> None:
    for sub in subs:
        for matcher in matchers:
            matcher.add(sub)


def composite_keys(result: MatchResult) -> set[object]:
    return {m.key() for m in result.composites}


def assert_same(expected: MatchResult, actual: MatchResult) -> None:
    assert sorted(actual.subscriptions) == sorted(expected.subscriptions)
    assert len(actual.subscriptions) == len(set(actual.subscriptions))
    assert composite_keys(actual) == composite_keys(expected)
    assert len(actual.composites) == len(expected.composites)


SMALL_CLUSTER = st.sampled_from([0, 64])
"""0 makes every cluster use its indexes; 64 (the default) evaluates small ones directly."""


@settings(max_examples=scaled(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(filters(), min_size=1, max_size=40),
    st.lists(publications(), max_size=25),
    SMALL_CLUSTER,
)
def test_atomic_matches_equal_the_reference(
    flts: list[Filter], pubs: list[Publication], small: int
) -> None:
    reference, rete = ReferenceMatcher(), ReteMatcher(small_cluster=small)
    add_all([Subscription(f"s{i}", flt) for i, flt in enumerate(flts)], reference, rete)
    for pub in pubs:
        assert_same(reference.match(pub), rete.match(pub))


@settings(max_examples=scaled(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(expressions(), min_size=1, max_size=4),
    st.lists(publications(), max_size=30),
    st.sampled_from(list(Policy)),
    st.sampled_from([10_000, 2]),
    st.sampled_from([None, timedelta(seconds=30)]),
    SMALL_CLUSTER,
    st.booleans(),
)
def test_composite_matches_equal_the_reference(
    exprs: list[Expression],
    pubs: list[Publication],
    policy: Policy,
    max_facts: int,
    window: timedelta | None,
    small: int,
    distinct: bool,
) -> None:
    limits = CompositeLimits(policy, max_facts, window, distinct)
    reference, rete = ReferenceMatcher(limits), ReteMatcher(limits, small_cluster=small)
    add_all([CompositeSubscription(f"c{i}", e) for i, e in enumerate(exprs)], reference, rete)
    for pub in pubs:
        expected, actual = reference.match(pub), rete.match(pub)
        if policy is Policy.CONSUME:  # one match per composite: which one is part of the semantics
            assert sorted(map(str, (m.key() for m in actual.composites))) == sorted(
                map(str, (m.key() for m in expected.composites))
            )
        assert_same(expected, actual)
    assert rete.evicted == reference.evicted


class AddRemoveMatch(RuleBasedStateMachine):
    """Random interleavings of add, remove and match, checked after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.reference = ReferenceMatcher()
        self.rete = ReteMatcher(small_cluster=2)  # clusters switch paths as they grow
        self.ids: list[str] = []
        self.next = count()

    @rule(flt=filters())
    def add_subscription(self, flt: Filter) -> None:
        sub = Subscription(f"s{next(self.next)}", flt)
        self.reference.add(sub)
        self.rete.add(sub)
        self.ids.append(sub.id)

    @rule(expr=expressions())
    def add_composite(self, expr: Expression) -> None:
        sub = CompositeSubscription(f"c{next(self.next)}", expr)
        self.reference.add(sub)
        self.rete.add(sub)
        self.ids.append(sub.id)

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(self.ids))
        self.ids.remove(sid)
        self.reference.remove(sid)
        self.rete.remove(sid)

    @rule(pub=publications())
    def match(self, pub: Publication) -> None:
        assert_same(self.reference.match(pub), self.rete.match(pub))

    @invariant()
    def same_size(self) -> None:
        assert len(self.rete) == len(self.reference) == len(self.ids)


TestAddRemoveMatch = AddRemoveMatch.TestCase
TestAddRemoveMatch.settings = settings(
    max_examples=scaled(60),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@settings(max_examples=scaled(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(filters(), max_size=8),
    st.lists(expressions(), max_size=3),
    st.lists(publications(), max_size=15),
)
def test_experta_agrees(
    flts: list[Filter], exprs: list[Expression], pubs: list[Publication]
) -> None:
    """experta, an independent Rete, is the referee: the same matches, composites included."""
    rete, experta = ReteMatcher(), ExpertaMatcher()
    subs: list[Subscription | CompositeSubscription] = [
        Subscription(f"s{i}", f) for i, f in enumerate(flts)
    ]
    subs += [CompositeSubscription(f"c{i}", e) for i, e in enumerate(exprs)]
    add_all(subs, rete, experta)
    for pub in pubs:
        assert_same(experta.match(pub), rete.match(pub))


@settings(max_examples=scaled(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(filters(), min_size=1, max_size=200),
    st.lists(expressions(), max_size=5),
    st.lists(publications(), max_size=10),
)
def test_network_holds_nothing_after_every_condition_is_removed(
    flts: list[Filter], exprs: list[Expression], pubs: list[Publication]
) -> None:
    rete = ReteMatcher(CompositeLimits(window=timedelta(seconds=50)), small_cluster=8)
    ids = []
    for i, f in enumerate(flts):
        rete.add(Subscription(f"s{i}", f))
        ids.append(f"s{i}")
    for i, e in enumerate(exprs):
        rete.add(CompositeSubscription(f"c{i}", e))
        ids.append(f"c{i}")
    for pub in pubs:
        rete.match(pub)
    for sid in ids:
        rete.remove(sid)
    stats = rete.network.stats()
    assert {k: v for k, v in stats.items() if k != "evicted"} == dict.fromkeys(
        stats.keys() - {"evicted"}, 0
    )


def test_clusters_compact_and_keep_matching() -> None:
    net = Network(small_cluster=0)
    for i in range(1000):
        net.add(i, (Test("class", Op.EQ, "A"), Test("x", Op.GE, i), Test("x", Op.LT, i + 10)))
    for i in range(0, 1000, 2):
        net.remove(i)
    for i in range(1, 700, 2):
        net.remove(i)
    fact = _Fact({"class": "A", "x": 850})
    assert sorted(net.match(fact).conditions) == [i for i in range(841, 851) if i % 2]
    assert net.stats()["slots"] == 150


def test_conditions_without_equality_share_the_root_cluster() -> None:
    net = Network()
    net.add("low", (Test("x", Op.LT, 10),))
    net.add("prefix", (Test("name", Op.STR_PREFIX, "ab"),))
    net.add("contains", (Test("name", Op.STR_CONTAINS, "b"), Test("name", Op.STR_PREFIX, "x")))
    assert sorted(net.match(_Fact({"x": 5, "name": "abc"})).conditions) == ["low", "prefix"]
    assert net.match(_Fact({"name": "xbz"})).conditions == ["contains"]
    assert net.stats()["clusters"] == 1


def test_duplicate_and_unknown_ids() -> None:
    net = Network()
    net.add("s", (Test("x", Op.LT, 1),))
    with pytest.raises(KeyError):
        net.add("s", (Test("x", Op.LT, 1),))
    with pytest.raises(KeyError):
        net.remove("t")


class _Fact:
    def __init__(self, attributes: dict[str, Value]) -> None:
        self.attributes = attributes
        self.timestamp = NOW


def test_identical_composites_share_a_join_but_keep_their_own_horizon() -> None:
    text = "{[class,eq,'A'],[k,eq,$K]} & {[class,eq,'B'],[k,eq,$K]}"
    reference, rete = ReferenceMatcher(), ReteMatcher()
    stream = iter(range(1000))

    def publish(cls: str, k: str) -> None:
        pub = Publication(f"t{next(stream)}", {"class": cls, "k": k}, NOW)
        assert_same(reference.match(pub), rete.match(pub))

    def add(sid: str) -> None:
        from padres.language.parser import parse_composite

        sub = parse_composite(text, id=sid)
        reference.add(sub)
        rete.add(sub)

    add("first")
    publish("A", "x")
    add("second")  # identical: joins once, but must not see the A published before it
    publish("B", "x")
    publish("A", "x")
    publish("B", "x")
    assert rete.network.stats()["join_nodes"] == 1
    reference.remove("first")
    rete.remove("first")
    publish("B", "x")
    add("third")
    publish("A", "y")
    publish("B", "y")
    for sid in ("second", "third"):
        reference.remove(sid)
        rete.remove(sid)
    assert rete.network.stats()["alpha_memories"] == 0


def test_prepare_folds_every_cluster_at_once() -> None:
    net = Network(small_cluster=0)
    for i in range(200):
        net.add(i, (Test("class", Op.EQ, "A"), Test("k", Op.EQ, i % 4), Test("x", Op.LT, i)))
    net.prepare()
    clusters = net._alpha.clusters.values()
    assert all(c.numeric.flushed == c.used for c in clusters)
    assert sorted(net.match(_Fact({"class": "A", "k": 1, "x": 190})).conditions) == [
        i for i in range(191, 200) if i % 4 == 1
    ]


def test_conditions_without_further_tests_keep_small_clusters_direct() -> None:
    net = Network()
    net.add("only-class", (Test("class", Op.EQ, "A"),))
    net.add("range", (Test("class", Op.EQ, "A"), Test("x", Op.GT, 1)))
    cluster = net._alpha.clusters[("class", "s", "A")]
    assert cluster.tested == cluster.live == 2  # both evaluated directly
    assert sorted(net.match(_Fact({"class": "A", "x": 2})).conditions) == ["only-class", "range"]


def test_tests_of_different_operand_types_are_different_nodes() -> None:
    assert Test("x", Op.EQ, True) != Test("x", Op.EQ, 1)
    assert len({Test("x", Op.EQ, True), Test("x", Op.EQ, 1), Test("x", Op.EQ, 1.0)}) == 3
    net = Network(small_cluster=0)
    net.add("bool", (Test("k", Op.EQ, "A"), Test("x", Op.STR_LT, "m"), Test("x", Op.EQ, True)))
    net.add("int", (Test("k", Op.EQ, "A"), Test("x", Op.STR_LT, "m"), Test("x", Op.EQ, 1)))
    assert net.match(_Fact({"k": "A", "x": True})).conditions == []  # str-lt needs a string
    net.add("b2", (Test("k", Op.EQ, "A"), Test("y", Op.EQ, True), Test("y", Op.NEQ, False)))
    net.add("i2", (Test("k", Op.EQ, "A"), Test("y", Op.EQ, True), Test("y", Op.NEQ, 0)))
    assert net.match(_Fact({"k": "A", "y": True})).conditions == ["b2"]


def test_conditions_on_hundreds_of_attributes_match_exactly() -> None:
    """Columns are added to a cluster's numeric index in doublings, and a compacted cluster
    keeps them: every one is checked."""
    net = Network(small_cluster=0)
    width = 300
    for i in range(200):
        tests = [Test("class", Op.EQ, "A"), *(Test(f"a{k}", Op.GT, i) for k in range(width))]
        net.add(i, tuple(tests))
    fact: dict[str, Value] = {"class": "A", **{f"a{k}": 20 for k in range(width)}}
    assert sorted(net.match(_Fact(fact)).conditions) == list(range(20))
    fact["a299"] = 5  # the last column decides
    assert sorted(net.match(_Fact(fact)).conditions) == list(range(5))
    for i in [*range(2, 200, 2), *range(21, 200, 2)]:
        net.remove(i)  # more than half the slots dead: the cluster is compacted
    assert net.stats()["slots"] == 11
    assert sorted(net.match(_Fact(fact)).conditions) == [0, 1, 3]
    fact["a299"] = 20
    assert sorted(net.match(_Fact(fact)).conditions) == [0, 1, *range(3, 20, 2)]


def test_match_part_feeds_one_part_only_even_where_parts_are_identical() -> None:
    from padres.language.parser import parse_composite
    from padres.matching.rete_matcher import to_composite

    sub = parse_composite("{[class,eq,'A'],[k,eq,$K]} & {[class,eq,'A'],[k,eq,$K]}", id="c")
    net = Network(share=False)
    net.add("c", to_composite(sub))
    a1, a2, b1 = (Publication(f"p{i}", {"class": "A", "k": "x"}, NOW) for i in range(3))
    assert net.match_part(a1, "c", 0).activations == []
    assert net.match_part(a2, "c", 0).activations == []  # part 1 holds nothing yet
    matched = net.match_part(b1, "c", 1).activations
    assert sorted(tuple(p.id for p in a.facts) for a in matched) == [("p0", "p2"), ("p1", "p2")]
    other = Publication("q", {"class": "B", "k": "x"}, NOW)
    assert net.match_part(other, "c", 0).activations == []  # the part's tests still apply
