"""Commands and benchmarks that packages above ``padres`` add through entry points
(``padres.commands``, ``padres.benchmarks``), each a function given the subparsers."""

from __future__ import annotations

import argparse
from functools import partial
from importlib.metadata import EntryPoint
from typing import Any

from padres.errors import CommandError, missing

__all__ = ["plug_in"]


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
