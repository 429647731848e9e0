"""``padres bench ...``: benchmark commands."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from padres.bench import fuzz, guaranteed, match, network, overlay, parse
from padres.broker import Covering


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
    b.add_argument("--profile", action="store_true", help="add a cProfile of the frame's decoding")
    b.set_defaults(run=run_parse)
    m = benches.add_parser("match", help="Rete engine against the naive scan")
    m.add_argument("--workload", choices=match.WORKLOADS, default="stock")
    m.add_argument("--subs", type=int, help="subscriptions (default: 200,000 / 1,000,000 / 10,000)")
    m.add_argument("--pubs", type=int, help="publications timed (default: 2,000 / 500 / 100,000)")
    m.add_argument("--seed", type=int, default=1)
    _data_and_json(m)
    m.set_defaults(run=run_match)
    o = benches.add_parser("overlay", help="simulated random cyclic overlay, checked by an oracle")
    o.add_argument("--brokers", type=int, default=1000)
    o.add_argument("--clients", type=int, default=2000)
    o.add_argument("--rounds", type=int, default=10)
    o.add_argument("--operations", type=int, default=500, help="operations per round")
    o.add_argument("--covering", choices=[c.value for c in Covering], default="lazy")
    o.add_argument("--seed", type=int, default=1)
    o.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    o.set_defaults(run=run_overlay)
    n = benches.add_parser("network", help="3-broker chain of real processes: rate and latency")
    n.add_argument("--subs", type=int, default=10_000)
    n.add_argument("--pubs", type=int, default=50_000, help="publications for the throughput run")
    n.add_argument("--rate", type=float, default=5_000, help="publications per second, latency run")
    n.add_argument("--seconds", type=float, default=5.0, help="length of the latency run")
    _data_and_json(n)
    n.set_defaults(run=run_network)
    g = benches.add_parser(
        "guaranteed", help="3-broker chain: guaranteed against plain delivery, recovery time"
    )
    g.add_argument("--count", type=int, default=20_000, help="publications per run")
    g.add_argument("--repeat", type=int, default=3, help="runs per figure (the median is shown)")
    g.add_argument("--rate", type=float, default=2_000, help="publications per second, recovery")
    g.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    g.set_defaults(run=run_guaranteed)
    h = benches.add_parser("history", help="historic store: ingest rate and a 1%% query")
    h.add_argument("--count", type=int, default=1_000_000, help="publications to store")
    h.add_argument("--url", help="database URL (default: a fresh SQLite file)")
    h.add_argument(
        "--batch",
        type=int,
        default=10_000,
        help="publications per commit (a database node's commits grow from 500 to 10,000)",
    )
    _data_and_json(h)
    h.set_defaults(run=run_history)
    r = benches.add_parser(
        "replay", help="historic path: a database node's ingest and a 1%% replay via a broker"
    )
    r.add_argument("--count", type=int, default=1_000_000, help="publications to store")
    r.add_argument("--rate", type=float, default=100_000, help="publishing rate cap, per second")
    r.add_argument("--url", help="the database node's URL (default: a fresh SQLite file)")
    _data_and_json(r)
    r.set_defaults(run=run_replay)
    ar = benches.add_parser(
        "archive", help="Parquet archive: load times, a pruned query against a full scan"
    )
    ar.add_argument(
        "--count", type=int, default=10_000_000, help="synthetic publications to load (0: none)"
    )
    ar.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    ar.add_argument("--repeat", type=int, default=3, help="runs per query figure (the median)")
    _data_and_json(ar)
    ar.set_defaults(run=run_archive)
    e = benches.add_parser(
        "peers", help="the live and historic workloads through NATS and JetStream, and here"
    )
    e.add_argument("--subs", type=int, default=10_000)
    e.add_argument("--pubs", type=int, default=50_000, help="publications for the throughput run")
    e.add_argument("--rate", type=float, default=5_000, help="publications per second, latency run")
    e.add_argument("--seconds", type=float, default=5.0, help="length of the latency run")
    e.add_argument("--count", type=int, default=1_000_000, help="publications stored, history")
    e.add_argument("--repeat", type=int, default=3, help="runs per figure (the median is shown)")
    _data_and_json(e)
    e.set_defaults(run=run_peers)
    f = benches.add_parser(
        "fuzz", help="a broker under bad frames from one connection, a client served beside it"
    )
    f.add_argument("--seconds", type=float, default=60.0, help="how long the fuzzer sends")
    f.add_argument("--seed", type=int, default=1)
    f.add_argument("--broker", metavar="URL", help="fuzz this broker (default: start one)")
    f.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    f.set_defaults(run=run_fuzz)


def run_parse(args: argparse.Namespace) -> int:
    result = parse.run(args.data, args.repeat, args.limit, args.profile)
    _show(args, result, parse.report)
    return 0


def run_match(args: argparse.Namespace) -> int:
    result = match.run(args.workload, args.subs, args.pubs, args.seed, args.data)
    _show(args, result, match.report)
    return 0


def run_overlay(args: argparse.Namespace) -> int:
    result = overlay.run(
        args.brokers,
        args.clients,
        args.rounds,
        args.operations,
        args.seed,
        Covering(args.covering),
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    _show(args, result, overlay.report)
    return 1 if result["violations"] else 0


def run_network(args: argparse.Namespace) -> int:
    result = network.run(args.subs, args.pubs, args.rate, args.seconds, args.data)
    _show(args, result, network.report)
    return 1 if result["duplicates"] else 0


def run_guaranteed(args: argparse.Namespace) -> int:
    result = guaranteed.run(args.count, args.repeat, args.rate)
    _show(args, result, guaranteed.report)
    return 0


def run_history(args: argparse.Namespace) -> int:
    from historic import bench as history  # the storage layer sits above the core package

    result = history.run(args.count, args.url, args.data, args.batch)
    _show(args, result, history.report)
    return 0 if result["query_rows"] == result["query_expected"] else 1


def run_archive(args: argparse.Namespace) -> int:
    from spark import bench as archive  # the archive sits above the core package

    result = archive.run(
        args.count,
        args.master,
        args.data,
        args.repeat,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    _show(args, result, archive.report)
    return 0 if result["quotes_exact"] and result.get("query_exact", True) else 1


def run_replay(args: argparse.Namespace) -> int:
    from historic import replay_bench  # the storage layer sits above the core package

    result = replay_bench.run(args.count, args.rate, args.data, args.url)
    _show(args, result, replay_bench.report)
    return 0 if result["query_rows"] == result["query_expected"] else 1


def run_peers(args: argparse.Namespace) -> int:
    from padres.bench import peers  # it drives the historic layer too

    result = peers.run(
        args.subs, args.pubs, args.rate, args.seconds, args.count, args.repeat, args.data
    )
    _show(args, result, peers.report)
    return 0


def run_fuzz(args: argparse.Namespace) -> int:
    result = fuzz.run(args.seconds, args.seed, args.broker)
    _show(args, result, fuzz.report)
    return 1 if result["violations"] else 0


def _show(args: argparse.Namespace, result: dict[str, Any], report: Callable[..., str]) -> None:
    """The figures as one JSON object with ``--json``, else as the benchmark's report."""
    print(orjson.dumps(result).decode() if args.json else report(result))


def _data_and_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data", type=Path, help="stock quotes (default: the full set, else the sample)"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
