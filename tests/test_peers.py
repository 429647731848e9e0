"""``padres bench peers``: the NATS side delivers and finds what the reference matcher does."""

from __future__ import annotations

import pytest

from historic.bench import peers
from historic.bench.history import publications, selection
from padres.bench import network
from padres.bench.workloads import stock_publications, stock_subscriptions
from padres.language.datasets import SAMPLE
from padres.matching.matcher import matches

pytestmark = pytest.mark.skipif(peers.nats_missing() is not None, reason=str(peers.nats_missing()))


async def test_nats_subscribers_matching_in_python_get_every_expected_delivery() -> None:
    quotes = stock_publications(SAMPLE)
    subs = list(stock_subscriptions(300, quotes, seed=1))
    shares = [subs[i::3] for i in range(3)]
    work = network.Work.of(shares, quotes, 2_000, 1_000, 0.5)
    assert work.expected > 0 and work.expected_paced > 0
    with peers.NatsCluster(3) as cluster:
        # measure() raises unless exactly the expected deliveries arrive, counted once each
        figures = await peers._nats_live(cluster.urls, shares, work)
    assert figures["publications_per_second"] > 0
    assert figures["latency_samples"] == work.expected_paced


async def test_a_jetstream_reader_finds_what_the_reference_matcher_finds() -> None:
    pubs = publications(5_000, SAMPLE)
    flt, since, until = selection(pubs)
    expected = sum(1 for p in pubs if since <= p.timestamp < until and matches(flt, p))
    assert expected > 0
    with peers.NatsCluster(1, jetstream=True) as cluster:
        figures = await peers._jetstream(cluster.urls[0], pubs, 1)
    assert figures["query_rows"] == expected
