"""The padres command line: parse and match, as a user runs them."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from padres.cli import build_parser, main
from padres.language.datasets import SAMPLE

ROOT = Path(__file__).resolve().parent.parent
DEMO_SUBS = ROOT / "scenarios" / "stocks" / "subscriptions.txt"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_parse_prints_normalized_batch_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "in.txt"
    f.write_text("# comment\n[class,'A'], [x, 1.50]\ns [ class,eq,'A' ],[x,isPresent,7]\n")
    code, out, err = run(capsys, "parse", str(f))
    assert code == 0 and err == ""
    assert out.splitlines() == ["p [class,'A'],[x,1.5]", "s [class,eq,'A'],[x,isPresent]"]


def test_parse_json_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "in.txt"
    f.write_text("cs {[class,eq,'A'],[k,eq,$K]} & {[class,eq,'B'],[k,eq,$K]}\nus s1\n")
    code, out, _ = run(capsys, "parse", "--json", str(f))
    assert code == 0
    first, second = (orjson.loads(line) for line in out.splitlines())
    assert first["type"] == "composite_subscription" and first["id"] == "s1"
    assert second == {"v": 1, "type": "unsubscribe", "subscription_id": "s1"}


def test_parse_reports_every_bad_line_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "bad.txt"
    f.write_text("s [class,eq,'A']\ns [class,eq,]\np [class,'A']\ns [x,<,1]\n")
    code, out, err = run(capsys, "parse", str(f))
    assert code == 1
    assert out.splitlines() == ["s [class,eq,'A']", "p [class,'A']"]
    assert f"{f}:line 2, column 13: expected a value for 'class' but found ']'" in err
    assert f"{f}:line 4, column 3: a filter needs exactly one class predicate" in err
    assert err.rstrip().endswith("2 invalid lines")


def test_parse_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "parse", "/nonexistent/file.txt")
    assert code == 1
    assert "/nonexistent/file.txt: no such file" in err


def test_parse_binary_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "bin.txt"
    f.write_bytes(b"s [class,eq,'A']\n\xff\xfe\x00garbage\n")
    code, _, err = run(capsys, "parse", str(f))
    assert code == 1 and "not UTF-8 text" in err


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_match_reports_absences_when_the_input_ends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    subs = write(
        tmp_path,
        "subs.txt",
        "cs {[class,eq,'Order'],[id,eq,$I]} ; !{[class,eq,'Paid'],[id,eq,$I]} within 5s\n"
        "cs {[class,eq,'Order'],[id,eq,$I]} ; {[class,eq,'Paid'],[id,eq,$I]} within 5s\n",
    )
    pubs = write(
        tmp_path,
        "pubs.txt",
        "[class,'Order'],[id,'o1'],[time,'2026-11-01T08:00:00']\n"
        "[class,'Order'],[id,'o2'],[time,'2026-11-01T08:00:01']\n"
        "[class,'Paid'],[id,'o1'],[time,'2026-11-01T08:00:03']\n"
        "[class,'Order'],[id,'o3'],[time,'2026-11-01T08:00:30']\n",
    )
    code, out, _ = run(capsys, "match", "--subs", subs, "--pubs", pubs, "--engine", "naive")
    assert code == 0
    assert out.splitlines() == [
        f"p1 ({pubs}:1): -",
        f"p2 ({pubs}:2): -",
        f"p3 ({pubs}:3): -",
        f"p4 ({pubs}:4): s1[p2]{{I='o2'}} s2[p1,p3]{{I='o1'}}",
        "end of input: s1[p4]{I='o3'}",
    ]


def test_match_text_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    subs = write(
        tmp_path,
        "subs.txt",
        "s [class,eq,'Order'],[price,>,100]\n"
        "s [class,eq,'Order']\n"
        "cs {[class,eq,'Order'],[UserType,eq,$X]} & {[class,eq,'SysInfo'],[UserType,eq,$X]}\n",
    )
    pubs = write(
        tmp_path,
        "pubs.txt",
        "[class,'Order'],[price,120],[UserType,'gold']\n"
        "[class,'Other']\n"
        "p [class,'SysInfo'],[UserType,'gold']\n",
    )
    code, out, _ = run(capsys, "match", "--subs", subs, "--pubs", pubs)
    assert code == 0
    assert out.splitlines() == [
        f"p1 ({pubs}:1): s1 s2",
        f"p2 ({pubs}:2): -",
        f"p3 ({pubs}:3): s3[p1,p3]{{X='gold'}}",
    ]
    code, out, _ = run(capsys, "match", "--subs", subs, "--pubs", pubs, "--json", "--only-matches")
    rows = [orjson.loads(line) for line in out.splitlines()]
    assert [r["publication"] for r in rows] == ["p1", "p3"]
    assert rows[0]["subscriptions"] == ["s1", "s2"]
    assert rows[1]["composites"] == [
        {"subscription": "s3", "publications": ["p1", "p3"], "bindings": {"X": "gold"}}
    ]


def test_match_rejects_wrong_kinds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    subs = write(tmp_path, "subs.txt", "[class,'A']\n")
    code, _, err = run(capsys, "match", "--subs", subs, "--pubs", str(SAMPLE))
    assert code == 1 and "expected a subscription, found Publication" in err
    good = write(tmp_path, "good.txt", "[class,eq,'A']\n")
    pubs = write(tmp_path, "pubs.txt", "[class,eq,'A']\n")
    code, _, err = run(capsys, "match", "--subs", good, "--pubs", pubs)
    assert code == 1 and "pubs.txt:1: expected a publication, found Subscription" in err


def test_match_summary_on_the_sample(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "match", "--subs", str(DEMO_SUBS), "--pubs", str(SAMPLE), "--summary"
    )
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("1,000 publications matched against 6 subscriptions")
    counts = {line.split()[0]: int(line.split()[1].replace(",", "")) for line in lines[1:]}
    # the sample holds the 100 newest quotes of ten symbols, AAPL and MSFT among them
    assert counts["s1"] == 100
    assert counts["s6"] == 2


def test_console_script_is_installed(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "padres"
    if not script.exists():
        pytest.skip(f"the padres console script is not installed beside {sys.executable}")
    f = tmp_path / "one.txt"
    f.write_text("[class,eq,'A'],[x,<,1]\n")
    done = subprocess.run(
        [str(script), "parse", "--json", str(f)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert orjson.loads(done.stdout)["type"] == "subscription"
    done = subprocess.run(
        [str(script), "parse", "-"],
        input="[class,eq,]\n",
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert "<stdin>:line 1, column 11" in done.stderr


def test_every_engine_prints_the_same(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    subs = write(
        tmp_path,
        "subs.txt",
        DEMO_SUBS.read_text() + "cs {[class,eq,'STOCK'],[symbol,eq,'MSFT'],[date,eq,$S$D]} || "
        "{[class,eq,'STOCK'],[symbol,eq,'AAPL'],[close,>,60],[date,eq,$S$D]}\n",
    )
    outputs = {}
    for engine in ("rete", "naive", "experta"):
        code, out, _ = run(
            capsys, "match", "--subs", subs, "--pubs", str(SAMPLE), "--engine", engine
        )
        assert code == 0
        outputs[engine] = out
    assert outputs["rete"] == outputs["naive"] == outputs["experta"]
    assert "s6[" in outputs["rete"] and "s7[" in outputs["rete"]


def test_every_command_explains_itself(capsys: pytest.CaptureFixture[str]) -> None:
    """``--help`` works for every command and subcommand (argparse formats help strings with
    ``%``: a stray one breaks it)."""

    def commands(parser: argparse.ArgumentParser, path: list[str]) -> Iterator[list[str]]:
        yield path
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from commands(sub, [*path, name])

    seen = 0
    for path in commands(build_parser(), []):
        with pytest.raises(SystemExit) as done:
            main([*path, "--help"])
        assert done.value.code == 0, path
        assert "usage: padres" in capsys.readouterr().out, path
        seen += 1
    assert seen > 20


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("padres ")


def test_the_accounts_file_may_follow_the_action(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    accounts = str(tmp_path / "accounts.toml")
    assert main(["user", "add", "shop", "--password", "pw", "--accounts", accounts]) == 0
    assert main(["user", "--accounts", accounts, "list"]) == 0
    assert "shop (client)" in capsys.readouterr().out
