"""``padres db``: a database-client node attached to a broker (see ``historic.node``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from typing import Any

from padres.cli.inputs import CommandError
from padres.cli.logs import setup_logging
from padres.client import Client, ClientState, ConnectionLost, RequestFailed
from padres.errors import ParseError
from padres.parser import parse_filter
from padres.printer import format_filter


def register(commands: Any) -> None:
    p = commands.add_parser("db", help="run a database node that stores what DB_CONTROL asks")
    p.add_argument("--id", required=True, help="the database's id, as DB_CONTROL addresses it")
    p.add_argument("--broker", default="ws://127.0.0.1:8001", help="broker URL, ws://host:port")
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
    p.add_argument("--quiet", action="store_true", help="log warnings only")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    setup_logging(args.quiet)
    try:
        return asyncio.run(_serve(args))
    except KeyboardInterrupt:
        return 0


async def _serve(args: argparse.Namespace) -> int:
    from historic.node import DatabaseNode  # the storage layer sits above the core package
    from historic.store import Store

    try:
        specs = [format_filter(parse_filter(spec)) for spec in args.store]
    except ParseError as exc:
        raise CommandError(f"--store: {exc}") from None
    store = Store(args.url or f"sqlite:///{args.id}.sqlite")
    client = Client(args.broker, args.id)
    try:
        await client.connect()
    except (ConnectionLost, RequestFailed, TimeoutError) as exc:
        raise CommandError(f"cannot connect to {args.broker}: {exc}") from None
    node = DatabaseNode(args.id, client, store)
    await node.start()
    for spec in specs:
        await node.store_spec(spec)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    print(f"database {args.id} attached to {client.broker}, storing into {store.url}", flush=True)
    try:
        while client.state is ClientState.OPEN and not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), 0.2)
        if stopping.is_set():
            return 0
        print("padres db: the broker closed the connection", file=sys.stderr)
        return 1
    finally:
        await node.stop()
        await client.close()
        store.close()
