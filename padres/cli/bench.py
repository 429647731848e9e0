"""``padres bench ...``: benchmark commands."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import orjson

from padres.bench import parse


def register(commands: Any) -> None:
    p = commands.add_parser("bench", help="run a benchmark and print its figures")
    benches = p.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    b = benches.add_parser("parse", help="PADRES text parse speed on the real stock quotes")
    b.add_argument(
        "--data", type=Path, help="quote file or directory (default: the full set, else the sample)"
    )
    b.add_argument("--repeat", type=int, default=5)
    b.add_argument("--limit", type=int, help="use only the first N lines")
    b.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    b.set_defaults(run=run_parse)


def run_parse(args: argparse.Namespace) -> int:
    result = parse.run(args.data, args.repeat, args.limit)
    print(orjson.dumps(result).decode() if args.json else parse.report(result))
    return 0
