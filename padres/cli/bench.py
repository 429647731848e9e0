"""``padres bench ...``: benchmark commands."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import orjson

from padres.bench import match, parse


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
    m = benches.add_parser("match", help="Rete engine against the naive scan")
    m.add_argument("--workload", choices=match.WORKLOADS, default="stock")
    m.add_argument("--subs", type=int, help="subscriptions (default: 200,000 / 1,000,000 / 10,000)")
    m.add_argument("--pubs", type=int, help="publications timed (default: 2,000 / 500 / 100,000)")
    m.add_argument("--seed", type=int, default=1)
    m.add_argument(
        "--data", type=Path, help="stock quotes (default: the full set, else the sample)"
    )
    m.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    m.set_defaults(run=run_match)


def run_parse(args: argparse.Namespace) -> int:
    result = parse.run(args.data, args.repeat, args.limit)
    print(orjson.dumps(result).decode() if args.json else parse.report(result))
    return 0


def run_match(args: argparse.Namespace) -> int:
    result = match.run(args.workload, args.subs, args.pubs, args.seed, args.data)
    print(orjson.dumps(result).decode() if args.json else match.report(result))
    return 0
