"""The overlay oracle's rules, and ``padres bench overlay --processes``: real broker processes
in a random cyclic overlay, on test hosts where they can be made, checked by the oracle."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pytest

from padres.bench.overlay import Held, Oracle
from padres.cli import main
from padres.language.parser import parse_filter
from padres.model.messages import Publication
from padres.testing.hosts import unavailable


def _oracle() -> Oracle:
    """Round 2: client p advertises Quotes; s1 (of c) wants x > 5, s2 (of d) x < 5, both
    acknowledged before p published x = 7; s3 (of c) was made during the round."""
    o = Oracle(round=2)
    quotes = parse_filter("[class,eq,'Quote'],[x,isPresent,0]")
    o.advs[("p", "a1")] = Held("p", quotes, 1)
    o.subs[("c", "s1")] = Held("c", parse_filter("[class,eq,'Quote'],[x,>,5]"), 1)
    o.subs[("d", "s2")] = Held("d", parse_filter("[class,eq,'Quote'],[x,<,5]"), 1)
    o.subs[("c", "s3")] = Held("c", parse_filter("[class,eq,'Quote']"), 2)
    o.touched.add(("c", "s3"))
    o.acked = {("p", "a1"), ("c", "s1"), ("d", "s2")}
    pub = Publication("q1", {"class": "Quote", "x": 7}, datetime(2026, 1, 1, tzinfo=UTC))
    o.pubs.append((pub, "p", "a1", frozenset(o.acked)))
    return o


def test_the_oracle_passes_what_the_rules_allow() -> None:
    o = _oracle()
    assert list(o.owed({"c", "d"})) == [("c", "q1", "s1")]
    o.check({"c": [("q1", ("s1", "s3"))], "d": []}, {"c", "d"})
    assert o.violations == [] and o.checked == 1 and o.deliveries == 1


@pytest.mark.parametrize(
    ("fresh", "violation"),
    [
        ({"c": [("q1", ("s1",)), ("q1", ("s1",))]}, "c received q1 twice"),
        ({"c": [("q1", ("s1",))], "d": [("q1", ("s2",))]}, "d got q1 for s2, not matching"),
        ({"c": [("q1", ("s1", "s9"))]}, "c got q1 for unknown s9"),
        ({"c": []}, "c missed q1 for s1"),
    ],
    ids=["twice", "not-matching", "unknown", "missed"],
)
def test_the_oracle_finds_each_kind_of_violation(
    fresh: dict[str, list[tuple[str, tuple[str, ...]]]], violation: str
) -> None:
    o = _oracle()
    o.check(fresh, {"c", "d"})
    assert o.violations == [violation]


def test_a_client_gone_is_owed_nothing() -> None:
    o = _oracle()
    o.check({"c": []}, {"d"})
    assert o.violations == [] and o.checked == 0


def test_an_overlay_of_four_broker_processes_checked_by_the_oracle(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """On test hosts where they can be made, else on loopback, saying why."""
    argv = ["--processes", "4", "--clients", "8", "--rounds", "2", "--operations", "30"]
    assert main(["bench", "overlay", "--json", *argv]) == 0
    r = orjson.loads(capsys.readouterr().out)
    assert r["violations"] == []
    why = unavailable()
    assert r["hosts"] is (why is None)
    assert r["where"] == ("test hosts" if why is None else f"loopback ({why})")
    assert r["links"] >= 4  # a cycle at least
    assert r["checked"] > 0 and r["deliveries"] >= r["checked"]
    assert r["routing_messages"] > 0 and r["routes_at_end_of_rounds"] > 0
    assert 10 < r["rss_mib_rounds"]["mean"] < 1000
    assert r["startup_seconds"] > 0
