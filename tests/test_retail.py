"""The retail scenario end to end (brokers and databases as processes), its counts checked
against what was published, computed here without the project's matchers; its patterns in
time (live, hybrid across the switch, historic over the day) against the reference
evaluation of what the databases stored."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from padres.language.parser import parse_composite
from padres.matching.reference_temporal import over_range
from padres.model.codec import from_dict
from padres.model.messages import Publication

SCRIPT = Path(__file__).parent.parent / "scenarios" / "retail" / "retail.py"


def _publications(items: list[dict[str, Any]]) -> list[Publication]:
    decoded = [from_dict(p) for p in items]
    out = [p for p in decoded if isinstance(p, Publication)]
    assert len(out) == len(items)
    return out


def test_the_sales_manager_gets_exactly_what_was_published(tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--json", str(report_path), "--per-half", "150"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    report = orjson.loads(report_path.read_bytes())
    second = datetime.fromisoformat(report["second_half"])
    pubs: list[dict[str, Any]] = report["published"]
    published = _publications(pubs)
    for p in pubs:
        p["at"] = datetime.fromisoformat(p["timestamp"])
    first = [p for p in pubs if p["at"] < second]
    orders = [p for p in pubs if p["attributes"]["class"] == "Order"]

    def ids(selected: list[dict[str, Any]]) -> list[list[str]]:
        return sorted([p["id"]] for p in selected)

    attrs = "attributes"
    want = {
        "future": ids([p for p in orders if p[attrs]["item"] == "shoes" and p["at"] >= second]),
        "historic": ids([p for p in orders if p[attrs]["price"] > 100 and p["at"] < second]),
        "hybrid": ids([p for p in orders if p[attrs]["customerID"] == "C7"]),
    }
    overloaded = [
        p for p in first if p[attrs]["class"] == "SysInfo" and p[attrs]["status"] == "overloaded"
    ]
    first_orders = [p for p in first if p[attrs]["class"] == "Order"]
    want["composite"] = sorted(
        sorted([s["id"], o["id"]])
        for s in overloaded
        for o in first_orders
        if s[attrs]["userType"] == o[attrs]["userType"]
    )
    received = report["received"]
    for name, expected in want.items():
        assert sorted(received[name]) == expected, name
        assert max(Counter(map(tuple, received[name])).values(), default=1) == 1  # no duplicate
    assert want["historic"] and want["hybrid"] and want["future"] and want["composite"]
    for name in ("historic", "hybrid", "composite"):
        assert report["replays"][name]["databases"] == ["DB1@B2", "DB2@B4"]
        assert report["replays"][name]["failed"] == []
    assert report["replays"]["historic"]["count"] == len(want["historic"])

    # The patterns in time: the databases stored every publication once, and each way of
    # following a pattern got what the reference gives over the same publications.
    stored = _publications(report["stored"])
    assert sorted(p.id for p in stored) == sorted(p.id for p in published)
    forever = datetime.fromisoformat("9999-01-01T00:00:00+00:00")
    straddling = 0
    for name, text in report["subscriptions"].items():
        _, dash, how = name.rpartition("-")
        if not dash:
            continue
        sub = parse_composite(text, id=name)
        over = published if how == "live" else stored
        until = None if how == "historic" else forever
        want_matches = over_range(sub, over, until)
        assert sorted(received[name]) == sorted(
            sorted(p.id for p in m.publications) for m in want_matches
        ), name
        assert want_matches, name
        if how == "hybrid":
            straddling += sum(
                m.publications[0].timestamp < second <= m.publications[-1].timestamp
                for m in want_matches
            )
        if how == "historic":
            assert report["replays"][name]["count"] == len(want_matches), name
    assert straddling > 0  # hybrid matches whose first publication is in the past, last live
