"""The ``padres`` command line.

A command's module is imported only when that command is run (or its help shown): ``COMMANDS``
names, for each, the function that adds its arguments, so that ``padres --help`` loads none of
them and ``padres pub`` loads the client, not the broker. The packages above ``padres`` add
their commands through the ``padres.commands`` entry point (``padres.cli.plugins``); as those
are loaded to be listed, their modules import what a command needs only when it runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib import import_module
from typing import Any, Final, NamedTuple

from padres.cli.detach import detach, detached
from padres.cli.settings import configured, preset, shown
from padres.errors import PadresError, missing

__all__ = ["COMMANDS", "Command", "build_parser", "main"]


class Command(NamedTuple):
    """A command of ``padres``: its line in ``padres --help``, and the ``module:function``
    that adds its arguments (and its ``run``) to its parser."""

    help: str
    arguments: str


COMMANDS: Final = {
    "parse": Command("validate PADRES messages or batch files", "padres.cli.parse:arguments"),
    "match": Command("match publications against subscriptions", "padres.cli.match:arguments"),
    "broker": Command(
        "run a broker: WebSocket for clients and neighbours", "padres.cli.broker:arguments"
    ),
    "client": Command(
        "interactive client shell (PADRES' commands)", "padres.cli.client:shell_arguments"
    ),
    "pub": Command("publish publications and exit", "padres.cli.client:pub_arguments"),
    "sub": Command("subscribe and print what arrives", "padres.cli.client:sub_arguments"),
    "exceptions": Command(
        "list, show, replay or purge a subscription's exception queue",
        "padres.cli.exceptions:arguments",
    ),
    "schema": Command(
        "declare, drop or list the schemas of typed event classes", "padres.cli.schema:arguments"
    ),
    "bench": Command("run a benchmark and print its figures", "padres.cli.bench:arguments"),
    "run": Command(
        "run PADRES' demo material: a start script's overlay and batch files",
        "padres.cli.run:arguments",
    ),
    "user": Command(
        "manage the accounts file of brokers with security", "padres.cli.user:arguments"
    ),
    "admin": Command(
        "operate a running broker: durable subscriptions, clients", "padres.cli.admin:arguments"
    ),
}


def build_parser(words: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of ``padres``: every command, with the arguments of the one ``words`` name
    (of every command when ``words`` is None)."""
    parser = argparse.ArgumentParser(
        prog="padres",
        description="Content-based publish/subscribe with Rete matching "
        "and historic subscriptions.",
    )
    parser.add_argument(
        "--version",
        action=_Version,
        nargs=0,
        default=argparse.SUPPRESS,
        help="show program's version number and exit",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # The options before the command take no value: the first other word names it.
    named = None if words is None else next((w for w in words if not w.startswith("-")), "")
    for name, command in COMMANDS.items():
        p = commands.add_parser(name, help=command.help)
        if named in (None, name):
            module, function = command.arguments.split(":")
            getattr(import_module(module), function)(p)
    if named not in COMMANDS:  # db, archive: from historic and spark, in the package metadata
        from importlib.metadata import entry_points

        from padres.cli.plugins import plug_in

        for plugin in entry_points(group="padres.commands"):
            plug_in(plugin, commands)
    return parser


class _Version(argparse.Action):
    """``--version``: the installed version, looked up (in the package's metadata, which takes
    a while to load) only when asked for."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from importlib.metadata import version

        print(f"padres {version('padres')}")
        parser.exit()


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(words)
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
