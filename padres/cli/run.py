"""``padres run``: PADRES' demo material as it is, on real brokers, databases and clients.

A PADRES start script (``demo/bin/historic/start_demo``) describes the overlay with lines such
as::

    startbroker -uri socket://localhost:2001/Broker1 -b DB
    startbroker -uri socket://localhost:2002/Broker2 -b DB -n socket://localhost:2001/Broker1
    startclient -i Publisher -b socket://localhost:2001/Broker1

Each ``startbroker`` starts a broker named after the URI's last segment, linked to the brokers
``-n`` names (comma-separated); ``-b DB`` attaches a database node to it, named ``<broker>-DB``
as in PADRES. Each ``startclient`` makes a client ``-i`` at broker ``-b``. Other lines (shell)
are ignored. The batch files are then run in the order given, each by the first client, or by
the client or broker named after ``@`` (``3-subs.txt@Subscriber``), as PADRES' ``batch``
command would; every delivery is printed as it comes, and at the end each subscription's count.
The brokers match composite subscriptions as PADRES does (``padres broker --one-for-many``).
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from pathlib import Path

from padres.client.connection import Client, Delivery, SubscriptionHandle
from padres.errors import CommandError, InvalidMessage, PadresError
from padres.language.batch import BatchReader
from padres.model.messages import (
    Advertisement,
    CompositeSubscription,
    Message,
    Publication,
    Subscription,
    Unadvertise,
    Unsubscribe,
)
from padres.model.printer import format_message
from padres.model.protocol import Error, Notify
from padres.model.times import parse_time
from padres.security.files import private_directory
from padres.testing.processes import BrokerProcess, DatabaseProcess

__all__ = ["Topology", "arguments", "read_topology"]


@dataclass
class Topology:
    """Brokers (name -> the names of the brokers it links to), those with a database, and
    clients (name -> broker), in the order the script starts them."""

    brokers: dict[str, list[str]] = field(default_factory=dict)
    databases: list[str] = field(default_factory=list)
    clients: dict[str, str] = field(default_factory=dict)


def _name(uri: str) -> str:
    """``socket://localhost:2001/Broker1`` -> ``Broker1``."""
    return uri.rstrip("/").rsplit("/", 1)[-1]


def _options(words: list[str]) -> dict[str, str]:
    return {flag: value for flag, value in pairwise(words) if flag.startswith("-")}


def read_topology(lines: Iterable[str], origin: str = "") -> Topology:
    """The brokers, databases and clients a PADRES start script starts (see the module)."""
    top = Topology()
    for lineno, line in enumerate(lines, 1):
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue  # shell we do not read
        starts = [i for i, w in enumerate(words) if w.rsplit("/", 1)[-1] in _STARTERS]
        if not starts:
            continue
        command = words[starts[0]].rsplit("/", 1)[-1]
        opts = _options(words[starts[0] + 1 :])
        where = f"{origin}:line {lineno}"
        if command == "startbroker":
            if "-uri" not in opts:
                raise CommandError(f"{where}: startbroker without -uri")
            broker = _name(opts["-uri"])
            links = [_name(u) for u in opts.get("-n", "").split(",") if u.strip()]
            unknown = [b for b in links if b not in top.brokers]
            if unknown:
                raise CommandError(f"{where}: {broker} links to {unknown[0]}, not started before")
            top.brokers[broker] = links
            if "DB" in opts.get("-b", "").split(","):
                top.databases.append(broker)
        else:
            if "-i" not in opts or "-b" not in opts:
                raise CommandError(f"{where}: startclient needs -i NAME and -b BROKER_URI")
            broker = _name(opts["-b"])
            if broker not in top.brokers:
                raise CommandError(f"{where}: client {opts['-i']} at unknown broker {broker}")
            top.clients[opts["-i"]] = broker
    if not top.brokers:
        raise CommandError(f"{origin}: no startbroker line")
    return top


