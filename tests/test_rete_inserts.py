"""Conditions inserted many at once (``Network.add_many``) are filed as inserted one by one, and
clusters growing block by block keep matching: both held to the reference matcher."""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rete.cluster
import rete.numeric
from padres.matching.reference import ReferenceMatcher
from padres.matching.rete_matcher import to_conjunction
from padres.model.messages import Filter, Publication, Subscription
from rete import DuplicateCondition, Network, Op, Test, Value
from rete.conditions import Bind
from rete.numeric import BLOCK, RANGE_OPS, NumericIndex, capacity_for, grown, intervals
from tests.strategies import NOW, scaled
from tests.test_rete import ATTRS, NUMBERS, filters, publications

T = TypeVar("T")


def cut(items: list[T], sizes: list[int]) -> list[list[T]]:
    """``items`` in consecutive runs of ``sizes`` (the last size repeats)."""
    out: list[list[T]] = []
    i = 0
    while i < len(items):
        size = sizes[min(len(out), len(sizes) - 1)]
        out.append(items[i : i + size])
        i += size
    return out


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 64 slots, and intervals set vectorized from 2 conditions on, 16 at a time:
    growth past a block and the vectorized path at sizes tests can afford."""
    monkeypatch.setattr(rete.numeric, "BLOCK", 64)
    monkeypatch.setattr(rete.cluster, "BULK", 2)
    monkeypatch.setattr(rete.cluster, "CHUNK", 16)


@pytest.mark.usefixtures("small_blocks")
@settings(
    max_examples=scaled(150),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(filters(), min_size=1, max_size=150),
    st.lists(publications(), max_size=20),
    st.lists(st.integers(1, 40), min_size=1, max_size=6),
    st.sets(st.integers(0, 149), max_size=100),
    st.sampled_from([0, 16]),
)
def test_inserted_together_matches_as_one_by_one_and_the_reference(
    flts: list[Filter],
    pubs: list[Publication],
    sizes: list[int],
    removed: set[int],
    small: int,
) -> None:
    conditions = [(f"s{i}", to_conjunction(f)) for i, f in enumerate(flts)]
    one, many = Network(small_cluster=small), Network(small_cluster=small)
    reference = ReferenceMatcher()
    for i, (cid, condition) in enumerate(conditions):
        one.add(cid, condition)
        reference.add(Subscription(cid, flts[i]))
    for batch in cut(conditions, sizes):
        many.add_many(batch)
    for i in sorted(removed & set(range(len(flts)))):  # enough to compact some clusters
        for network in (one, many):
            network.remove(f"s{i}")
        reference.remove(f"s{i}")
    late = [(f"t{i}", c) for i, (_, c) in enumerate(conditions)]  # into the compacted clusters
    for cid, condition in late:
        one.add(cid, condition)
        reference.add(Subscription(cid, flts[int(cid[1:])]))
    many.add_many(late)
    for pub in pubs:
        expected = one.match(pub).conditions
        assert many.match(pub).conditions == expected  # the same ids, in the same order
        assert sorted(expected) == sorted(reference.match(pub).subscriptions)


@pytest.mark.usefixtures("small_blocks")
def test_a_cluster_of_many_blocks_matches_through_growth_and_compaction() -> None:
    rng = random.Random(7)
    ranges = [Op.LT, Op.LE, Op.GT, Op.GE]  # no "=": it would be an access test

    def condition() -> tuple[Test, ...]:
        tests = [Test("class", Op.EQ, "A")]
        for attribute in rng.sample(ATTRS, rng.randint(1, 3)):
            for _ in range(rng.randint(1, 2)):
                tests.append(Test(attribute, rng.choice(ranges), rng.choice(NUMBERS)))
        return tuple(tests)

    conditions = [(i, condition()) for i in range(1500)]
    network = Network(small_cluster=0)
    for batch in cut(conditions, [1, 3, 100, 7, 400]):
        network.add_many(batch)
    for cid in range(0, 1500, 3):
        network.remove(cid)
    live = [(cid, tests) for cid, tests in conditions if cid % 3]
    (cluster,) = network._alpha.clusters.values()
    assert len(cluster.numeric.ends) > 1  # several blocks
    for _ in range(200):
        attributes = {"class": "A"} | {a: rng.choice(NUMBERS) for a in ATTRS}
        expected = [cid for cid, tests in live if all(t.passes(attributes) for t in tests)]
        assert sorted(network.match(Publication("p", attributes, NOW)).conditions) == expected


EDGES: list[Value] = [
    *NUMBERS,
    math.nan,
    math.inf,
    -math.inf,
    -0.0,
    2**53,
    -(2**53),
    2**53 - 1,
    2**63,
    2**64,
    -(2**63) - 1,
    True,
]


@st.composite
def range_tests(draw: st.DrawFn) -> Test:
    op = draw(st.sampled_from(sorted(RANGE_OPS)))
    return Test(draw(st.sampled_from(ATTRS)), op, draw(st.sampled_from(EDGES)))


@settings(max_examples=scaled(300), deadline=None)
@given(
    st.lists(
        st.lists(st.one_of(range_tests(), st.just(Test("d", Op.EQ, "x"))), max_size=6),
        min_size=1,
        max_size=12,
    ),
    st.integers(0, 3),
)
def test_intervals_set_together_equal_those_set_one_by_one(
    conditions: list[list[Test]], start: int
) -> None:
    together, apart = NumericIndex(64), NumericIndex(64)
    split = together.set_many(start, conditions)
    expected = []
    for slot, tests in enumerate(conditions, start):
        exact, recheck, others = intervals(tests)
        if exact:
            apart.set_intervals(slot, exact)
        expected.append((recheck, others))
    operands = [t.operand for tests in conditions for t in tests if t.op in RANGE_OPS]
    if split is None:  # only for integers beyond 64 bits, which no array of numbers holds
        assert any(type(x) is int and not -(2**63) <= x < 2**64 for x in operands)
        return
    assert [(Counter(r), list(o)) for r, o in split] == [(Counter(r), o) for r, o in expected]
    used = start + len(conditions)
    together.prepare(used)
    apart.prepare(used)
    assert together.columns == apart.columns  # in the same order: first use
    width = 2 * len(apart.columns)
    assert together.ends[0][:width, :used].tolist() == apart.ends[0][:width, :used].tolist()


def test_capacities_grow_by_half_a_block_at_most_past_the_first() -> None:
    capacity, steps = 64, []
    while capacity < 3 * BLOCK:
        after = grown(capacity)
        steps.append(after - capacity)
        capacity = after
        assert capacity % 64 == 0
        assert capacity_for(capacity) == capacity
    assert max(steps) == BLOCK // 2
    assert capacity_for(BLOCK + 1) == BLOCK + 64


def test_a_batch_with_a_taken_id_or_a_binding_adds_nothing() -> None:
    network = Network()
    network.add("a", (Test("class", Op.EQ, "A"),))
    fresh = (Test("x", Op.LT, 3),)
    with pytest.raises(DuplicateCondition):
        network.add_many([("b", fresh), ("a", fresh)])
    with pytest.raises(DuplicateCondition):
        network.add_many([("c", fresh), ("c", fresh)])
    with pytest.raises(ValueError, match="variables"):
        network.add_many([("d", fresh), ("e", (Bind("x", "X", numeric=False),))])
    assert len(network) == 1
    network.add_many([("b", fresh), ("c", fresh)])
    fact = Publication("p", {"class": "A", "x": 1}, NOW)
    assert sorted(network.match(fact).conditions) == ["a", "b", "c"]
