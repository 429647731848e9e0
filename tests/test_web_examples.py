"""The README's ``curl`` examples of the web API run as written, against a real broker and
database, and print what the README says they print.

Each ``bash`` block's lines that begin with ``# `` show what the commands before them print;
``…`` stands for anything. The blocks run in order, in one shell.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from padres.testing.processes import BrokerProcess, DatabaseProcess

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = "127.0.0.1:8001"


def _blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```bash\n(.*?)```", text, re.DOTALL)


def _promised(script: str) -> list[re.Pattern[str]]:
    """What the script says it prints, in order."""
    return [
        re.compile(".*?".join(re.escape(part) for part in line[2:].split("…")))
        for line in script.splitlines()
        if line.startswith("# ")
    ]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_readme_curl_examples_run(tmp_path: Path) -> None:
    script = "\n".join(_blocks())
    assert "curl" in script and _promised(script)
    broker = BrokerProcess("B1")
    url = broker.start()
    database = DatabaseProcess(
        "DB1", url, f"sqlite:///{tmp_path / 'db1.sqlite'}", stores=["[class,eq,'STOCK']"]
    )
    try:
        database.start()
        base = f"http://127.0.0.1:{broker.port}"
        deadline = time.monotonic() + 15
        while not httpx.get(f"{base}/api/v1/databases").json():
            assert time.monotonic() < deadline, "the database's offer did not arrive"
            time.sleep(0.1)
        run = subprocess.run(
            ["bash"],
            input=script.replace(EXAMPLE, f"127.0.0.1:{broker.port}"),
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=60,
        )
    finally:
        database.stop()
        broker.stop()
    printed = run.stdout
    at = 0
    for promise in _promised(script):
        found = promise.search(printed, at)
        assert found, f"expected {promise.pattern!r} after {printed[at:][:300]!r}"
        at = found.end()