_STARTERS = ("startbroker", "startclient")


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("script", help="PADRES start script (startbroker / startclient lines)")
    p.add_argument(
        "batches",
        nargs="*",
        metavar="FILE[@CLIENT]",
        help="batch files, run in order by the first client or the one (or broker) named",
    )
    p.add_argument(
        "--at",
        metavar="TIME",
        help="timestamp of the batch files' publications (default: when each is sent), "
        "for historic queries over a window of the past",
    )
    p.add_argument(
        "--pause",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds between batch files, for routing to settle (default 1)",
    )
    p.add_argument(
        "--data", metavar="DIR", help="where the databases keep their SQLite files (default: temp)"
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    script = Path(args.script)
    try:
        topology = read_topology(script.read_text().splitlines(), str(script))
    except OSError as exc:
        raise CommandError(f"cannot read {script}: {exc.strerror}") from None
    at = None
    if args.at is not None:
        try:
            at = parse_time(args.at)
        except InvalidMessage as exc:
            raise CommandError(f"--at: {exc}") from None
    batches = list(_batches(args.batches, topology))
    with ExitStack() as stack:
        data = private_directory(args.data or stack.enter_context(tempfile.TemporaryDirectory()))
        urls = _start(topology, data, stack)
        return asyncio.run(_run(topology, urls, batches, at, args.pause))


def _batches(specs: list[str], topology: Topology) -> Iterator[tuple[Path, str]]:
    """(file, client) per FILE[@CLIENT]; a broker's name stands for a client of its own."""
    first = next(iter(topology.clients), next(iter(topology.brokers)))
    for spec in specs:
        path, _, who = spec.rpartition("@") if "@" in spec else (spec, "", first)
        if who not in topology.clients and who not in topology.brokers:
            raise CommandError(f"{spec}: no client or broker named {who!r} in the script")
        if not Path(path).is_file():
            raise CommandError(f"{path}: no such file")
        yield Path(path), who


def _start(topology: Topology, data: Path, stack: ExitStack) -> dict[str, str]:
    """Start the brokers and databases (stopped when ``stack`` closes); their URLs by name."""
    urls: dict[str, str] = {}
    for broker, links in topology.brokers.items():
        proc = BrokerProcess(
            broker, neighbours=[urls[b] for b in links], options=["--one-for-many"]
        )
        stack.callback(proc.stop)
        urls[broker] = proc.start()
        linked = f", linked to {', '.join(links)}" if links else ""
        print(f"broker {broker} at {urls[broker]}{linked}", flush=True)
    for broker in topology.databases:
        name = f"{broker}-DB"
        db = DatabaseProcess(name, urls[broker], f"sqlite:///{data / name}.sqlite")
        stack.callback(db.stop)
        db.start()
        print(f"database {name} at {broker}", flush=True)
    return urls


@dataclass
class _Subscribed:
    client: str
    message: Subscription | CompositeSubscription
    count: int = 0
    handle: SubscriptionHandle | None = None


async def _run(
    topology: Topology,
    urls: dict[str, str],
    batches: list[tuple[Path, str]],
    at: datetime | None,
    pause: float,
) -> int:
    errors: list[str] = []
    clients: dict[str, Client] = {}
    readers: dict[str, BatchReader] = {}
    subscribed: list[_Subscribed] = []
    try:
        for path, who in batches:
            if who not in clients:
                broker = topology.clients.get(who, who)

                def refused(error: Error, who: str = who) -> None:
                    errors.append(f"{who}: {error.text}")
                    print(f"{who}: refused: {error.text}", flush=True)

                clients[who] = await Client(urls[broker], who, on_error=refused).connect()
                readers[who] = BatchReader(timestamp=at)
            print(f"{path.name} by {who}", flush=True)
            for _, message in readers[who].read(path.read_text().splitlines(), str(path)):
                sub = await _send(clients[who], who, message)
                if sub is not None:
                    subscribed.append(sub)
            await asyncio.sleep(pause)
        for sub in subscribed:
            windowed = isinstance(sub.message, Subscription) and sub.message.filter.window
            if windowed and sub.handle is not None:
                await sub.handle.replayed(timeout=30)  # the past, from the databases
    except PadresError as exc:
        print(f"padres run: {exc}", file=sys.stderr)
        return 1
    except TimeoutError:
        print("padres run: the databases did not answer within 30 s", file=sys.stderr)
        return 1
    finally:
        for client in clients.values():
            await client.close()
    for sub in subscribed:
        print(f"{sub.client} {sub.message.id}: {sub.count}  {format_message(sub.message)}")
    return 1 if errors else 0


async def _send(client: Client, who: str, message: Message) -> _Subscribed | None:
    """Send one batch message; a subscription's deliveries are printed and counted."""
    match message:
        case Advertisement():
            await client.advertise(message.filter, id=message.id)
        case Publication():
            await client.publish(message)
        case Subscription() | CompositeSubscription():
            record = _Subscribed(who, message)

            def show(delivery: Delivery) -> None:
                record.count += 1
                pubs = (
                    [delivery.publication]
                    if isinstance(delivery, Notify)
                    else list(delivery.publications)
                )
                text = " + ".join(format_message(p) for p in pubs)
                print(f"{who} {message.id}: {text}", flush=True)

            if isinstance(message, Subscription):
                record.handle = await client.subscribe(message.filter, show, id=message.id)
            else:
                record.handle = await client.subscribe_composite(message, show)
            return record
        case Unsubscribe():
            await client.unsubscribe(message.subscription_id)
        case Unadvertise():
            await client.unadvertise(message.advertisement_id)
    return None
