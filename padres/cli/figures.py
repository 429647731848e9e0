"""What the benchmark commands share, this package's and those of the packages above it
(``padres.benchmarks``): the ``--data`` and ``--json`` options, and printing the figures."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

__all__ = ["data_and_json", "show"]


def show(args: argparse.Namespace, result: dict[str, Any], report: Callable[..., str]) -> None:
    """The figures as one JSON object with ``--json``, else as the benchmark's report."""
    print(orjson.dumps(result).decode() if args.json else report(result))


def data_and_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data", type=Path, help="stock quotes (default: the full set, else the sample)"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
