"""The benchmark commands run, check themselves, and report what they promise."""

from __future__ import annotations

import orjson
import pytest

from padres.cli import main
from padres.language.datasets import SAMPLE

REQUIRED = {
    "median_ms",
    "p99_ms",
    "naive_ratio",
    "matches_per_pub",
    "insert_per_s",
    "remove_per_s",
    "bytes_per_sub",
    "subs",
    "workload",
}


@pytest.mark.parametrize(
    "argv",
    [
        ["--workload", "stock", "--subs", "2000", "--pubs", "100", "--data", str(SAMPLE)],
        ["--workload", "dense", "--subs", "3000", "--pubs", "50"],
        ["--workload", "composite", "--subs", "100", "--pubs", "400"],
    ],
    ids=["stock", "dense", "composite"],
)
def test_bench_match(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "match", "--json", *argv]) == 0
    result = orjson.loads(capsys.readouterr().out)
    assert result.keys() >= REQUIRED
    assert result["checked"] is True
    assert result["median_ms"] > 0 and result["p99_ms"] >= result["median_ms"]
    assert result["naive_ratio"] > 1  # faster than the naive scan even at this size


def test_bench_parse(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "parse", "--data", str(SAMPLE), "--repeat", "1", "--limit", "300", "--json"]
    assert main(argv) == 0
    result = orjson.loads(capsys.readouterr().out)
    assert result["lines"] == 300
    assert result["text_lines_per_s"] > 0 and result["json_lines_per_s"] > 0


def test_bench_startup(capsys: pytest.CaptureFixture[str]) -> None:
    """Every case runs to its end (a command that fails fails the benchmark)."""
    assert main(["bench", "startup", "--repeat", "1", "--json"]) == 0
    result = orjson.loads(capsys.readouterr().out)
    cases = result["cases"]
    assert {"padres --help", "padres pub (1 publication)", "the interpreter alone"} <= set(cases)
    for trees in cases.values():
        assert list(trees) == ["this"]
        assert trees["this"]["wall_ms"] > 0 and trees["this"]["cpu_ms"] > 0


def test_bench_durable_composite(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "durable-composite", "--count", "400", "--sync", "off", "--json"]
    assert main(argv) == 0
    result = orjson.loads(capsys.readouterr().out)
    assert [(r["window_s"], r["frame"]) for r in result["runs"]] == [
        (1, 1),
        (1, 100),
        (10, 1),
        (10, 100),
    ]
    for r in result["runs"]:
        assert r["plain_per_s"] > 0 and r["durable_per_s"] > 0 and r["matches"] > 0
        assert 0 < r["held"] <= 100 * r["window_s"] + 2  # the window's, 100 a second
        assert r["state_bytes"] > 0
