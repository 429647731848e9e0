"""``padres broker`` settings from a TOML file and the environment, under the flags."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from padres.cli import main
from tests.support import health

FILE = """\
id = "B7"
port = 0
neighbour = ["ws://127.0.0.1:9001/ws"]
max_frame = 8
covering = "active"
no-conformity = true
heartbeat = 3
"""


def _shown(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, str]:
    assert main(["broker", *argv, "--print-config"]) == 0
    out = capsys.readouterr().out
    return dict(re.findall(r"^([\w-]+) = (.*)$", out, re.MULTILINE))


def test_flags_go_over_the_environment_which_goes_over_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "broker.toml"
    config.write_text(FILE)
    monkeypatch.setenv("PADRES_BROKER_HEARTBEAT", "2")
    monkeypatch.setenv("PADRES_BROKER_MAX_FRAME", "6")
    monkeypatch.setenv("PADRES_BROKER_QUIET", "yes")
    shown = _shown(capsys, "--config", str(config), "--max-frame", "5", "--port", "9100")
    assert shown["id"] == '"B7"'  # the file
    assert shown["covering"] == '"active"' and shown["no-conformity"] == "true"
    assert shown["heartbeat"] == "2.0"  # the environment over the file
    assert shown["quiet"] == "true"
    assert shown["max-frame"] == "5.0" and shown["port"] == "9100"  # the flags over both
    assert shown["neighbour"] == '["ws://127.0.0.1:9001/ws"]'
    assert shown["max-refusals"] == "100.0"  # the default


def test_the_printed_settings_are_a_file_that_gives_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PADRES_BROKER_ID", "E1")
    monkeypatch.setenv("PADRES_BROKER_NEIGHBOUR", "ws://a:1/ws, ws://b:2/ws")
    monkeypatch.setenv("PADRES_BROKER_PASSWORD", "s3cret")
    assert main(["broker", "--print-config", "--no-conformity"]) == 0
    printed = capsys.readouterr().out
    assert "s3cret" not in printed
    config = tmp_path / "again.toml"
    config.write_text(printed.replace('password = "(hidden)"', ""))
    for name in ("PADRES_BROKER_ID", "PADRES_BROKER_NEIGHBOUR", "PADRES_BROKER_PASSWORD"):
        monkeypatch.delenv(name)
    again = _shown(capsys, "--config", str(config))
    assert again["id"] == '"E1"' and again["no-conformity"] == "true"
    assert again["neighbour"] == '["ws://a:1/ws", "ws://b:2/ws"]'


@pytest.mark.parametrize(
    ("text", "env", "said"),
    [
        ("max-frme = 3\n", {}, "no setting named 'max-frme' (did you mean max-frame?)"),
        ("port = 'x'\n", {}, "port: 'x': not a whole number"),
        ("covering = 'eager'\n", {}, "'eager' is not one of off, lazy, active"),
        ("quiet = 'maybe'\n", {}, "'maybe' is not true or false"),
        ("id = \n", {}, "not TOML"),
        ("", {"PADRES_BROKER_MAX_FRAME": "-1"}, "PADRES_BROKER_MAX_FRAME: '-1': must be positive"),
    ],
)
def test_a_wrong_setting_is_refused_saying_where_and_why(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    text: str,
    env: dict[str, str],
    said: str,
) -> None:
    config = tmp_path / "broker.toml"
    config.write_text(text)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["broker", "--id", "x", "--config", str(config)]) == 2
    assert said in capsys.readouterr().err


def test_a_missing_file_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["broker", "--id", "x", "--config", "/nonexistent/b.toml"]) == 2
    assert "--config /nonexistent/b.toml: No such file or directory" in capsys.readouterr().err


def test_a_broker_runs_from_a_file_alone(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text('id = "CF"\nport = 0\nquiet = true\n')
    env = {**os.environ, "PADRES_BROKER_CONFIG": str(config)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "padres.cli", "broker"],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = re.search(r"listening on (ws://\S+)", line)
        assert url is not None, line
        assert health(url.group(1))["broker"] == "CF"
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_a_database_node_takes_filters_from_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filter's commas are its own; several filters go one per line."""
    monkeypatch.setenv("PADRES_DB_ID", "DB1")
    monkeypatch.setenv("PADRES_DB_STORE", "[class,eq,'Order'],[price,>,1]")
    monkeypatch.setenv("PADRES_DB_BROKER", "ws://a:1/ws, ws://b:2/ws")
    assert main(["db", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "store = [\"[class,eq,'Order'],[price,>,1]\"]" in out
    assert 'broker = ["ws://a:1/ws", "ws://b:2/ws"]' in out
    monkeypatch.setenv("PADRES_DB_STORE", "[class,eq,'Order']\n[class,eq,'Return']")
    assert main(["db", "--print-config"]) == 0
    assert "store = [\"[class,eq,'Order']\", \"[class,eq,'Return']\"]" in capsys.readouterr().out
