"""``padres exceptions list|show|replay|purge``: a subscription's exception queue at its broker."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from datetime import UTC, datetime

import orjson

from padres.cli.client import _connect, _connection_options
from padres.errors import CommandError, ConnectionLost, RequestFailed
from padres.model.printer import format_message
from padres.model.protocol import ExceptionEntry, ExceptionReport, envelope_to_dict

__all__ = ["arguments"]

ACTIONS = ("list", "show", "replay", "purge")


def arguments(e: argparse.ArgumentParser) -> None:
    e.description = (
        "The publications a subscriber's handler kept failing on, kept at its broker: list "
        "them, show some, deliver them again through the handler (replay), or remove them "
        "(purge)."
    )
    e.add_argument("action", choices=ACTIONS)
    e.add_argument("entries", nargs="*", type=int, help="entry ids (default: every entry)")
    _connection_options(e)
    e.add_argument("--client", required=True, help="the subscriber's client name")
    e.add_argument("--subscription", required=True, help="the subscription's id (durable name)")
    e.add_argument("--all", action="store_true", help="purge: every entry (needed without ids)")
    e.add_argument("--json", action="store_true", help="print the broker's report as JSON")
    e.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.action == "show" and not args.entries:
        raise CommandError("show needs the ids of the entries to show")
    if args.action == "purge" and not args.entries and not args.all:
        raise CommandError("purge needs the ids of the entries to remove, or --all")
    report = asyncio.run(_ask(args))
    if args.json:
        print(orjson.dumps(envelope_to_dict(report)).decode())
    elif args.action in ("list", "show"):
        _print_entries(report, detailed=args.action == "show")
    else:
        done = "replaying" if args.action == "replay" else "purged"
        print(f"{done} {_count(report.affected, 'entry', 'entries')}")
    if args.action == "purge" and args.entries and report.affected < len(set(args.entries)):
        missing = len(set(args.entries)) - report.affected
        print(f"padres exceptions: {missing} of the entries were not there", file=sys.stderr)
        return 1
    return 0


async def _ask(args: argparse.Namespace) -> ExceptionReport:
    client = await _connect(args, f"exceptions-{os.getpid()}")
    try:
        target = {"client": args.client}
        match args.action:
            case "list" | "show":
                return await client.exceptions(args.subscription, args.entries, **target)
            case "replay":
                count = await client.replay_exceptions(args.subscription, args.entries, **target)
            case _:
                count = await client.purge_exceptions(args.subscription, args.entries, **target)
        return ExceptionReport("", args.subscription, affected=count)
    except (RequestFailed, ConnectionLost, TimeoutError) as exc:
        raise CommandError(str(exc) or type(exc).__name__) from None
    finally:
        await client.close()


def _print_entries(report: ExceptionReport, *, detailed: bool) -> None:
    for entry in report.entries:
        print(_line(entry) if not detailed else _details(entry))
    dropped = f", {report.dropped} dropped (the queue was full)" if report.dropped else ""
    length = _count(report.length, "entry", "entries")
    print(f"{length}, {report.bytes:,} bytes{dropped}", file=sys.stderr)


def _count(number: int, one: str, many: str = "") -> str:
    return f"{number} {one if number == 1 else many or one + 's'}"


def _time(entry: ExceptionEntry) -> str:
    return datetime.fromtimestamp(entry.at, UTC).isoformat(timespec="seconds")


def _line(entry: ExceptionEntry) -> str:
    replaying = " (replaying)" if entry.replaying else ""
    return (
        f"{entry.id}\t{_time(entry)}\t{_count(entry.attempts, 'attempt')}{replaying}\t"
        f"{entry.error}\t"
        f"{format_message(entry.publication)}"
    )


def _details(entry: ExceptionEntry) -> str:
    return "\n".join(
        [
            f"entry {entry.id}" + (" (being replayed)" if entry.replaying else ""),
            f"  failed at   {_time(entry)}, after {_count(entry.attempts, 'attempt')}",
            f"  error       {entry.error}",
            f"  publication {format_message(entry.publication)}",
            f"  publisher   {entry.publication.publisher}, id {entry.publication.id}",
        ]
    )
