"""Matching facts in batches (the alpha network over many facts at once) gives exactly what
matching them one by one gives, and what the reference matcher gives."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rete.cluster
from padres.matching.reference import ReferenceMatcher
from padres.matching.rete_matcher import ReteMatcher
from padres.model.messages import CompositeSubscription, Filter, Publication, Subscription
from rete import Network, Op, Test, Value
from rete.bitset import WORD_DTYPE, pairs, positions
from rete.limits import CompositeLimits, Policy
from tests.strategies import NOW, scaled
from tests.test_rete import expressions, filters, publications

BATCHES = st.lists(st.integers(1, 12), min_size=1, max_size=6)
"""Sizes of the consecutive batches a stream of facts is cut into (the last repeats)."""


def cut(pubs: list[Publication], sizes: list[int]) -> list[list[Publication]]:
    out: list[list[Publication]] = []
    i = 0
    while i < len(pubs):
        size = sizes[min(len(out), len(sizes) - 1)]
        out.append(pubs[i : i + size])
        i += size
    return out


@pytest.mark.parametrize("batch_words", [1, 1 << 20])  # 1: every fact in a chunk of its own
@settings(
    max_examples=scaled(200),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(filters(), min_size=1, max_size=60),
    st.lists(publications(), max_size=40),
    BATCHES,
    st.sampled_from([0, 16]),
)
def test_atomic_batches_equal_one_by_one_and_the_reference(
    monkeypatch: pytest.MonkeyPatch,
    batch_words: int,
    flts: list[Filter],
    pubs: list[Publication],
    sizes: list[int],
    small: int,
) -> None:
    monkeypatch.setattr(rete.cluster, "BATCH_WORDS", batch_words)
    subs = [Subscription(f"s{i}", flt) for i, flt in enumerate(flts)]
    one, batched = ReteMatcher(small_cluster=small), ReteMatcher(small_cluster=small)
    reference = ReferenceMatcher()
    for sub in subs:
        one.add(sub)
        batched.add(sub)
        reference.add(sub)
    for batch in cut(pubs, sizes):
        results = batched.network.match_batch(batch)
        for pub, result in zip(batch, results, strict=True):
            expected = one.network.match(pub).conditions
            assert result.conditions == expected  # the same ids, in the same order
            assert sorted(expected) == sorted(reference.match(pub).subscriptions)


@settings(max_examples=scaled(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(expressions(), min_size=1, max_size=4),
    st.lists(filters(), max_size=20),
    st.lists(publications(), max_size=30),
    BATCHES,
    st.sampled_from(list(Policy)),
    st.sampled_from([None, timedelta(seconds=30)]),
    st.sampled_from([0, 16]),
)
def test_composite_batches_equal_one_by_one(
    exprs: list[object],
    flts: list[Filter],
    pubs: list[Publication],
    sizes: list[int],
    policy: Policy,
    window: timedelta | None,
    small: int,
) -> None:
    limits = CompositeLimits(policy, 10_000, window)
    one, batched = ReteMatcher(limits, small), ReteMatcher(limits, small)
    subs: list[Subscription | CompositeSubscription] = [
        CompositeSubscription(f"c{i}", e)  # type: ignore[arg-type]
        for i, e in enumerate(exprs)
    ]
    subs += [Subscription(f"s{i}", flt) for i, flt in enumerate(flts)]
    for sub in subs:
        one.add(sub)
        batched.add(sub)
    for batch in cut(pubs, sizes):
        for pub, result in zip(batch, batched.network.match_batch(batch), strict=True):
            expected = one.network.match(pub)
            assert result.conditions == expected.conditions
            assert [(a.id, a.facts, a.bindings) for a in result.activations] == [
                (a.id, a.facts, a.bindings) for a in expected.activations
            ]
    assert batched.evicted == one.evicted


def fact(**attributes: Value) -> Publication:
    return Publication("p", {"class": "A", **attributes}, NOW)


def test_a_change_to_the_network_drops_what_was_matched_ahead() -> None:
    network = Network(small_cluster=0)
    for i in range(20):
        network.add(f"low{i}", (Test("class", Op.EQ, "A"), Test("x", Op.LT, i)))
    pubs = [fact(x=5), fact(x=50), fact(x=7)]
    network.prefetch(pubs)
    assert network.match(pubs[0]).conditions == [f"low{i}" for i in range(6, 20)]
    network.add("high", (Test("class", Op.EQ, "A"), Test("x", Op.GT, 10)))
    assert network.match(pubs[1]).conditions == ["high"]  # not the result computed before
    network.remove("low19")
    assert network.match(pubs[2]).conditions == [f"low{i}" for i in range(8, 19)]


def test_a_result_matched_ahead_serves_its_own_fact_once() -> None:
    network = Network(small_cluster=0)
    for i in range(20):
        network.add(f"low{i}", (Test("class", Op.EQ, "A"), Test("x", Op.LT, i)))
    first = fact(x=5)
    network.prefetch([first, fact(x=6), fact(x=7)])
    twin = fact(x=18)  # another fact, not the one matched ahead
    assert network.match(twin).conditions == ["low19"]
    assert network.match(first).conditions == network.match(first).conditions


@pytest.mark.parametrize("value", [2**53 + 1, -(2**60), 1e300, True, "5", None])
def test_values_floats_cannot_hold_or_that_are_no_numbers(value: Value | None) -> None:
    network, reference = Network(small_cluster=0), Network(small_cluster=0)
    for i, bound in enumerate([0, 2**53, 2**53 + 2, 2.0**53, 1e299]):
        for net in (network, reference):
            net.add(f"ge{i}", (Test("class", Op.EQ, "A"), Test("x", Op.GE, bound)))
            net.add(f"lt{i}", (Test("class", Op.EQ, "A"), Test("x", Op.LT, bound)))
    extra = {} if value is None else {"x": value}
    pubs = [fact(**extra), fact(x=3), fact(x=2**53 + 3), fact(**extra), fact(y=1)]
    results = network.match_batch(pubs)
    assert [r.conditions for r in results] == [reference.match(p).conditions for p in pubs]


@pytest.mark.parametrize("rows", [1, 3, 50])
@pytest.mark.parametrize("width", [1, 8, 40, 3125])
@pytest.mark.parametrize("density", [0.0, 0.0005, 0.05, 0.9])
def test_set_bits_of_rows_of_bitsets(rows: int, width: int, density: float) -> None:
    bits = np.random.default_rng(rows * width).random((rows, width * 64)) < density
    words = np.packbits(bits, axis=1, bitorder="little").view(WORD_DTYPE).reshape(rows, width)
    row, bit = pairs(words)
    expected_row, expected_bit = np.nonzero(bits)
    assert np.array_equal(row, expected_row) and np.array_equal(bit, expected_bit)
    assert positions(words[0]).tolist() == np.flatnonzero(bits[0]).tolist()
