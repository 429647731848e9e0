"""``padres archive``: load historic publications into a Parquet archive with Spark, query it,
and offer it to the brokers for replay (see ``docs/archives.md``). The ``padres.commands``
entry point loads this module to list the command (``padres --help``): what a command needs
beyond its arguments is imported when it runs."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from padres.cli.addresses import DEFAULT_BROKER
from padres.cli.credentials import add_credential_options, credentials
from padres.cli.figures import data_and_json, show
from padres.cli.logs import add_log_options
from padres.errors import CommandError, InvalidMessage, ParseError
from spark.errors import AlreadyLoaded
from spark.session import DEFAULT_LOG, LOG_LEVELS

if TYPE_CHECKING:
    from spark.archive import Archive


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--archive", required=True, type=Path, metavar="DIR", help="archive directory")
    p.add_argument(
        "--catalog", metavar="URL", help="catalog database URL (default: SQLite in the archive)"
    )


def _master(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--master", default="local[2]", metavar="URL", help="Spark master (default local[2])"
    )
    p.add_argument(
        "--spark-log",
        choices=LOG_LEVELS,
        default=DEFAULT_LOG,
        metavar="LEVEL",
        help=f"show Spark's log lines from LEVEL up: {', '.join(LOG_LEVELS)} (default error)",
    )


def _loading(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--replace",
        action="store_true",
        help="replace the earlier loads that hold these inputs or publications (else refused)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines on standard error")


def register(commands: Any) -> None:
    p = commands.add_parser("archive", help="historic publications in Parquet, loaded by Spark")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    ld = verbs.add_parser("load", help="load publications into the archive (a Spark job)")
    ld.add_argument("inputs", nargs="+", metavar="INPUT", help="files, or directories of them")
    _common(ld)
    _master(ld)
    ld.add_argument("--format", choices=["text", "json"], default="text", help="input format")
    ld.add_argument("--time-attribute", metavar="NAME", help="attribute holding the time")
    ld.add_argument(
        "--time-format", metavar="FORMAT", help="strptime format of that attribute (default ISO)"
    )
    ld.add_argument(
        "--period", choices=["year", "month", "day"], default="month", help="time per directory"
    )
    ld.add_argument("--publisher", default="", help="publisher id of text publications")
    _loading(ld)
    ld.set_defaults(run=run_load)

    q = verbs.add_parser("query", help="publications matching a filter, in time order")
    q.add_argument("filter", metavar="FILTER", help="[class,eq,'STOCK'],...,[time,<,'2000-01-01']")
    _common(q)
    _master(q)
    where = q.add_mutually_exclusive_group()
    where.add_argument("--local", action="store_true", help="read with pyarrow here, without Spark")
    where.add_argument(
        "--spark",
        action="store_true",
        help="run a Spark job (default: when the files to read hold over 2,000,000 rows)",
    )
    q.add_argument(
        "--full-scan", action="store_true", help="read every row of every file of the class"
    )
    q.add_argument("--json", action="store_true", help="print JSON wire messages")
    q.add_argument("--count", action="store_true", help="print only how many")
    q.set_defaults(run=run_query)

    ls = verbs.add_parser("files", help="the catalog: classes, loads and files")
    _common(ls)
    ls.set_defaults(run=run_files)

    rm = verbs.add_parser("remove", help="remove loads: their files and catalog entries")
    rm.add_argument("loads", nargs="+", metavar="LOAD", help="load id, as archive files lists it")
    _common(rm)
    rm.set_defaults(run=run_remove)

    mv = verbs.add_parser("move", help="move a database node's old history into the archive")
    mv.add_argument("--url", required=True, help="the database node's store (SQLAlchemy URL)")
    mv.add_argument("--before", required=True, metavar="TIME", help="move what is older: ISO time")
    _common(mv)
    _master(mv)
    mv.add_argument(
        "--period", choices=["year", "month", "day"], default="month", help="time per directory"
    )
    _loading(mv)
    mv.set_defaults(run=run_move)

    c = verbs.add_parser("cluster", help="a standalone Spark master and workers on loopback")
    c.add_argument("--workers", type=int, default=1, help="how many workers (default 1)")
    c.add_argument("--cores", type=int, default=1, help="cores per worker (default 1)")
    c.add_argument("--memory", default="1g", help="memory per worker (default 1g)")
    c.add_argument("--work", type=Path, default=Path("spark-work"), help="work directory")
    c.set_defaults(run=run_cluster)

    s = verbs.add_parser("serve", help="offer the archive to a broker for historic subscriptions")
    s.add_argument("--id", required=True, help="the node's client name")
    s.add_argument("--broker", default=DEFAULT_BROKER, metavar="URL", help="broker URL")
    _common(s)
    add_log_options(s)
    add_credential_options(s, "the node")
    s.set_defaults(run=run_serve)


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _quiet(_line: str) -> None:
    pass


def _refused(exc: AlreadyLoaded) -> CommandError:
    those, them = ("that load", "it") if len(exc.loads) == 1 else ("those loads", "them")
    return CommandError(
        f"{exc}. Give --replace to replace {those} with this one, or remove {them} first: "
        f"padres archive remove {' '.join(exc.loads)}"
    )


def run_load(args: argparse.Namespace) -> int:
    from spark.inputs import Format, Period, Reading
    from spark.load import load

    if args.time_format and not args.time_attribute:
        raise CommandError("--time-format needs --time-attribute")
    reading = Reading(
        Format(args.format),
        args.time_attribute,
        args.time_format,
        args.publisher,
        Period(args.period),
    )
    try:
        report = load(
            args.inputs,
            args.archive,
            reading,
            catalog_url=args.catalog,
            master=args.master,
            progress=_quiet if args.quiet else _progress,
            replace=args.replace,
            spark_log=args.spark_log,
        )
    except AlreadyLoaded as exc:
        raise _refused(exc) from None
    classes = ", ".join(f"{c} {n:,}" for c, n in sorted(report.classes.items()))
    replaced = "".join(f"; replaced load {r.load}" for r in report.replaced)
    print(
        f"loaded {report.rows:,} publications ({classes}) into {report.files} files "
        f"in {report.seconds:.1f} s (load {report.load}{replaced})"
    )
    return 0


@contextlib.contextmanager
def _existing(args: argparse.Namespace) -> Iterator[Archive]:
    """The archive ``--archive`` names, which must exist already; closed afterwards."""
    from spark.archive import Archive

    if not args.archive.is_dir():
        raise CommandError(f"--archive: {args.archive} is not a directory")
    archive = Archive(args.archive, args.catalog)
    try:
        yield archive
    finally:
        archive.close()


def run_query(args: argparse.Namespace) -> int:
    from padres.language.parser import parse_filter
    from padres.model.codec import encode
    from padres.model.printer import format_message
    from padres.model.times import format_time
    from spark.archive import LOCAL_ROWS
    from spark.query import spark_query

    try:
        flt = parse_filter(args.filter)
    except ParseError as exc:
        raise CommandError(f"FILTER: {exc}") from None
    with _existing(args) as archive:
        plan = archive.plan(flt)
        files = archive.files(flt.class_name) if args.full_scan else plan.read
        local = args.local or (not args.spark and sum(f.rows for f in files) <= LOCAL_ROWS)
        if local:
            pubs = archive.full_scan(flt) if args.full_scan else archive.query(flt, plan)
            read, of = len(files), plan.of
        else:
            result = spark_query(
                archive,
                flt,
                master=args.master,
                prune=not args.full_scan,
                spark_log=args.spark_log,
            )
            pubs, read, of = result.publications, result.files_read, result.files
    by = "pyarrow" if local else "Spark"
    _progress(f"{len(pubs):,} matches; read {read} of the class's {of} files with {by}")
    if args.count:
        print(len(pubs))
        return 0
    out = sys.stdout
    for pub in pubs:
        if args.json:
            out.write(encode(pub).decode() + "\n")
        else:
            out.write(f"{format_message(pub)},[time,'{format_time(pub.timestamp)}']\n")
    return 0


def run_files(args: argparse.Namespace) -> int:
    from padres.model.times import format_time
    from spark.progress import size

    with _existing(args) as archive:
        for held in archive.classes():
            print(
                f"{held.class_name}: {held.rows:,} publications in {held.files} files, "
                f"{format_time(held.start)} to {format_time(held.end)}"
            )
        for f in archive.files():
            print(f"  {f.path}  {f.rows:,} rows  {format_time(f.start)} .. {format_time(f.end)}")
        for record in archive.loads():
            when = (
                format_time(record.at.replace(microsecond=0))
                if record.at is not None
                else "(inputs not recorded)"
            )
            print(f"load {record.load}  {when}  {record.rows:,} rows in {record.files} files")
            for i in record.inputs:
                print(
                    f"  input {i.path}  {size(i.size)}  "
                    f"modified {format_time(i.modified.replace(microsecond=0))}  "
                    f"sha256 {i.sha256[:16]}"
                )
    return 0


def run_remove(args: argparse.Namespace) -> int:
    with _existing(args) as archive:
        known = {record.load for record in archive.loads()}
        unknown = [load for load in args.loads if load not in known]
        if unknown:
            raise CommandError(
                f"the archive {archive.root} holds no load {', '.join(unknown)} "
                "(padres archive files lists its loads); nothing removed"
            )
        for load in dict.fromkeys(args.loads):
            record, paths = archive.remove(load)
            print(f"removed load {load}: {record.rows:,} rows in {len(paths)} files")
    return 0


def run_move(args: argparse.Namespace) -> int:
    from padres.model.times import format_time, parse_time
    from spark.inputs import Period
    from spark.move import move

    try:
        before = parse_time(args.before)
    except InvalidMessage as exc:
        raise CommandError(f"--before: {exc}") from None
    try:
        report = move(
            args.url,
            args.archive,
            before,
            catalog_url=args.catalog,
            master=args.master,
            period=Period(args.period),
            progress=_quiet if args.quiet else _progress,
            replace=args.replace,
            spark_log=args.spark_log,
        )
    except AlreadyLoaded as exc:
        raise _refused(exc) from None
    print(f"moved {report.exported:,} publications older than {format_time(before)}")
    return 0


def run_cluster(args: argparse.Namespace) -> int:
    from spark.cluster import LocalCluster

    cluster = LocalCluster(args.work, args.workers, args.cores, args.memory)
    stop = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    try:
        print(f"master {cluster.start()}; Ctrl-C stops it", flush=True)
        signal.sigwait(stop)
    finally:
        cluster.stop()
    return 0


def run_serve(args: argparse.Namespace) -> int:
    from padres.cli.nodes import run_node

    return run_node(
        _serve(args), quiet=args.quiet, log="padres.archive", log_format=args.log_format
    )


async def _serve(args: argparse.Namespace) -> int:
    import asyncio

    from padres.cli.nodes import attach, until_stopped
    from spark.archive import Archive
    from spark.node import ArchiveNode

    if not args.archive.is_dir():
        raise CommandError(f"--archive: {args.archive} is not a directory")
    async with contextlib.AsyncExitStack() as stack:
        archive = Archive(args.archive, args.catalog)
        stack.callback(archive.close)
        client = await attach(stack, args.broker, args.id, credentials(args))
        node = ArchiveNode(args.id, client, archive)
        stack.push_async_callback(node.stop)
        await node.start()
        watching = asyncio.get_running_loop().create_task(node.watch())
        stack.callback(watching.cancel)
        await until_stopped()
    return 0


def register_benchmarks(benches: Any) -> None:
    ar = benches.add_parser(
        "archive", help="Parquet archive: load times, a pruned query against a full scan"
    )
    ar.add_argument(
        "--count", type=int, default=10_000_000, help="synthetic publications to load (0: none)"
    )
    ar.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    ar.add_argument("--repeat", type=int, default=3, help="runs per query figure (the median)")
    data_and_json(ar)
    ar.set_defaults(run=run_archive_bench)


def run_archive_bench(args: argparse.Namespace) -> int:
    from spark import bench  # imports pyspark, which takes seconds: only when asked for

    result = bench.run(
        args.count,
        args.master,
        args.data,
        args.repeat,
        progress=_progress,
    )
    show(args, result, bench.report)
    return 0 if result["quotes_exact"] and result.get("query_exact", True) else 1
