"""``padres bench replay --peer jetstream``: both sides answer the store's answer in every round,
and JetStream is skipped, saying why, where it cannot be measured."""

from __future__ import annotations

import pytest

from historic.bench import jetstream, peers
from historic.bench.history import publications, selection
from padres.bench.usage import get_json
from padres.language.datasets import SAMPLE
from padres.matching.matcher import matches


def _expected(count: int) -> int:
    pubs = publications(count, SAMPLE)
    flt, since, until = selection(pubs)
    return sum(1 for p in pubs if since <= p.timestamp < until and matches(flt, p))


@pytest.mark.skipif(peers.nats_missing() is not None, reason=str(peers.nats_missing()))
def test_both_sides_find_what_the_reference_matcher_finds_in_every_round() -> None:
    expected = _expected(5_000)
    assert expected > 0
    r = jetstream.run(5_000, data=SAMPLE, rounds=2, synced_count=200)
    assert r["query_expected"] == expected
    assert r["padres"]["rows"] == [expected, expected]
    theirs = r["JetStream"]
    assert theirs["rows"] == [expected, expected] and len(theirs["ratios"]) == 2
    acked = theirs["acked_ingest"]
    assert acked["publications"] == 200 and acked["default_per_second"] > 0
    if peers.nats_version() >= peers.SYNCED_SINCE:
        assert acked["synced_per_second"] > 0
    else:
        assert "sync_interval came in 2.10" in acked["synced_missing"]
    text = jetstream.report(r)
    assert "JetStream / padres" in text and "an fsync at each write" in text
    theirs["cpu_ratio"] = None  # what a query too small for /proc's ticks gives
    assert "JetStream / padres not measurable" in jetstream.report(r)


def test_without_a_nats_server_jetstream_is_skipped_saying_why() -> None:
    r = jetstream.run(3_000, data=SAMPLE, rounds=1, server="no-such-nats-server")
    assert r["JetStream"] is None
    assert "no no-such-nats-server executable" in r["nats_missing"]
    assert r["padres"]["rows"] == [r["query_expected"]]
    assert "JetStream   not measured: no no-such-nats-server executable" in jetstream.report(r)


@pytest.mark.skipif(
    peers.nats_missing() is not None or peers.nats_version() < peers.SYNCED_SINCE,
    reason="needs nats-server 2.10 or later",
)
def test_a_synced_server_syncs_each_write() -> None:
    with peers.NatsCluster(1, jetstream=True, synced=True) as cluster:
        config = get_json(f"{cluster.monitors[0]}/varz")["jetstream"]["config"]
    assert config["sync_always"] is True
