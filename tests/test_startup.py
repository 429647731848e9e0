"""What starting ``padres`` loads: ``import padres`` and each command import what they use, not
the broker, NumPy (the Rete network), the WebSocket server or the optional packages."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from padres.language.datasets import SAMPLE

NEVER = (
    "numpy",
    "uvicorn",
    "padres.broker",
    "padres.runtime.node",
    "sqlalchemy",
    "pyspark",
    "fastapi",
)
"""Needed by none of the cases here: the broker, the Rete network's NumPy, the server, the
optional packages."""
CLIENT = ("websockets", "padres.client", "argon2")
"""The client and what only it needs: not for listing the commands nor for parsing."""

RUN = """
import contextlib, io, json, sys
from padres.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    main({argv!r})
"""


def _loaded(code: str) -> set[str]:
    """The modules ``code`` leaves loaded in a new interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", code + "\nprint(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return set(json.loads(done.stdout.splitlines()[-1]))


def _among(loaded: set[str], packages: tuple[str, ...]) -> list[str]:
    return sorted(m for m in loaded if m.split(".")[0] in packages or m.startswith(packages))


def test_import_padres_loads_nothing_but_itself_and_its_loader() -> None:
    loaded = _loaded("import json, sys, padres")
    assert _among(loaded, ("padres", "rete")) == ["padres", "rete", "rete.lazy"]


def test_the_client_loads_without_the_broker_or_numpy() -> None:
    loaded = _loaded("import json, sys, padres\npadres.Client")
    assert "padres.client.connection" in loaded
    assert _among(loaded, NEVER) == []


def test_the_message_model_loads_without_the_rete_network() -> None:
    loaded = _loaded("import json, sys, padres.language.parser, rete.conditions")
    assert "rete.network" not in loaded
    assert _among(loaded, NEVER) == []


@pytest.mark.parametrize(
    "argv",
    [["--version"], ["--help"], ["parse", str(SAMPLE)], ["db", "--help"]],
    ids=["version", "help", "parse", "db-help"],
)
def test_a_command_loads_neither_the_broker_nor_the_client(argv: list[str]) -> None:
    loaded = _loaded(RUN.format(argv=argv))
    assert _among(loaded, NEVER + CLIENT) == []


def test_a_client_command_loads_the_client_not_the_broker() -> None:
    loaded = _loaded(RUN.format(argv=["sub", "--help"]))
    assert "padres.cli.client" in loaded
    assert _among(loaded, NEVER) == []
