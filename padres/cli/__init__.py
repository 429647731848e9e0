"""The ``padres`` command line."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from functools import partial
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from padres.cli import (
    bench,
    broker,
    client,
    exceptions,
    match,
    parse,
    run,
    schema,
    user,
)
from padres.errors import CommandError, PadresError, missing

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="padres",
        description="Content-based publish/subscribe with Rete matching "
        "and historic subscriptions.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parse.register(commands)
    match.register(commands)
    broker.register(commands)
    client.register(commands)
    exceptions.register(commands)
    schema.register(commands)
    bench.register(commands)
    run.register(commands)
    user.register(commands)
    for plugin in entry_points(group="padres.commands"):  # db, archive: from historic and spark
        plug_in(plugin, commands)
    return parser


def plug_in(plugin: EntryPoint, commands: Any) -> None:
    """Add the commands ``plugin`` registers; if its extra is not installed, a command of its
    name that says what to install."""
    try:
        register = plugin.load()
    except ModuleNotFoundError as exc:
        why = missing(exc)
        unavailable = commands.add_parser(
            plugin.name, help=f"(not installed: {why})", prefix_chars="\0", add_help=False
        )  # takes any arguments, options included, to say what is missing
        unavailable.add_argument("rest", nargs="*")
        unavailable.set_defaults(run=partial(_unavailable, why))
        return
    register(commands)


def _unavailable(why: str, args: argparse.Namespace) -> int:
    raise CommandError(why)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.run(args)
    except PadresError as exc:
        print(f"padres {args.command}: {exc}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:  # a command of an extra that is not installed
        print(f"padres {args.command}: {missing(exc)}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into head or the like: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130
    return code
