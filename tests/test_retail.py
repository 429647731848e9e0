"""The retail scenario end to end (brokers and databases as processes), its counts checked
against what was published, computed here without the project's matchers."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

SCRIPT = Path(__file__).parent.parent / "scenarios" / "retail" / "retail.py"


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
