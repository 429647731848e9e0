"""``padres broker``: run one broker process."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from padres.broker import Broker, Covering
from padres.broker.quotas import Quotas
from padres.broker.sqlite_journal import SqliteJournal, Sync
from padres.broker.transactions import TxLimits
from padres.cli.credentials import add_credential_options, credentials
from padres.cli.logs import setup_logging
from padres.errors import CommandError, JournalError
from padres.runtime import collector
from padres.runtime.node import BrokerNode, Limits
from padres.security.accounts import Accounts, Credentials
from padres.security.tls import ServerTLS
from rete.limits import CompositeLimits

MIB = 1 << 20


def register(commands: Any) -> None:
    p = commands.add_parser("broker", help="run a broker: WebSocket for clients and neighbours")
    p.add_argument("--id", required=True, help="the broker's id in the overlay, unique")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8001, help="port to listen on (0: any free one)")
    p.add_argument(
        "--neighbour",
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
        "--replay-delay",
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
    tx = TxLimits()
    p.add_argument(
        "--tx-timeout",
        type=float,
        default=tx.timeout,
        metavar="SECONDS",
        help="a transaction nothing was published in for this long is aborted "
        f"(default {tx.timeout:g})",
    )
    p.add_argument(
        "--tx-linger",
        type=float,
        default=tx.linger,
        metavar="SECONDS",
        help="a transaction whose client lost its connection is aborted unless the client is "
        f"back within this time (default {tx.linger:g})",
    )
    p.add_argument(
        "--tx-max-publications",
        type=int,
        default=tx.max_publications,
        metavar="N",
        help=f"publications in one transaction, at most (default {tx.max_publications})",
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
    p.add_argument(
        "--accounts",
        metavar="FILE",
        help="the accounts file (made with 'padres user'): clients and neighbours must "
        "authenticate, and clients may do only what their grants allow; it is read again "
        "when it changes. Without it anyone who reaches the port may do anything "
        "(docs/security.md)",
    )
    _limit_options(p, defaults)
    _tls_options(p)
    p.add_argument("--quiet", action="store_true", help="log warnings only")
    add_credential_options(p, "this broker, linking to its neighbours,")
    p.set_defaults(run=run)


def _limit_options(p: argparse.ArgumentParser, defaults: Limits) -> None:
    quotas = Quotas()
    p.add_argument(
        "--max-frame",
        type=float,
        default=defaults.frame_bytes / MIB,
        metavar="MIB",
        help="MiB of a frame beyond which it is refused; four times that closes the connection "
        f"(default {defaults.frame_bytes / MIB:g})",
    )
    p.add_argument(
        "--max-frame-messages",
        type=int,
        default=defaults.frame_messages,
        metavar="N",
        help=f"messages of a frame beyond which it is refused (default {defaults.frame_messages})",
    )
    p.add_argument(
        "--max-subscriptions",
        type=int,
        default=quotas.subscriptions,
        metavar="N",
        help=f"subscriptions one client may hold (default {quotas.subscriptions})",
    )
    p.add_argument(
        "--max-advertisements",
        type=int,
        default=quotas.advertisements,
        metavar="N",
        help=f"advertisements one client may hold (default {quotas.advertisements})",
    )
    p.add_argument(
        "--max-schemas",
        type=int,
        default=quotas.schemas,
        metavar="N",
        help=f"schemas the overlay may hold: a declaration of one more here is refused "
        f"(default {quotas.schemas})",
    )
    p.add_argument(
        "--max-schema-attributes",
        type=int,
        default=quotas.schema_attributes,
        metavar="N",
        help=f"attributes one schema declared here may have (default {quotas.schema_attributes})",
    )


def _tls_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="serve wss:// (and the web API https://) with this PEM certificate (chain)",
    )
    p.add_argument("--tls-key", metavar="FILE", help="the private key of --tls-cert (PEM)")
    p.add_argument(
        "--tls-ca",
        metavar="FILE",
        help="PEM file of the CA certificates that wss:// neighbours are verified against "
        "(default: the system's trusted authorities)",
    )


def _tls(args: argparse.Namespace) -> ServerTLS | None:
    if (args.tls_cert is None) != (args.tls_key is None):
        raise CommandError("--tls-cert and --tls-key go together")
    return None if args.tls_cert is None else ServerTLS(args.tls_cert, args.tls_key)


def _quotas(args: argparse.Namespace) -> Quotas:
    try:
        return Quotas(
            args.max_subscriptions,
            args.max_advertisements,
            args.max_schemas,
            args.max_schema_attributes,
        )
    except ValueError as exc:
        raise CommandError(
            f"--max-subscriptions, --max-advertisements, --max-schemas, "
            f"--max-schema-attributes: {exc}"
        ) from None


def _journal(data: str | None, sync: Sync) -> SqliteJournal:
    if data is None:
        return SqliteJournal("")  # a temporary file: on disk, so bounded in memory, not kept
    try:
        Path(data).mkdir(parents=True, exist_ok=True)
        return SqliteJournal(str(Path(data) / "journal.sqlite"), sync=sync)
    except (OSError, JournalError) as exc:
        raise CommandError(f"--data {data}: {exc}") from None


def _credentials(args: argparse.Namespace) -> Credentials:
    """The broker's own credentials; its account is named after it unless told otherwise."""
    given = credentials(args)
    if given.password and not given.user:
        return replace(given, user=args.id)
    return given


def run(args: argparse.Namespace) -> int:
    setup_logging(args.quiet)
    broker = Broker(
        args.id,
        covering=Covering(args.covering),
        conformity=not args.no_conformity,
        limits=CompositeLimits(distinct=not args.one_for_many),
        epoch=os.urandom(3).hex(),
        replay_delay=args.replay_delay,
        replay_timeout=args.replay_timeout,
        journal=_journal(args.data, Sync(args.sync)),
        quotas=_quotas(args),
        transactions=TxLimits(
            timeout=args.tx_timeout,
            linger=args.tx_linger,
            max_publications=args.tx_max_publications,
        ),
        accounts=None if args.accounts is None else Accounts(args.accounts),
        credentials=_credentials(args),
    )
    limits = Limits(
        client_queue=int(args.client_queue * MIB),
        link_queue=int(args.link_queue * MIB),
        pause_at=int(args.pause_at * MIB),
        evict_after=args.evict_after,
        frame_bytes=int(args.max_frame * MIB),
        frame_messages=args.max_frame_messages,
    )
    tls = _tls(args)
    node = BrokerNode(
        broker,
        neighbours=args.neighbour,
        heartbeat=args.heartbeat,
        limits=limits,
        tls=tls,
        tls_ca=args.tls_ca,
    )
    scheme = "ws" if tls is None else "wss"

    def ready(port: int) -> None:
        collector.freeze()
        print(f"broker {args.id} listening on {scheme}://{args.host}:{port}/ws", flush=True)

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
