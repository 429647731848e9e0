"""``padres broker``: run one broker process."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from padres.broker import Broker, Covering
from padres.cli.logs import setup_logging
from padres.runtime.node import BrokerNode


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
        "--heartbeat", type=float, default=5.0, help="seconds between pings on every link"
    )
    p.add_argument(
        "--settle",
        type=float,
        default=0.5,
        help="seconds a database waits past a historic query's end before it answers, so that "
        "publications on their way are stored first (default 0.5)",
    )
    p.add_argument("--quiet", action="store_true", help="log warnings only")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    setup_logging(args.quiet)
    broker = Broker(
        args.id,
        covering=Covering(args.covering),
        conformity=not args.no_conformity,
        epoch=os.urandom(3).hex(),
        settle=args.settle,
    )
    node = BrokerNode(broker, neighbors=args.neighbor, heartbeat=args.heartbeat)

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
