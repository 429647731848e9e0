"""``padres bench hop --client`` counts what the reference matcher says it gets."""

from __future__ import annotations

from padres.bench import subscriber
from padres.bench.workloads import stock_publications, stock_subscriptions
from padres.language.datasets import SAMPLE
from padres.matching.matcher import matches
from padres.model.messages import Publication, Subscription


def _matching(share: list[Subscription], pubs: list[Publication]) -> int:
    """Publications matching any of ``share``: a group's deliveries."""
    return sum(1 for p in pubs if any(matches(s.filter, p) for s in share))


def test_the_client_bench_delivers_each_matching_quote_once_a_repetition() -> None:
    quotes = stock_publications(SAMPLE)
    share = list(stock_subscriptions(300, quotes, seed=1))[1::3]  # B2's subscriber
    expected = _matching(share, quotes[:600])
    result = subscriber.run(subs=300, pubs=600, repeat=2, frame=40, data=SAMPLE)
    assert result["deliveries"] == expected > 0
    assert result["frames"] == -(-expected // 40)
    assert 0 < result["best_us"] <= result["median_us"]
