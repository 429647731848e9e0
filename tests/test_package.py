"""The wheel as a user installs it: built from this checkout, installed with pipx into an
environment of its own, and run from there (the version, a broker, a round trip)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "README.md", "padres", "rete", "historic", "web", "spark")
UNREACHABLE = ("No matching distribution", "Could not find a version", "NewConnectionError")


def _run(
    command: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env=env, cwd=cwd, check=False
    )
    if done.returncode != 0 and any(word in done.stderr for word in UNREACHABLE):
        pytest.skip(f"no package index to install from: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr
    return done


def test_the_wheel_installs_with_pipx_and_runs(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy: the build leaves its files beside the sources
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__")
            shutil.copytree(ROOT / name, source / name, ignore=ignore)
        else:
            shutil.copy(ROOT / name, source / name)
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(source)]
    )
    (wheel,) = tmp_path.glob("padres-*.whl")
    _run([sys.executable, "-m", "venv", str(tmp_path / "tools")])
    _run([str(tmp_path / "tools/bin/pip"), "install", "-q", "pipx"])
    env = {
        **os.environ,
        "PIPX_HOME": str(tmp_path / "pipx"),
        "PIPX_BIN_DIR": str(tmp_path / "bin"),
        "PYTHONPATH": "",
    }
    _run([str(tmp_path / "tools/bin/pipx"), "install", str(wheel)], env=env)
    padres = str(tmp_path / "bin/padres")
    version = re.search(r"padres-([^-]+)-", wheel.name)
    assert version is not None
    assert _run([padres, "--version"], env=env).stdout.strip() == f"padres {version.group(1)}"

    broker = subprocess.Popen(
        [padres, "broker", "--id", "P1", "--port", "0", "--quiet"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        assert broker.stdout is not None
        listening = re.search(r"listening on (ws://\S+)", broker.stdout.readline())
        assert listening is not None
        url = listening.group(1)
        sub = subprocess.Popen(
            [padres, "sub", "--broker", url, "--count", "1", "--timeout", "30", "[class,eq,'T']"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tmp_path,
        )
        assert sub.stderr is not None
        assert "subscribed" in sub.stderr.readline()
        _run([padres, "pub", "--broker", url, "[class,'T'],[v,1]"], env=env, cwd=tmp_path)
        out, _ = sub.communicate(timeout=60)
        assert "[class,'T'],[v,1]" in out
    finally:
        broker.terminate()
        broker.wait(10)
        if broker.stdout is not None:
            broker.stdout.close()
