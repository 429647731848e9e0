"""The ``padres`` command line."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points, version

from padres.cli import (
    admin,
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
from padres.cli.detach import detach, detached
from padres.cli.plugins import plug_in
from padres.cli.settings import configured, preset, shown
from padres.errors import PadresError, missing

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="padres",
        description="Content-based publish/subscribe with Rete matching "
        "and historic subscriptions.",
    )
    parser.add_argument("--version", action="version", version=f"padres {version('padres')}")
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
    admin.register(commands)
    for plugin in entry_points(group="padres.commands"):  # db, archive: from historic and spark
        plug_in(plugin, commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    words = sys.argv[1:] if argv is None else list(argv)
    command = configured(parser, words)
    if command is not None:
        try:
            preset(command, words, os.environ)
        except PadresError as exc:
            print(f"{command.prog}: {exc}", file=sys.stderr)
            return 2
    args = parser.parse_args(words)
    if command is not None and args.print_config:
        print(shown(command, args))
        return 0
    if getattr(args, "detach", False) and not detached():
        return detach(args, words)
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
