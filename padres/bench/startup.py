"""``padres bench startup``: how long the command line takes to start, each case a new
interpreter running a command (or ``import padres``) to its end; the median wall and CPU time
(user and system) of ``repeat`` runs, and, as the baseline, the interpreter doing nothing.

With ``against``, the directory of another checkout (the commit before a change, say), each run
alternates with the same case run from there (``PYTHONPATH``, the same interpreter): the two
see the same load, which on a shared machine moves wall times by half between rounds."""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from padres.bench import machine
from padres.language.datasets import SAMPLE
from padres.testing.processes import BrokerProcess

LINES: Final = 20
"""Lines of the stock quotes sample ``padres parse`` reads."""
PUBLICATION: Final = "[class,'STOCK'],[symbol,'X'],[price,1.5]"


def _cases(quotes: Path, broker: str) -> dict[str, list[str]]:
    """Each case's command line, after the interpreter."""
    cli = ["-m", "padres.cli"]
    return {
        "padres --version": [*cli, "--version"],
        "padres --help": [*cli, "--help"],
        f"padres parse ({LINES} lines)": [*cli, "parse", str(quotes)],
        "padres sub --help": [*cli, "sub", "--help"],
        "padres pub (1 publication)": [*cli, "pub", "--broker", broker, PUBLICATION],
        "import padres": ["-c", "import padres"],
        "the interpreter alone": ["-c", "pass"],
    }


def _timed(argv: list[str], path: str) -> tuple[float, float]:
    """Wall and CPU seconds of one run of ``argv``, with ``path`` first on ``PYTHONPATH``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, env.get("PYTHONPATH")]))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, *argv],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=120,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu


def run(repeat: int, against: Path | None = None) -> dict[str, Any]:
    trees = {"this": str(Path(__file__).resolve().parents[2])}  # the checkout of this module
    if against is not None:
        trees["against"] = str(against.resolve())
    figures: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        quotes = Path(scratch) / "quotes.txt"
        lines = SAMPLE.read_text(encoding="utf-8").splitlines()[:LINES]
        quotes.write_text("\n".join(lines) + "\n", encoding="utf-8")
        broker = BrokerProcess("B1")
        url = broker.start()
        try:
            for case, argv in _cases(quotes, url).items():
                runs: dict[str, list[tuple[float, float]]] = {tree: [] for tree in trees}
                for _ in range(repeat):
                    for tree, path in trees.items():
                        runs[tree].append(_timed(argv, path))
                figures[case] = {
                    tree: {
                        "wall_ms": statistics.median(w for w, _ in times) * 1000,
                        "cpu_ms": statistics.median(c for _, c in times) * 1000,
                    }
                    for tree, times in runs.items()
                }
        finally:
            broker.stop()
    return {
        "repeat": repeat,
        "against": trees.get("against"),
        "cases": figures,
        "machine": machine(),
    }


def report(result: dict[str, Any]) -> str:
    against = result["against"]
    head = f"start-up: median of {result['repeat']} runs, milliseconds (wall, CPU)"
    lines = [head + (f"; against {against}" if against else "")]
    for case, trees in result["cases"].items():
        row = f"  {case:28}"
        for tree, figures in trees.items():
            name = "" if tree == "this" else f"  {tree}"
            row += f"{name} {figures['wall_ms']:7.0f} {figures['cpu_ms']:7.0f}"
        lines.append(row)
    return "\n".join(lines)
