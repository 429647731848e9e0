"""``padres broker``: run one broker process."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from dataclasses import replace
from typing import Any

from padres.broker import Broker
from padres.broker.config import BrokerConfig
from padres.broker.journal import Journal
from padres.broker.sqlite_journal import SqliteJournal, Sync
from padres.cli.addresses import DEFAULT_PORT
from padres.cli.config import add_config_options, config_from_args
from padres.cli.credentials import add_credential_options, credentials
from padres.cli.detach import WAIT, add_detach_option, announce, detached
from padres.cli.inputs import positive
from padres.cli.logs import add_log_options, setup_logging
from padres.cli.settings import add_settings_options
from padres.errors import CommandError, JournalError, missing
from padres.runtime import collector
from padres.runtime.compression import LEVEL
from padres.runtime.node import BrokerNode, Limits
from padres.security.accounts import Accounts, Credentials
from padres.security.files import private_directory
from padres.security.tls import ServerTLS

MIB = 1 << 20


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--id", required=True, help="the broker's id in the overlay, unique")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="port to listen on (0: any free one)"
    )
    p.add_argument(
        "--neighbour",
        action="append",
        default=[],
        metavar="URL",
        help="a broker to link to, ws://host:port (repeatable)",
    )
    add_config_options(p, BrokerConfig)
    p.add_argument(
        "--heartbeat", type=float, default=5.0, help="seconds between pings on every link"
    )
    defaults = Limits()
    _limit(
        p,
        "--client-queue",
        defaults.client_queue / MIB,
        "MIB",
        "MiB queued for a client that reads too slowly before messages to it are dropped",
    )
    _limit(
        p,
        "--evict-after",
        defaults.evict_after,
        "SECONDS",
        "seconds a client may stay over its queue limit before it is disconnected",
    )
    _limit(
        p,
        "--link-queue",
        defaults.link_queue / MIB,
        "MIB",
        "MiB queued for a neighbour broker before the link is closed and resynchronised",
    )
    _limit(
        p,
        "--pause-at",
        defaults.pause_at / MIB,
        "MIB",
        "MiB queued for a neighbour at which the broker stops reading from its clients, "
        "until every link queue is under half of it",
    )
    _limit(
        p,
        "--rest-idle",
        defaults.rest_idle,
        "SECONDS",
        "seconds a plain subscription made over the web API may go unread before it is removed",
    )
    _limit(
        p,
        "--drain-within",
        defaults.drain_within,
        "SECONDS",
        "seconds a broker told to stop (SIGTERM) gives its clients to move elsewhere and "
        "its queues to empty before it closes what is left",
    )
    p.add_argument(
        "--data",
        metavar="DIR",
        help="keep the journal (guaranteed publications, durable subscriptions) in "
        "DIR/journal.sqlite, so that they survive a restart (default: in memory)",
    )
    p.add_argument(
        "--journal",
        metavar="URL",
        help="keep the journal in PostgreSQL at URL (postgresql://user@host/db), in a schema "
        "named after the broker, so that a new process with the same id can take over if this "
        "machine is lost (needs the postgres extra; not with --data; docs/guarantees.md)",
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
    _compression_options(p)
    _tls_options(p)
    add_log_options(p)
    add_detach_option(p, "it is ready (neighbours linked)", log="{id}.log")
    add_credential_options(p, "this broker, linking to its neighbours,")
    add_settings_options(p, "PADRES_BROKER_")
    p.set_defaults(run=run)


def _limit_options(p: argparse.ArgumentParser, defaults: Limits) -> None:
    _limit(
        p,
        "--max-frame",
        defaults.frame_bytes / MIB,
        "MIB",
        "MiB of a frame beyond which it is refused; four times that closes the connection",
    )
    _limit(
        p,
        "--max-frame-messages",
        defaults.frame_messages,
        "N",
        "messages of a frame beyond which it is refused",
    )
    _limit(
        p,
        "--max-refusals",
        defaults.refusals_per_second,
        "N",
        "refused messages a client may cause a second, on average, with a burst of ten "
        "times as many; past that its frames are read more slowly, and a client slowed for "
        f"{defaults.refusals_slowed:g} s on end is disconnected",
    )


def _limit(p: argparse.ArgumentParser, flag: str, default: float, metavar: str, what: str) -> None:
    """An option of a positive limit: ``what`` it is, its default said after."""
    p.add_argument(
        flag,
        type=positive(type(default)),
        default=default,
        metavar=metavar,
        help=f"{what} (default {default:g})",
    )


def _compression_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--compression",
        type=int,
        choices=range(10),
        default=LEVEL,
        metavar="LEVEL",
        help="zlib level (1 fastest to 9 smallest) at which the broker compresses what it "
        "sends to clients and neighbours that offer WebSocket compression (permessage-deflate); "
        f"0: accept it from none (default {LEVEL})",
    )
    p.add_argument(
        "--compress-links",
        action="store_true",
        help="offer compression to the neighbours this broker dials (over a WAN, say); "
        "they compress too unless started with --compression 0",
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


def _journal(args: argparse.Namespace) -> Journal:
    if args.journal is not None:
        if args.data is not None:
            raise CommandError("--journal and --data are two places for one journal: give one")
        try:
            from padres.broker.postgres_journal import PostgresJournal
        except ModuleNotFoundError as exc:
            raise CommandError(f"--journal: {missing(exc)}") from None
        try:
            return PostgresJournal(args.journal, args.id)
        except JournalError as exc:
            raise CommandError(f"--journal: {exc}") from None
    if args.data is None:
        return SqliteJournal("")  # a temporary file: on disk, so bounded in memory, not kept
    try:
        directory = private_directory(args.data)
        return SqliteJournal(str(directory / "journal.sqlite"), sync=Sync(args.sync))
    except (OSError, JournalError) as exc:
        raise CommandError(f"--data {args.data}: {exc}") from None


def _credentials(args: argparse.Namespace) -> Credentials:
    """The broker's own credentials; its account is named after it unless told otherwise."""
    given = credentials(args)
    if given.password and not given.user:
        return replace(given, user=args.id)
    return given


