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


def test_ranges_from_a_client_are_sorted_merged_and_bounded() -> None:
    """What a client says it took, in any order and overlapping, becomes ranges as ``take``
    keeps them: the numbers said are taken, no others."""
    given = {"p": [[10, 12], [1, 3], [4, 5], [11, 20], [30, 29]], "q": [[7, 7]]}
    ranges = producers.ranges_of(given)
    assert ranges == {"p": [[1, 5], [10, 20]], "q": [[7, 7]]}
    assert [n for n in range(25) if producers.take(ranges, "p", n)] == [
        0,
        6,
        7,
        8,
        9,
        21,
        22,
        23,
        24,
    ]
    many = producers.ranges_of({"p": [[2 * i, 2 * i] for i in range(200)]})
    assert len(many["p"]) == producers.MAX_RANGES and many["p"][-1] == [398, 398]
