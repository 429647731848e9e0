"""The Python examples of the documentation run as written."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

from padres.testing.processes import BrokerProcess

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ["README.md", "docs/rete.md", "docs/historic.md", "docs/transactions.md"]


def _examples() -> list[tuple[str, str]]:
    found = []
    for name in DOCUMENTS:
        text = (ROOT / name).read_text(encoding="utf-8")
        if name == "README.md":  # the quickstart runs against its own brokers: test_quickstart
            text = re.sub(r"## Quickstart\n.*?\n(?=## )", "", text, flags=re.DOTALL)
        for i, block in enumerate(re.findall(r"```python\n(.*?)```", text, re.DOTALL)):
            found.append((f"{name}#{i}", block))
    return found


EXAMPLE_BROKER = "ws://127.0.0.1:8001"


def _promised(code: str) -> list[str]:
    """What the example says it prints: ``print(...)  # output`` and a final ``# output`` line."""
    lines = code.rstrip().splitlines()
    out = [m.group(1) for m in re.finditer(r"print\(.*\)\s+# (.*)", code)]
    if lines and lines[-1].startswith("# "):
        out.append(lines[-1][2:])
    return out


@pytest.mark.parametrize(("where", "code"), _examples(), ids=[w for w, _ in _examples()])
def test_example_runs(
    where: str,
    code: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # files an example writes land here
    broker = None
    if EXAMPLE_BROKER in code:  # the example talks to a broker: start a real one for it
        broker = BrokerProcess("B1")
        code = code.replace(EXAMPLE_BROKER, broker.start())
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        if broker is not None:
            broker.stop()
    printed = capsys.readouterr().out
    for promise in _promised(code):
        if promise.startswith(("{", "(")):  # printed values, not prose
            assert promise in printed, f"{where}: expected {promise!r} in {printed!r}"
