"""``padres db``, a database-client node attached to a broker (see ``historic.node``);
``padres db rule add|list|remove``, the rules that publish a table's changes through its
outbox (``historic.rules``); and the benchmarks of the historic path (``padres bench
history|replay|peers``). They reach the command line through the ``padres.commands`` and
``padres.benchmarks`` entry points, which load this module to list the commands (``padres
--help``): what a command needs beyond its arguments is imported when it runs."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

import orjson

from padres.cli.addresses import DEFAULT_BROKER
from padres.cli.credentials import add_credential_options, credentials
from padres.cli.detach import add_detach_option, announce
from padres.cli.figures import data_and_json, show
from padres.cli.inputs import positive
from padres.cli.logs import add_log_options
from padres.cli.settings import add_settings_options
from padres.errors import CommandError, InvalidMessage, ParseError
from padres.runtime import collector


def register(commands: Any) -> None:
    p = commands.add_parser("db", help="run a database node that stores what DB_CONTROL asks")
    p.add_argument(
        "--id", help="the database's id, as DB_CONTROL addresses it (needed to run the node)"
    )
    p.add_argument(
        "--broker",
        action="append",
        metavar="URL",
        help=f"broker URL, ws://host:port (default {DEFAULT_BROKER}); the node reconnects to it. "
        "Give several brokers of one overlay to fail over between them: the node's durable "
        "subscriptions move with it",
    )
    p.add_argument(
        "--url", help="SQLAlchemy database URL (default: sqlite:///<id>.sqlite, a local file)"
    )
    p.add_argument(
        "--store",
        action="append",
        default=[],
        metavar="SPEC",
        help="store (and offer to replay) what this filter matches from the start; repeatable",
    )
    p.add_argument(
        "--execute",
        action="append",
        default=[],
        metavar="SUBSCRIPTION",
        help="an internal subscription: run a SQL statement in the database for each "
        "publication a filter matches, exactly once, its attributes as parameters: "
        '"NAME ON FILTER [PRIORITY N] [SCOPE local|global] EXECUTE STATEMENT" '
        "(or EXECUTE FUNCTION f(attribute, ...)); repeatable. A statement that fails sends "
        "the publication to the subscription's exception queue. Needs one --broker",
    )
    p.add_argument(
        "--tls-ca",
        metavar="FILE",
        help="for a wss:// broker: PEM file of the CA certificates its certificate is checked "
        "against (default: the system's trusted authorities)",
    )
    add_log_options(p)
    add_detach_option(p, "it is attached to its broker and stores", log="{id}.log")
    add_credential_options(p, "the node")
    add_settings_options(p, "PADRES_DB_")
    p.set_defaults(run=run)
    _register_rules(
        p.add_subparsers(
            dest="db_command",
            title="rules",
            metavar="rule",
            description="padres db rule add|list|remove NAME --url URL ...: the rules that "
            "publish a table's changes (no node is run)",
        )
    )


def run(args: argparse.Namespace) -> int:
    from padres.cli.nodes import run_node

    if args.id is None:
        raise CommandError("--id is needed to run a database node")
    # The client's losses and reconnections matter to a database: logged even when quiet.
    return run_node(
        _serve(args), quiet=args.quiet, log="padres.client.connection", log_format=args.log_format
    )


async def _serve(args: argparse.Namespace) -> int:
    from historic.internal import distinct, parse_internal
    from historic.node import DatabaseNode  # imports SQLAlchemy: only when the command runs
    from historic.store import Store
    from padres.cli.nodes import attach, until_stopped
    from padres.language.parser import parse_filter
    from padres.model.printer import format_filter

    brokers = args.broker or [DEFAULT_BROKER]
    try:
        specs = [format_filter(parse_filter(spec)) for spec in args.store]
    except ParseError as exc:
        raise CommandError(f"--store: {exc}") from None
    try:
        internal = distinct([parse_internal(text) for text in args.execute])
    except InvalidMessage as exc:
        raise CommandError(f"--execute: {exc}") from None
    if internal and len(brokers) > 1:
        raise CommandError("--execute: internal subscriptions live at one broker: one --broker")
    async with contextlib.AsyncExitStack() as stack:
        store = Store(args.url or f"sqlite:///{args.id}.sqlite")
        stack.callback(store.close)
        client = await attach(stack, brokers, args.id, credentials(args), args.tls_ca)
        node = DatabaseNode(args.id, client, store, internal=internal)
        stack.push_async_callback(node.stop)
        await node.start()
        for spec in specs:
            await node.store_spec(spec)
        collector.freeze()
        attached = f"database {args.id} attached to {client.broker}, storing into {store.url}"
        print(attached, flush=True)
        announce(attached)
        await until_stopped()
    return 0


def _register_rules(commands: Any) -> None:
    r = commands.add_parser(
        "rule",
        help="add, list or remove the rules that publish a table's changes",
        description="Rules install database triggers that write a publication for each change "
        "of a table into its database's outbox, in the changing transaction; the outbox's relay "
        "(historic.outbox.OutboxRelay) publishes what commits, exactly once, in commit order.",
    )
    actions = r.add_subparsers(dest="rule_command", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="install a rule: publish a table's changes")
    add.add_argument("name", help="the rule's name: lower-case letters, digits and _")
    add.add_argument("--table", required=True, help="the table whose changes are published")
    add.add_argument("--class", dest="class_name", required=True, help="the publications' class")
    add.add_argument(
        "--on",
        default="insert,update,delete",
        help="the changes published, separated by commas (default insert,update,delete)",
    )
    add.add_argument(
        "--columns",
        help="the columns published, separated by commas (default: every column the table has now)",
    )
    add.add_argument(
        "--where",
        metavar="CONDITION",
        help="publish only the changes whose row meets this condition, predicates of the "
        "language over the columns: \"[price,>,100],[old.price,<=,100],[op,eq,'update']\"",
    )
    add.add_argument(
        "--old-prefix",
        metavar="PREFIX",
        help="of an update, publish the values before it too, under this prefix (old_)",
    )
    lst = actions.add_parser("list", help="list the rules, with their advertisements")
    lst.add_argument("--json", action="store_true", help="print the rules as JSON")
    remove = actions.add_parser("remove", help="remove a rule and its triggers")
    remove.add_argument("name")
    for action in (add, lst, remove):
        action.add_argument(
            "--url",
            default=argparse.SUPPRESS,  # or given to padres db, or PADRES_DB_URL
            help="SQLAlchemy URL of the application's database (PostgreSQL or SQLite)",
        )
        action.add_argument(
            "--outbox",
            default="padres_outbox",
            metavar="TABLE",
            help="the outbox table the rules write to (default padres_outbox)",
        )
        action.set_defaults(run=run_rule)


def run_rule(args: argparse.Namespace) -> int:
    from historic.outbox import TransactionalOutbox  # imports SQLAlchemy: only when it runs
    from historic.rules import Rule, Rules

    if not getattr(args, "url", None):
        raise CommandError("--url is needed: the SQLAlchemy URL of the application's database")
    outbox = TransactionalOutbox(args.url, table=args.outbox)
    rules = Rules(outbox)
    try:
        match args.rule_command:
            case "add":
                rule = rules.add(
                    Rule(
                        args.name,
                        table=args.table,
                        class_name=args.class_name,
                        on=_words(args.on),
                        columns=None if args.columns is None else _words(args.columns),
                        where=args.where,
                        old_prefix=args.old_prefix,
                    )
                )
                print(f"rule {rule.name}: {_described(rule)}")
                print(f"advertise: {rule.advertisement()}")
            case "list":
                _print_rules(rules.installed(), rules.problems(), as_json=args.json)
            case _:
                rules.remove(args.name)
                print(f"rule {args.name} removed")
    finally:
        outbox.engine.dispose()
    return 0


def _words(text: str) -> tuple[str, ...]:
    return tuple(word.strip() for word in text.split(",") if word.strip())


def _described(rule: Any) -> str:
    where = f" where {rule.where}" if rule.where else ""
    old = f", old values as {rule.old_prefix}*" if rule.old_prefix else ""
    columns = ", ".join(rule.columns) or "no columns"
    return (
        f"{', '.join(rule.on)} on {rule.table}{where} publish class {rule.class_name!r} "
        f"with {columns}{old}"
    )


def _print_rules(rules: list[Any], problems: dict[str, str], *, as_json: bool) -> None:
    if as_json:
        listed = [
            {
                "name": rule.name,
                "table": rule.table,
                "class": rule.class_name,
                "on": list(rule.on),
                "columns": list(rule.columns or ()),
                "where": rule.where,
                "old_prefix": rule.old_prefix,
                "advertisement": rule.advertisement(),
                "problem": problems.get(rule.name),
            }
            for rule in rules
        ]
        print(orjson.dumps(listed).decode())
        return
    for rule in rules:
        print(f"{rule.name}: {_described(rule)}")
        print(f"  advertise: {rule.advertisement()}")
        if rule.name in problems:
            print(f"  warning: {problems[rule.name]}")
    print(f"{len(rules)} rule{'' if len(rules) == 1 else 's'}", file=sys.stderr)


def register_benchmarks(benches: Any) -> None:
    h = benches.add_parser("history", help="historic store: ingest rate and a 1%% query")
    h.add_argument("--count", type=int, default=1_000_000, help="publications to store")
    h.add_argument("--url", help="database URL (default: a fresh SQLite file)")
    h.add_argument(
        "--batch",
        type=int,
        default=10_000,
        help="publications per commit (a database node's commits grow from 500 to 10,000)",
    )
    data_and_json(h)
    h.set_defaults(run=run_history_bench)
    r = benches.add_parser(
        "replay", help="historic path: a database node's ingest and a 1%% replay via a broker"
    )
    r.add_argument("--count", type=int, default=1_000_000, help="publications to store")
    r.add_argument("--rate", type=float, default=100_000, help="publishing rate cap, per second")
    r.add_argument("--url", help="the database node's URL (default: a fresh SQLite file)")
    r.add_argument(
        "--peer",
        choices=["jetstream"],
        help="also measure NATS JetStream in the same run: the query in turns (medians and "
        "their ratio), the ingest with each side's durability promise",
    )
    r.add_argument(
        "--rounds", type=positive(int), default=10, help="with --peer: rounds of the query"
    )
    r.add_argument(
        "--synced-count",
        type=positive(int),
        default=20_000,
        help="with --peer: publications for JetStream's acknowledged ingest, synced each write "
        "and not (default 20,000)",
    )
    r.add_argument(
        "--nats-server",
        default="nats-server",
        metavar="PATH",
        help="with --peer: the nats-server executable (2.10 or later to sync each write)",
    )
    data_and_json(r)
    r.set_defaults(run=run_replay_bench)
    e = benches.add_parser(
        "peers", help="the live and historic workloads through NATS and JetStream, and here"
    )
    e.add_argument("--subs", type=int, default=10_000)
    e.add_argument("--pubs", type=int, default=50_000, help="publications for the throughput run")
    e.add_argument("--rate", type=float, default=5_000, help="publications per second, latency run")
    e.add_argument("--seconds", type=float, default=5.0, help="length of the latency run")
    e.add_argument("--count", type=int, default=1_000_000, help="publications stored, history")
    e.add_argument("--repeat", type=int, default=3, help="runs per figure (the median is shown)")
    e.add_argument(
        "--live",
        default="chain,apart,weak,cluster,strong,framed",
        help="the live setups to run, alternating, by short name (default: all of them)",
    )
    e.add_argument("--no-history", action="store_true", help="skip the historic side")
    e.add_argument(
        "--compress",
        action="store_true",
        help="padres' subscriber clients offer compression (permessage-deflate), which the "
        "brokers accept",
    )
    data_and_json(e)
    e.set_defaults(run=run_peers_bench)
    i = benches.add_parser(
        "inbox", help="consuming into a database: atomic consumption against ack after commit"
    )
    i.add_argument("--count", type=int, default=20_000, help="guaranteed publications consumed")
    i.add_argument("--url", help="the consumer's database URL (default: a fresh SQLite file)")
    i.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    i.set_defaults(run=run_inbox_bench)


def run_inbox_bench(args: argparse.Namespace) -> int:
    from historic.bench import inbox

    result = inbox.run(args.count, args.url)
    show(args, result, inbox.report)
    return 0 if result["atomic_once_in_order"] and result["plain_once_in_order"] else 1


def run_history_bench(args: argparse.Namespace) -> int:
    from historic.bench import history

    result = history.run(args.count, args.url, args.data, args.batch)
    show(args, result, history.report)
    return 0 if result["query_rows"] == result["query_expected"] else 1


def run_replay_bench(args: argparse.Namespace) -> int:
    if args.peer is not None:
        from historic.bench import jetstream

        compared = jetstream.run(
            args.count,
            args.rate,
            args.data,
            args.url,
            args.rounds,
            args.synced_count,
            args.nats_server,
        )
        show(args, compared, jetstream.report)
        expected = compared["query_expected"]
        sides = [compared["padres"], compared["JetStream"] or {"rows": []}]
        return 0 if all(n == expected for side in sides for n in side["rows"]) else 1
    from historic.bench import replay

    result = replay.run(args.count, args.rate, args.data, args.url)
    show(args, result, replay.report)
    return 0 if result["query_rows"] == result["query_expected"] else 1


def run_peers_bench(args: argparse.Namespace) -> int:
    from historic.bench import peers  # needs nats-py, a development dependency

    setups = [name.strip() for name in args.live.split(",") if name.strip()]
    try:
        result = peers.run(
            args.subs,
            args.pubs,
            args.rate,
            args.seconds,
            args.count,
            args.repeat,
            args.data,
            setups=setups,
            history=not args.no_history,
            compress=args.compress,
        )
    except ValueError as exc:
        print(f"padres bench peers: {exc}", file=sys.stderr)
        return 2
    show(args, result, peers.report)
    return 0
