"""``padres db``: a database-client node attached to a broker (see ``historic.node``)."""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

from padres.cli.credentials import add_credential_options, credentials
from padres.cli.nodes import attach, run_node, until_stopped
from padres.errors import CommandError, ParseError
from padres.parser import parse_filter
from padres.printer import format_filter
from padres.runtime import collector

DEFAULT_BROKER = "ws://127.0.0.1:8001"


def register(commands: Any) -> None:
    p = commands.add_parser("db", help="run a database node that stores what DB_CONTROL asks")
    p.add_argument("--id", required=True, help="the database's id, as DB_CONTROL addresses it")
    p.add_argument(
        "--broker",
        action="append",
        metavar="URL",
        help=f"broker URL, ws://host:port (default {DEFAULT_BROKER}); the node reconnects to it",
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
        "--tls-ca",
        metavar="FILE",
        help="for a wss:// broker: PEM file of the CA certificates its certificate is checked "
        "against (default: the system's trusted authorities)",
    )
    p.add_argument("--quiet", action="store_true", help="log warnings only")
    add_credential_options(p, "the node")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    # The client's losses and reconnections matter to a database: logged even when quiet.
    return run_node(_serve(args), quiet=args.quiet, log="padres.client")


def _broker(args: argparse.Namespace) -> str:
    brokers = args.broker or [DEFAULT_BROKER]
    if len(brokers) > 1:
        raise CommandError(
            "--broker: a database node attaches to one broker (its durable subscriptions "
            "live there); give it once"
        )
    return str(brokers[0])


async def _serve(args: argparse.Namespace) -> int:
    from historic.node import DatabaseNode  # storage sits above the core package
    from historic.store import Store

    broker = _broker(args)
    try:
        specs = [format_filter(parse_filter(spec)) for spec in args.store]
    except ParseError as exc:
        raise CommandError(f"--store: {exc}") from None
    async with contextlib.AsyncExitStack() as stack:
        store = Store(args.url or f"sqlite:///{args.id}.sqlite")
        stack.callback(store.close)
        client = await attach(stack, broker, args.id, credentials(args), args.tls_ca)
        node = DatabaseNode(args.id, client, store)
        stack.push_async_callback(node.stop)
        await node.start()
        for spec in specs:
            await node.store_spec(spec)
        collector.settle()
        print(
            f"database {args.id} attached to {client.broker}, storing into {store.url}", flush=True
        )
        await until_stopped()
    return 0
