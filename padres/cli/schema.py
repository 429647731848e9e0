"""``padres schema declare``, ``drop`` and ``list``: the schemas of typed event classes."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable

from padres.cli.client import _connect, _connection_options
from padres.client.connection import Client
from padres.errors import CommandError, ConnectionLost, InvalidMessage, RequestFailed
from padres.model.printer import format_value


def arguments(s: argparse.ArgumentParser) -> None:
    actions = s.add_subparsers(dest="action", required=True, metavar="ACTION")

    d = actions.add_parser(
        "declare",
        help="declare a class's schema, or widen it with new optional attributes",
        description="Declare the schema of CLASS overlay-wide; returns once every reachable "
        "broker has it. Each ATTRIBUTE is NAME:TYPE (required) or NAME:TYPE? (optional; quote "
        "it for the shell), TYPE one of integer, float, string, boolean, date, datetime, "
        "timestamp.",
    )
    _connection_options(d)
    d.add_argument("class_name", metavar="CLASS", help="the class the schema describes")
    d.add_argument("attributes", metavar="ATTRIBUTE", nargs="*", help="NAME:TYPE or NAME:TYPE?")
    d.set_defaults(run=run_declare)

    dr = actions.add_parser(
        "drop",
        help="drop a class's schema: the class is untyped again (an administrator's right)",
        description="Drop the schema of CLASS overlay-wide: publications, subscriptions and "
        "advertisements of CLASS are no longer checked; returns once every reachable broker "
        "knows. A later declaration starts a new schema.",
    )
    _connection_options(dr)
    dr.add_argument("class_name", metavar="CLASS", help="the class whose schema to drop")
    dr.set_defaults(run=run_drop)

    ls = actions.add_parser("list", help="the schemas a broker knows")
    _connection_options(ls)
    ls.set_defaults(run=run_list)


def run_declare(args: argparse.Namespace) -> int:
    async def declare(client: Client) -> None:
        await client.declare_schema(args.class_name, " ".join(args.attributes))
        rows = await client.query("schemas")
        prefix = f"{format_value(args.class_name)} v"
        print(next(row for row in rows if row.startswith(prefix)))

    return asyncio.run(_with_client(args, declare))


def run_drop(args: argparse.Namespace) -> int:
    async def drop(client: Client) -> None:
        await client.drop_schema(args.class_name)
        print(f"{format_value(args.class_name)}: untyped")

    return asyncio.run(_with_client(args, drop))


def run_list(args: argparse.Namespace) -> int:
    async def show(client: Client) -> None:
        for row in await client.query("schemas"):
            print(row)

    return asyncio.run(_with_client(args, show))


async def _with_client(
    args: argparse.Namespace, action: Callable[[Client], Awaitable[None]]
) -> int:
    client = await _connect(args, "schema")
    try:
        await action(client)
    except (ConnectionLost, RequestFailed, InvalidMessage, TimeoutError) as exc:
        raise CommandError(str(exc)) from None
    finally:
        await client.close()
    return 0
