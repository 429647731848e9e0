"""``pip install padres`` without extras: the broker, its WebSocket endpoint and /health, the
client and the command line work, and what needs an extra says which to install."""

from __future__ import annotations

import json
import subprocess
import sys


def test_the_core_runs_without_the_optional_packages() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.lean_child"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["delivered"] == [1, 2]
    assert result["health"] == 200
    assert result["api"] == 404  # the web API comes with padres[web]
    assert result["db_exit"] == 1
    assert "padres[history]" in result["db_error"] and "sqlalchemy" in result["db_error"]
    assert result["loaded"] == []
