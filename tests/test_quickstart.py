"""The README's quickstart runs as written: its shell and Python blocks, in order, in one shell,
in an empty directory, with nothing added between the lines.

The one line not run is ``make demo``: it made the environment this test runs in, which is
the directory's ``.venv``. The quickstart's ports are moved to free ones. A ``# `` line after
commands is what they print (``…`` stands for anything); since detached subscribers print
when their deliveries come, each promise is looked for in the whole output.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from padres.testing.processes import free_ports

ROOT = Path(__file__).resolve().parent.parent
INSTALL = "make demo"


def _section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(r"## Quickstart\n(.*?)\n## ", text, re.DOTALL)
    assert found, "the README has no Quickstart section"
    return found.group(1)


def _script(section: str) -> tuple[str, list[re.Pattern[str]]]:
    """The quickstart as one shell script, and what it promises to print."""
    lines: list[str] = []
    promised: list[str] = []
    for language, code in re.findall(r"```(sh|python)\n(.*?)```", section, re.DOTALL):
        shown = [line[2:] for line in code.splitlines() if line.startswith("# ")]
        if language == "python":
            lines += ["python - <<'QUICKSTART'", code.rstrip(), "QUICKSTART"]
            promised += shown[-1:]  # a Python block's last comment is what it prints
            continue
        lines += [line for line in code.splitlines() if not line.startswith(INSTALL)]
        promised += shown
    patterns = [
        re.compile(".*?".join(re.escape(part) for part in line.split("…"))) for line in promised
    ]
    return "\n".join(lines) + "\n", patterns


def _stop(pids: set[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + 15
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="not running in a virtualenv")
def test_the_readme_quickstart_runs_as_written(tmp_path: Path) -> None:
    ports = dict(zip(("8001", "8002", "8003"), map(str, free_ports(3)), strict=True))
    section = re.sub(r"\b800[123]\b", lambda m: ports[m.group(0)], _section())
    script, promised = _script(section)
    assert "--detach" in script and "python -" in script and len(promised) >= 5
    (tmp_path / ".venv").symlink_to(sys.prefix)
    out = tmp_path / "output.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADRES_")}
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(sys.prefix)
    )
    try:
        with out.open("wb") as sink:
            run = subprocess.run(
                ["bash", "-e"],
                input=script.encode(),
                stdout=sink,
                stderr=subprocess.STDOUT,
                cwd=tmp_path,
                env=env,
                timeout=150,
            )
        printed = out.read_text()
        assert run.returncode == 0, printed
        deadline = time.monotonic() + 20  # a detached subscriber prints when it is delivered to
        missing = promised
        while missing and time.monotonic() < deadline:
            printed = out.read_text()
            missing = [p for p in promised if not p.search(printed)]
            time.sleep(0.1)
        assert not missing, f"not printed: {[p.pattern for p in missing]}\n{printed}"
    finally:
        if out.exists():  # what --detach started, by the process ids it printed
            _stop({int(p) for p in re.findall(r"\(pid (\d+)", out.read_text())})


def test_detach_says_when_what_it_started_ended_before_it_was_ready(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "padres.cli",
            "sub",
            "--broker",
            f"127.0.0.1:{port}",
            "--wait",
            "0.3",
            "--detach",
            "[class,eq,'A']",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert run.returncode == 1
    assert f"cannot connect to 127.0.0.1:{port}" in run.stderr  # the child's own reason
    assert "padres sub: it ended before it was ready (exit status 1)" in run.stderr
    assert run.stdout == ""
