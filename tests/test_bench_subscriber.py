"""``padres bench hop --client`` and the chain's subscribers apart count what the reference
matcher says they get."""

from __future__ import annotations

import orjson
import pytest

from padres.bench import network, subscriber
from padres.bench.workloads import stock_publications, stock_subscriptions
from padres.cli import main
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


def test_subscribers_apart_count_exactly_the_expected_deliveries() -> None:
    quotes = stock_publications(SAMPLE)
    subs = list(stock_subscriptions(300, quotes, seed=1))
    # measure() raises unless exactly the expected deliveries arrive, each counted once
    result = network.run(300, 1_000, rate=1_000, seconds=0.5, data=SAMPLE, apart=True)
    assert result["throughput_deliveries"] == sum(
        _matching(subs[i::3], quotes[:1_000]) for i in range(3)
    )
    assert result["latency_samples"] > 0
    assert set(result["cpu_us_per_delivery"]) == {"servers", "subscribers", "publisher"}


def test_the_command_reports_the_client_alone(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "hop", "--client", "--subs", "300", "--pubs", "300", "--repeat", "1"]
    assert main([*argv, "--frame", "20", "--data", str(SAMPLE), "--json"]) == 0
    result = orjson.loads(capsys.readouterr().out)
    assert result["per_frame"] == 20 and result["deliveries"] > 0
    assert main([*argv, "--plain", "--data", str(SAMPLE)]) == 1  # groups only
