"""The numbers a durable subscription has taken per producer, against a plain set."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from padres.model import producers
from padres.model.producers import take


@given(st.lists(st.tuples(st.sampled_from("pqr"), st.integers(1, 60)), max_size=300))
def test_each_number_of_each_producer_is_new_once(arrivals: list[tuple[str, int]]) -> None:
    ranges: producers.Ranges = {}
    seen: set[tuple[str, int]] = set()
    for producer, seq in arrivals:
        assert take(ranges, producer, seq) == ((producer, seq) not in seen)
        seen.add((producer, seq))
    for producer, kept in ranges.items():  # sorted, disjoint, not touching
        assert all(first <= last for first, last in kept)
        assert all(a[1] + 1 < b[0] for a, b in itertools.pairwise(kept))
        assert {n for first, last in kept for n in range(first, last + 1)} == {
            n for p, n in seen if p == producer
        }


def test_numbers_in_order_keep_one_range() -> None:
    ranges: producers.Ranges = {}
    assert all(take(ranges, "p", n) for n in range(1, 10_001))
    assert ranges == {"p": [[1, 10_000]]}


def test_what_is_over_the_bounds_is_forgotten_oldest_first() -> None:
    ranges: producers.Ranges = {}
    for n in range(producers.MAX_RANGES + 1):
        take(ranges, "p", 2 * n + 1)  # 1, 3, 5, ...: a range each
    assert len(ranges["p"]) == producers.MAX_RANGES and ranges["p"][0] == [3, 3]
    assert take(ranges, "p", 1)  # forgotten: taken again, never dropped
    for n in range(producers.MAX_PRODUCERS):
        take(ranges, f"q{n}", 1)
    assert "p" not in ranges and len(ranges) == producers.MAX_PRODUCERS
    assert take(ranges, "q1", 2) and not take(ranges, "q1", 1)
