"""``padres bench peers``: the NATS side delivers and finds what the reference matcher does."""

from __future__ import annotations

import pytest

from historic.bench import peers, strong
from historic.bench.history import publications, selection
from padres.bench import network
from padres.bench.workloads import stock_publications, stock_subscriptions
from padres.language.datasets import SAMPLE
from padres.matching.matcher import matches
from padres.model.messages import Publication, Subscription

pytestmark = [
    pytest.mark.skipif(peers.nats_missing() is not None, reason=str(peers.nats_missing())),
    pytest.mark.anyio,  # at collection: the parametrized coroutine tests need it then
]


def _shares(count: int) -> tuple[list[list[Subscription]], list[Publication]]:
    quotes = stock_publications(SAMPLE)
    subs = list(stock_subscriptions(count, quotes, seed=1))
    return [subs[i::3] for i in range(3)], quotes


def _reference(shares: list[list[Subscription]], pubs: list[Publication]) -> int:
    """Deliveries by the reference matcher: a publication once per client it matches at."""
    return sum(1 for share in shares for p in pubs if any(matches(s.filter, p) for s in share))


async def test_nats_subscribers_matching_in_python_get_every_expected_delivery() -> None:
    shares, quotes = _shares(300)
    work = network.Work.of(shares, quotes, 2_000, 1_000, 0.5)
    assert work.expected > 0 and work.expected_paced > 0
    with peers.NatsCluster(3) as cluster:
        # measure() raises unless exactly the expected deliveries arrive, counted once each
        figures = await peers._nats_live(cluster.urls, shares, work, cluster)
    assert figures["publications_per_second"] > 0
    assert figures["latency_samples"] == work.expected_paced
    assert figures["bytes_per_delivery"]["publisher"] > 0
    assert set(figures["cpu_us_per_delivery"]) == {"servers", "clients"}


@pytest.mark.parametrize("framed", [False, True], ids=["a quote a message", "framed"])
async def test_strong_nats_subscribers_deliver_what_the_reference_matcher_does(
    framed: bool,
) -> None:
    shares, quotes = _shares(300)
    work = network.Work.of(shares, quotes, 2_000, 1_000, 0.5)
    assert work.expected == _reference(shares, work.batch) > 0
    assert work.expected_paced == _reference(shares, work.paced) > 0
    with peers.NatsCluster(1) as cluster:
        # exactly work.expected deliveries, then exactly work.expected_paced, or it raises
        figures = await peers._nats_strong(cluster, shares, work, framed=framed)
    assert figures["latency_samples"] == work.expected_paced
    assert set(figures["cpu_us_per_delivery"]) == {"servers", "subscribers", "publisher"}
    sent = figures["bytes_per_delivery"]
    assert sent["publisher"] > 0 and sent["n0"] > sent["publisher"]  # each client gets them all
    # on the wire, each quote with NATS' framing: more than its payload
    assert figures["bytes_received_per_delivery"]["subscribers"] > sent["n0"]


def test_strong_subjects_bring_each_quote_once() -> None:
    shares, _ = _shares(300)
    assert all(strong.subjects(share) == ["STOCK.*"] for share in shares)
    named = [s for s in shares[0] if strong.subjects([s]) != ["STOCK.*"]][:2]
    symbols = {p.value for s in named for p in s.filter.predicates if p.attribute == "symbol"}
    assert named and strong.subjects(named) == sorted(f"STOCK.{v}" for v in symbols)


async def test_a_jetstream_reader_finds_what_the_reference_matcher_finds() -> None:
    pubs = publications(5_000, SAMPLE)
    flt, since, until = selection(pubs)
    expected = sum(1 for p in pubs if since <= p.timestamp < until and matches(flt, p))
    assert expected > 0
    with peers.NatsCluster(1, jetstream=True) as cluster:
        figures = await peers._jetstream(cluster.urls[0], pubs, 1)
    assert figures["query_rows"] == expected


@pytest.mark.parametrize("acked", [False, True], ids=["not waiting", "acknowledged"])
async def test_the_strong_jetstream_reader_finds_what_the_reference_matcher_finds(
    acked: bool,
) -> None:
    pubs = publications(5_000, SAMPLE)
    flt, since, until = selection(pubs)
    expected = sum(1 for p in pubs if since <= p.timestamp < until and matches(flt, p))
    assert expected > 0
    with peers.NatsCluster(1, jetstream=True) as cluster:
        figures = await peers._jetstream_strong(cluster.urls[0], pubs, 1, acked=acked)
    assert figures["query_rows"] == expected
