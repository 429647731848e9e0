"""``padres bench ...``: benchmark commands."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points
from pathlib import Path

from padres.bench import (
    durable_composites,
    fuzz,
    guaranteed,
    hosted,
    match,
    network,
    overlay,
    parse,
    paths,
    startup,
)
from padres.bench.workloads import stock_publications
from padres.broker import Covering, Merging
from padres.broker.sqlite_journal import Sync
from padres.cli.figures import data_and_json, show
from padres.cli.inputs import positive
from padres.cli.plugins import plug_in
from padres.errors import CommandError


def arguments(p: argparse.ArgumentParser) -> None:
    """``padres bench``, with the benchmarks of this package and those that packages above it
    declare under the ``padres.benchmarks`` entry point (a function given the subparsers)."""
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
    data_and_json(m)
    m.set_defaults(run=run_match)
    o = benches.add_parser(
        "overlay", help="random cyclic overlay, simulated or of processes, checked by an oracle"
    )
    o.add_argument("--brokers", type=int, default=1000, help="broker cores simulated")
    o.add_argument(
        "--processes",
        type=positive(int),
        metavar="N",
        help="instead of simulating, run N broker processes, each on a test host of its own "
        "(a network namespace: needs root and iproute2; else on loopback, said in the report), "
        "with real clients",
    )
    o.add_argument(
        "--loopback",
        action="store_true",
        help="with --processes: every broker on this machine's loopback, no test hosts",
    )
    o.add_argument(
        "--clients", type=int, help="clients (default 2,000 simulated, 200 with --processes)"
    )
    o.add_argument("--rounds", type=int, default=10)
    o.add_argument(
        "--operations",
        type=int,
        help="operations per round (default 500 simulated, 100 with --processes)",
    )
    o.add_argument("--covering", choices=[c.value for c in Covering], default="lazy")
    o.add_argument(
        "--merging",
        choices=["off", "on", "both"],
        default="off",
        help="merge the subscriptions each broker forwards to a neighbour; both: run the same "
        "seed without and with, and print the figures side by side (simulated only)",
    )
    o.add_argument(
        "--merge-imperfect",
        type=float,
        default=0.0,
        metavar="RATE",
        help="with merging: also merge into more general filters whose estimated "
        "false-positive rate is at most RATE (default 0: perfect merging only)",
    )
    o.add_argument(
        "--workload",
        choices=["random", "stock"],
        default="random",
        help="random filters, or the real stock quotes (simulated only; default random)",
    )
    o.add_argument(
        "--data",
        type=Path,
        help="with --workload stock: the quotes (default: the full set, else the sample)",
    )
    o.add_argument(
        "--extra-links",
        type=float,
        default=0.5,
        metavar="SHARE",
        help="links beyond a random spanning tree, as a share of the brokers (default 0.5; "
        "0: no cycles, so every advertisement floods along the same tree in every run)",
    )
    o.add_argument("--seed", type=int, default=1)
    o.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    o.set_defaults(run=run_overlay)
    n = benches.add_parser("network", help="3-broker chain of real processes: rate and latency")
    n.add_argument("--subs", type=int, default=10_000)
    n.add_argument("--pubs", type=int, default=50_000, help="publications for the throughput run")
    n.add_argument("--rate", type=float, default=5_000, help="publications per second, latency run")
    n.add_argument("--seconds", type=float, default=5.0, help="length of the latency run")
    n.add_argument(
        "--apart",
        action="store_true",
        help="each subscriber client in a process of its own (default: all in this process, "
        "beside the publisher); the bytes they receive are then counted too",
    )
    n.add_argument(
        "--compress",
        action="store_true",
        help="the subscriber clients offer compression (permessage-deflate), which the "
        "brokers accept",
    )
    n.add_argument(
        "--compress-links",
        action="store_true",
        help="the brokers compress the links between them (--compress-links)",
    )
    data_and_json(n)
    n.set_defaults(run=run_network)
    h = benches.add_parser(
        "hop", help="one broker core of the chain (or a subscriber client): CPU per publication"
    )
    h.add_argument("--subs", type=int, default=10_000)
    h.add_argument("--pubs", type=int, default=20_000, help="publications a repetition")
    h.add_argument("--repeat", type=int, default=7, help="repetitions (best and median shown)")
    h.add_argument("--broker", choices=("B1", "B2", "B3"), default="B2", help="the core measured")
    h.add_argument(
        "--plain", action="store_true", help="one subscription per filter instead of groups"
    )
    h.add_argument(
        "--client",
        action="store_true",
        help="B2's subscriber client instead: CPU per delivery, its frames sent over a WebSocket",
    )
    h.add_argument(
        "--frame", type=int, default=150, help="notifications a frame to the client (--client)"
    )
    data_and_json(h)
    h.set_defaults(run=run_hop)
    g = benches.add_parser(
        "guaranteed", help="3-broker chain: guaranteed against plain delivery, recovery time"
    )
    g.add_argument("--count", type=int, default=20_000, help="publications per run")
    g.add_argument("--repeat", type=int, default=3, help="runs per figure (the median is shown)")
    g.add_argument("--rate", type=float, default=2_000, help="publications per second, recovery")
    g.add_argument(
        "--journal",
        metavar="URL",
        help="also measure with the brokers' journals in PostgreSQL at URL "
        "(postgresql://user@host/db)",
    )
    g.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    g.set_defaults(run=run_guaranteed)
    d = benches.add_parser(
        "durable-composite",
        help="one broker core: a composite subscription, plain and durable (its partial "
        "matches kept in the journal)",
    )
    d.add_argument("--count", type=int, default=5_000, help="publications per run")
    d.add_argument("--sync", choices=[s.value for s in Sync], default=Sync.FULL.value)
    d.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    d.set_defaults(run=run_durable_composite)
    f = benches.add_parser(
        "fuzz", help="a broker under bad frames from one connection, a client served beside it"
    )
    f.add_argument("--seconds", type=float, default=60.0, help="how long the fuzzer sends")
    f.add_argument("--seed", type=int, default=1)
    f.add_argument("--broker", metavar="URL", help="fuzz this broker (default: start one)")
    f.add_argument(
        "--slowed",
        action="store_true",
        help="start the broker with its default limit on refused messages: the fuzzer is "
        "slowed and disconnected, and dials again (default: the limit is lifted, so that "
        "every frame reaches the broker)",
    )
    f.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    f.set_defaults(run=run_fuzz)
    s = benches.add_parser("startup", help="how long the command line takes to start")
    s.add_argument("--repeat", type=positive(int), default=10, help="runs of each case")
    s.add_argument(
        "--against",
        type=Path,
        metavar="DIR",
        help="another checkout, its runs alternating with these: before and after a change",
    )
    s.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    s.set_defaults(run=run_startup)
    a = benches.add_parser(
        "paths",
        help="a cycle of four test hosts: a way slowed, a broker frozen, with and without "
        "adaptive paths",
    )
    a.add_argument(
        "--freeze", type=float, default=6.0, help="seconds the broker on the way stays frozen"
    )
    a.add_argument(
        "--no-baseline", action="store_true", help="only with adaptive paths (half the time)"
    )
    a.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    a.set_defaults(run=run_paths)
    for plugin in entry_points(group="padres.benchmarks"):
        plug_in(plugin, benches)


def run_parse(args: argparse.Namespace) -> int:
    result = parse.run(args.data, args.repeat, args.limit, args.profile)
    show(args, result, parse.report)
    return 0


def run_match(args: argparse.Namespace) -> int:
    result = match.run(args.workload, args.subs, args.pubs, args.seed, args.data)
    show(args, result, match.report)
    return 0


def run_overlay(args: argparse.Namespace) -> int:
    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if args.processes is not None:
        if args.merging != "off" or args.workload != "random":
            raise CommandError("--merging and --workload are for the simulated overlay only")
        result = hosted.run(
            args.processes,
            args.clients or 200,
            args.rounds,
            args.operations or 100,
            args.seed,
            Covering(args.covering),
            progress=progress,
            hosts=not args.loopback,
        )
        show(args, result, hosted.report)
        return 1 if result["violations"] else 0
    try:
        merging = Merging(args.merging != "off", args.merge_imperfect)
    except ValueError as exc:
        raise CommandError(f"--merge-imperfect: {exc}") from None
    quotes = stock_publications(args.data) if args.workload == "stock" else None
    runs = dict(
        brokers=args.brokers,
        clients=args.clients or 2000,
        rounds=args.rounds,
        operations=args.operations or 500,
        seed=args.seed,
        covering=Covering(args.covering),
        extra_links=args.extra_links,
        progress=progress,
        quotes=quotes,
    )
    if args.merging == "both":
        compared = overlay.compare(merging, **runs)
        show(args, compared, overlay.report_compared)
        return 1 if any(r["violations"] for r in compared.values()) else 0
    result = overlay.run(merging=merging, **runs)
    show(args, result, overlay.report)
    return 1 if result["violations"] else 0


def run_hop(args: argparse.Namespace) -> int:
    from padres.bench import hop, subscriber

    if args.client:
        if args.plain or args.broker != "B2":
            raise CommandError("--client measures B2's subscriber of groups: no --plain, --broker")
        found = subscriber.run(args.subs, args.pubs, args.repeat, args.frame, args.data)
        show(args, found, subscriber.report)
        return 0
    result = hop.run(args.subs, args.pubs, args.repeat, args.broker, args.plain, args.data)
    show(args, result, hop.report)
    return 0


def run_network(args: argparse.Namespace) -> int:
    result = network.run(
        args.subs,
        args.pubs,
        args.rate,
        args.seconds,
        args.data,
        apart=args.apart,
        compress=args.compress,
        compress_links=args.compress_links,
    )
    show(args, result, network.report)
    return 1 if result["duplicates"] else 0


def run_guaranteed(args: argparse.Namespace) -> int:
    result = guaranteed.run(args.count, args.repeat, args.rate, args.journal)
    show(args, result, guaranteed.report)
    return 0


def run_startup(args: argparse.Namespace) -> int:
    result = startup.run(args.repeat, args.against)
    show(args, result, startup.report)
    return 0


def run_durable_composite(args: argparse.Namespace) -> int:
    result = durable_composites.run(args.count, Sync(args.sync))
    show(args, result, durable_composites.report)
    return 0


def run_fuzz(args: argparse.Namespace) -> int:
    result = fuzz.run(args.seconds, args.seed, args.broker, slowed=args.slowed)
    show(args, result, fuzz.report)
    return 1 if result["violations"] else 0


def run_paths(args: argparse.Namespace) -> int:
    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    result = paths.run(args.freeze, not args.no_baseline, progress)
    show(args, result, paths.report)
    return 0
