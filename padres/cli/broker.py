"""``padres broker``: run one broker process."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from padres.broker import Broker, Covering
from padres.cli.logs import setup_logging
from padres.errors import CommandError, JournalError
from padres.journal import Journal, Sync
from padres.runtime.node import BrokerNode, Limits
from rete.limits import CompositeLimits

MIB = 1 << 20


def register(commands: Any) -> None:
    p = commands.add_parser("broker", help="run a broker: WebSocket for clients and neighbours")
    p.add_argument("--id", required=True, help="the broker's id in the overlay, unique")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8001, help="port to listen on (0: any free one)")
    p.add_argument(
        "--neighbor",
        action="append",
        default=[],
        metavar="URL",
        help="a broker to link to, ws://host:port (repeatable)",
    )
    p.add_argument("--covering", choices=[c.value for c in Covering], default="lazy")
    p.add_argument(
        "--no-conformity",
        action="store_true",
        help="route publications that match none of their publisher's advertisements",
    )
    p.add_argument(
        "--one-for-many",
        action="store_true",
        help="one publication may fill several parts of a composite subscription, as in PADRES",
    )
    p.add_argument(
        "--heartbeat", type=float, default=5.0, help="seconds between pings on every link"
    )
    p.add_argument(
        "--settle",
        type=float,
        default=0.5,
        help="seconds a database waits past a historic query's end before it answers, so that "
        "publications on their way are stored first (default 0.5)",
    )
    defaults = Limits()
    p.add_argument(
        "--client-queue",
        type=float,
        default=defaults.client_queue / MIB,
        metavar="MIB",
        help="MiB queued for a client that reads too slowly before messages to it are dropped "
        f"(default {defaults.client_queue / MIB:g})",
    )
    p.add_argument(
        "--evict-after",
        type=float,
        default=defaults.evict_after,
        metavar="SECONDS",
        help="seconds a client may stay over its queue limit before it is disconnected "
        f"(default {defaults.evict_after:g})",
    )
    p.add_argument(
        "--link-queue",
        type=float,
        default=defaults.link_queue / MIB,
        metavar="MIB",
        help="MiB queued for a neighbour broker before the link is closed and resynchronised "
        f"(default {defaults.link_queue / MIB:g})",
    )
    p.add_argument(
        "--pause-at",
        type=float,
        default=defaults.pause_at / MIB,
        metavar="MIB",
        help="MiB queued for a neighbour at which the broker stops reading from its clients, "
        f"until every link queue is under half of it (default {defaults.pause_at / MIB:g})",
    )
    p.add_argument(
        "--replay-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="a historic request fails when its database has sent nothing for this long "
        "(default 30)",
    )
    p.add_argument(
        "--data",
        metavar="DIR",
        help="keep the journal (guaranteed publications, durable subscriptions) in "
        "DIR/journal.sqlite, so that they survive a restart (default: in memory)",
    )
    p.add_argument(
        "--sync",
        choices=[s.value for s in Sync],
        default=Sync.FULL.value,
        help="when the journal waits for the disk: full (survives a power failure, the "
        "default), normal (survives a crash of the process), off",
    )
    p.add_argument("--quiet", action="store_true", help="log warnings only")
    p.set_defaults(run=run)


def _journal(data: str | None, sync: Sync) -> Journal:
    if data is None:
        return Journal("")  # a temporary file: on disk, so bounded in memory, but not kept
    try:
        Path(data).mkdir(parents=True, exist_ok=True)
        return Journal(str(Path(data) / "journal.sqlite"), sync=sync)
    except (OSError, JournalError) as exc:
        raise CommandError(f"--data {data}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    setup_logging(args.quiet)
    broker = Broker(
        args.id,
        covering=Covering(args.covering),
        conformity=not args.no_conformity,
        limits=CompositeLimits(distinct=not args.one_for_many),
        epoch=os.urandom(3).hex(),
        settle=args.settle,
        replay_timeout=args.replay_timeout,
        journal=_journal(args.data, Sync(args.sync)),
    )
    limits = Limits(
        client_queue=int(args.client_queue * MIB),
        link_queue=int(args.link_queue * MIB),
        pause_at=int(args.pause_at * MIB),
        evict_after=args.evict_after,
    )
    node = BrokerNode(broker, neighbors=args.neighbor, heartbeat=args.heartbeat, limits=limits)

    def ready(port: int) -> None:
        print(f"broker {args.id} listening on ws://{args.host}:{port}/ws", flush=True)

    try:
        _run_loop(node.serve(args.host, args.port, ready))
    except OSError as exc:
        print(f"padres broker: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0


def _run_loop(main: Any) -> None:
    try:
        import uvloop

        uvloop.run(main)
    except ImportError:  # pragma: no cover - uvloop is absent on Windows
        asyncio.run(main)