def run(args: argparse.Namespace) -> int:
    setup_logging(args.quiet, args.log_format)
    broker = Broker(
        args.id,
        config=config_from_args(args, BrokerConfig, epoch=os.urandom(3).hex()),
        journal=_journal(args),
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
        refusals_per_second=args.max_refusals,
        refusals_burst=int(10 * args.max_refusals),
        drain_within=args.drain_within,
        rest_idle=args.rest_idle,
    )
    tls = _tls(args)
    node = BrokerNode(
        broker,
        neighbours=args.neighbour,
        heartbeat=args.heartbeat,
        limits=limits,
        tls=tls,
        tls_ca=args.tls_ca,
        compression=args.compression or None,
        compress_links=args.compress_links,
    )
    scheme = "ws" if tls is None else "wss"

    announcing: list[asyncio.Task[None]] = []

    def ready(port: int) -> None:
        collector.freeze()
        url = f"{scheme}://{args.host}:{port}/ws"
        print(f"broker {args.id} listening on {url}", flush=True)
        if detached():
            announcing.append(asyncio.get_running_loop().create_task(_announce(node, url)))

    try:
        _run_loop(node.serve(args.host, args.port, ready))
    except OSError as exc:
        print(f"padres broker: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    except JournalError as exc:
        print(f"padres broker: stopped: {exc}", file=sys.stderr)
        return 1
    return 0


async def _announce(node: BrokerNode, url: str, wait: float = WAIT / 2) -> None:
    """Tell the command that detached this broker that it is ready, once it is linked to
    its neighbours (or after ``wait`` seconds, saying which it is not linked to yet)."""
    deadline = time.monotonic() + wait
    while not node.readiness()["ready"] and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    state = node.readiness()
    if state["ready"]:
        announce(f"broker {node.broker.id} ready at {url}")
    else:
        missing = ", ".join(state.get("missing", ())) or "its neighbours"
        announce(f"broker {node.broker.id} listening at {url}, not linked yet to {missing}")


def _run_loop(main: Any) -> None:
    try:
        import uvloop

        uvloop.run(main)
    except ImportError:  # pragma: no cover - uvloop is absent on Windows
        asyncio.run(main)
