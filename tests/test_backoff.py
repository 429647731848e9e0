"""The one backoff of every retry loop."""

from __future__ import annotations

import pytest

from padres.runtime.backoff import Backoff


def test_delays_double_with_jitter_up_to_the_most_and_start_again_after_a_reset() -> None:
    backoff = Backoff(first=0.1, most=1.0)
    bounds = [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    for bound in bounds:
        assert bound / 2 <= backoff.next() <= bound
    backoff.reset()
    assert 0.05 <= backoff.next() <= 0.1


def test_delays_that_make_no_sense_are_refused() -> None:
    with pytest.raises(ValueError, match="first <= most"):
        Backoff(first=2.0, most=1.0)
    with pytest.raises(ValueError):
        Backoff(first=0.0)
