"""``padres client`` (an interactive shell), ``padres pub`` and ``padres sub``."""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Final

import orjson
from msgspec.structs import replace

from padres.cli.addresses import DEFAULT_BROKER
from padres.cli.credentials import add_credential_options, credentials
from padres.cli.detach import add_detach_option, announce, detached
from padres.cli.inputs import positive, read_lines
from padres.client.connection import Client, Delivery
from padres.errors import (
    AuthenticationError,
    CommandError,
    ConnectError,
    ConnectionLost,
    InvalidMessage,
    ParseError,
    RequestFailed,
)
from padres.language.batch import BatchReader
from padres.model.codec import from_dict, loads
from padres.model.messages import (
    Advertisement,
    CompositeSubscription,
    Filter,
    Predicate,
    Publication,
    Subscription,
    Unadvertise,
    Unsubscribe,
)
from padres.model.printer import format_filter, format_message
from padres.model.protocol import (
    CompositeNotify,
    Error,
    Scope,
    TxNotify,
    Visibility,
    check_priority,
    envelope_to_dict,
)
from padres.runtime.backoff import Backoff
from rete.operators import Op

CONNECT_WAIT: Final = 10.0
"""Seconds a command goes on dialling brokers that cannot be reached (one just started takes
a moment to listen) before it gives up, by default (``--wait``)."""

SHELL_HELP = """commands (PADRES' own):
  a FILTER        advertise             s FILTER        subscribe
  p PUBLICATION   publish               cs COMPOSITE    composite subscribe
  ua ID           unadvertise           us ID           unsubscribe
  printsubs       the broker's subscription routing table
  printadvs       the broker's advertisement table
  printschemas    the schemas of typed classes the broker knows (declare one with
                  p [class,'SCHEMA'],[of,'CLASS'],[attributes,'NAME:TYPE NAME:TYPE? ...'])
  batch FILE      run a batch file      help, quit"""


def shell_arguments(c: argparse.ArgumentParser) -> None:
    _connection_options(c)
    c.set_defaults(run=run_shell)


def pub_arguments(p: argparse.ArgumentParser) -> None:
    _connection_options(p)
    p.add_argument("publications", nargs="*", help="publications in PADRES syntax")
    p.add_argument(
        "--file",
        help="read publications from a file (- for stdin), one a line: PADRES text, or JSON "
        '(the attributes, {"class": "STOCK", "price": 5}, or a wire publication)',
    )
    p.add_argument(
        "--adv",
        action="append",
        default=[],
        help="advertisement to make first (default: one per class and attribute set published)",
    )
    p.add_argument(
        "--guaranteed",
        action="store_true",
        help="guaranteed delivery: exit once the broker has every publication on disk",
    )
    p.add_argument(
        "--transaction",
        action="store_true",
        help="publish them all in one transaction: subscribers see all of them or none; exit "
        "once it is committed (docs/transactions.md)",
    )
    p.add_argument(
        "--vital",
        action="append",
        default=[],
        metavar="CLIENT",
        help="with --transaction: a consumer whose reaction is vital, the commit waits for its "
        "ready vote (repeat for several)",
    )
    p.add_argument(
        "--vital-wait",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="with --vital: how long the commit waits for the votes (default 10)",
    )
    p.set_defaults(run=run_pub)


def sub_arguments(s: argparse.ArgumentParser) -> None:
    _connection_options(s)
    s.add_argument("filter", help="subscription filter, or composite subscription with {...}")
    s.add_argument("--json", action="store_true", help="print each delivery as a JSON line")
    s.add_argument("--count", type=int, help="exit after N deliveries")
    s.add_argument("--timeout", type=float, help="exit after S seconds without a delivery")
    s.add_argument(
        "--durable",
        metavar="NAME",
        help="a durable subscription: the broker keeps what it matches while this client is "
        "away; run again with the same --name and --durable to resume",
    )
    s.add_argument(
        "--visibility",
        choices=[v.value for v in Visibility],
        default=Visibility.ON_COMMIT.value,
        help="which publications of transactions to print: on_commit (committed ones, the "
        "default), immediate (each at once, then its outcome), deferred (each when its commit "
        "starts, then its outcome), on_abort (aborted ones)",
    )
    s.add_argument(
        "--priority",
        type=int,
        default=0,
        metavar="N",
        help="where this subscription's deliveries come among the client's other subscriptions "
        "matching the same publication: higher first (default 0)",
    )
    s.add_argument(
        "--scope",
        choices=[scope.value for scope in Scope],
        default=Scope.GLOBAL.value,
        help="global (the default): publications from anywhere in the overlay; local: only "
        "those published by clients of this broker",
    )
    add_detach_option(s, "the subscription is in place (deliveries go to standard output)")
    s.set_defaults(run=run_sub)


def _connection_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--broker",
        action="append",
        metavar="URL",
        help=f"broker URL, ws://host:port (wss:// for TLS; default {DEFAULT_BROKER}); given "
        "several times, brokers of one overlay tried in turn, and failed over to",
    )
    p.add_argument(
        "--name",
        default=None,
        help="client name (default: the user; else the command's name, with a random suffix "
        "unless a durable subscription is to be resumed under it)",
    )
    p.add_argument(
        "--wait",
        type=positive(float),
        default=CONNECT_WAIT,
        metavar="SECONDS",
        help="how long to go on dialling brokers that cannot be reached, one just started "
        f"say, before giving up (default {CONNECT_WAIT:g})",
    )
    p.add_argument(
        "--tls-ca",
        metavar="FILE",
        help="for a wss:// broker: PEM file of the CA certificates its certificate is checked "
        "against (default: the system's trusted authorities)",
    )
    p.add_argument(
        "--compress",
        action="store_true",
        help="compress the connection (WebSocket permessage-deflate): about ten times fewer "
        "bytes for a little CPU; worth it over a slow or metered network",
    )
    add_credential_options(p)


def _format(delivery: Delivery, as_json: bool) -> str:
    if as_json:
        return orjson.dumps(envelope_to_dict(delivery)).decode()
    if isinstance(delivery, CompositeNotify):
        pubs = " ; ".join(format_message(p) for p in delivery.publications)
        bound = ",".join(f"${k}={v!r}" for k, v in sorted(delivery.bindings.items()))
        return f"{delivery.subscription} {bound} <- {pubs}"
    line = f"{','.join(delivery.subscriptions)} <- {format_message(delivery.publication)}"
    if isinstance(delivery, TxNotify):
        line += f"  ({delivery.outcome.value} in {delivery.tx})"
    return line


async def _connect(
    args: argparse.Namespace,
    default_name: str,
    refused: list[Error] | None = None,
    reconnect: bool = False,
) -> Client:
    def report(error: Error) -> None:
        _print_error(error)
        if refused is not None:
            refused.append(error)

    given = credentials(args)
    brokers = args.broker or [DEFAULT_BROKER]
    # A durable subscription is resumed under the same name; anything else gets a name of
    # its own, so that two commands of the same kind can run side by side.
    durable = getattr(args, "durable", None) is not None
    unique = default_name if durable else f"{default_name}-{secrets.token_hex(3)}"
    deadline = time.monotonic() + args.wait
    backoff = Backoff()
    while True:
        client = Client(
            brokers,
            args.name or given.user or unique,
            on_error=report,
            reconnect=reconnect,
            user=given.user,
            password=given.password,
            token=given.token,
            tls_ca=args.tls_ca,
            compress=args.compress,
        )
        try:
            return await client.connect()
        except ConnectError as exc:  # nothing listens yet, maybe: a broker just started
            delay = backoff.next()
            if time.monotonic() + delay > deadline:
                why = f"cannot connect to {', '.join(brokers)} (tried for {args.wait:g} s)"
                raise CommandError(f"{why}: {exc}") from None
        except (AuthenticationError, ConnectionLost, RequestFailed, TimeoutError) as exc:
            raise CommandError(f"cannot connect to {', '.join(brokers)}: {exc}") from None
        await asyncio.sleep(delay)


def _print_error(error: Error) -> None:
    where = f" ({error.ref})" if error.ref else ""
    print(f"error{where}: {error.text}", file=sys.stderr, flush=True)


# -- pub ---------------------------------------------------------------------------------------


def _derived_advertisements(pubs: Iterable[Publication]) -> list[Filter]:
    """One advertisement per class and attribute set, each attribute only required present."""
    seen: dict[tuple[str, tuple[str, ...]], Filter] = {}
    for pub in pubs:
        names = tuple(sorted(pub.attributes))
        if (pub.class_name, names) not in seen:
            preds = [Predicate("class", Op.EQ, pub.class_name)]
            preds += [Predicate(n, Op.IS_PRESENT) for n in names if n != "class"]
            seen[pub.class_name, names] = Filter(tuple(preds))
    return list(seen.values())


def run_pub(args: argparse.Namespace) -> int:
    return asyncio.run(_pub(args))


def _publications(args: argparse.Namespace) -> list[Publication]:
    """The publications of the command line and of ``--file``: PADRES text, or JSON (an
    object of attributes, or a wire publication with its own id and timestamp), a line each.
    Those without an id of their own get one of this run: stores, durable subscriptions and
    the broker's resend check tell publications apart by publisher and id, and the next run
    numbers from p1 again."""
    reader = BatchReader()
    lines = [(line, "<args>") for line in args.publications]
    if args.file:
        lines += [(line, args.file) for line in read_lines(args.file)]
    run = secrets.token_hex(8)
    now = datetime.now(UTC)
    pubs: list[Publication] = []
    for lineno, (line, source) in enumerate(lines, 1):
        text = line.strip()
        if text.startswith("{"):
            pubs.append(_json_publication(text, f"p{lineno}.{run}", now, f"{source}:{lineno}"))
            continue
        message = reader.parse_line(line, lineno, source)
        if isinstance(message, Publication):
            pubs.append(replace(message, id=f"{message.id}.{run}"))
        elif message is not None:
            raise CommandError(f"line {lineno}: 'padres pub' sends publications only")
    return pubs


def _json_publication(text: str, ident: str, now: datetime, where: str) -> Publication:
    """A JSON line: the attributes of a publication (given ``ident`` and ``now``), or a wire
    publication (``"type": "publication"``)."""
    try:
        obj = loads(text)
        if not isinstance(obj, dict):
            raise InvalidMessage("a JSON line is an object")
        if "type" not in obj:
            return Publication(ident, obj, now)
        message = from_dict(obj)
    except InvalidMessage as exc:
        raise CommandError(f"{where}: {exc}") from None
    if not isinstance(message, Publication):
        raise CommandError(f"{where}: 'padres pub' sends publications only")
    return message


async def _pub(args: argparse.Namespace) -> int:
    pubs = _publications(args)
    advs = [BatchReader().parse_line(f"a {a}") for a in args.adv]
    refused: list[Error] = []
    client = await _connect(args, "pub", refused)
    try:
        filters = [a.filter for a in advs if isinstance(a, Advertisement)]
        made = [await client.advertise(flt) for flt in filters or _derived_advertisements(pubs)]
        if args.transaction:
            async with client.transaction(vital=args.vital, wait=args.vital_wait) as tx:
                for pub in pubs:  # with ids of this run: the broker keeps them
                    await tx.publish(dict(pub.attributes))
        else:
            for start in range(0, len(pubs), 500):
                await client.publish_many(pubs[start : start + 500], guaranteed=args.guaranteed)
        await client.flush()  # every guaranteed publication answered
        if not (args.guaranteed or args.transaction):
            for ident in made:  # a round trip: its answer comes after the publications'
                await client.unadvertise(ident)
    except RequestFailed as exc:
        raise CommandError(str(exc)) from None
    finally:
        await client.close()
    sent = len(pubs) - len(refused)
    print(f"published {sent} of {len(pubs)} publications to {client.url}", file=sys.stderr)
    return 1 if refused else 0


# -- sub ---------------------------------------------------------------------------------------


def run_sub(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_sub(args))
    except KeyboardInterrupt:
        return 130


async def _sub(args: argparse.Namespace) -> int:
    text = args.filter.strip()
    reader = BatchReader()
    try:
        command = "cs" if text.startswith(("{", "(")) else "s"
        message = reader.parse_line(f"{command} {text}", 1, "<filter>")
    except ParseError as exc:
        raise CommandError(str(exc)) from None
    try:
        check_priority(args.priority)
    except InvalidMessage as exc:
        raise CommandError(f"--priority: {exc}") from None
    client = await _connect(args, "sub", reconnect=args.durable is not None)
    received = 0
    try:
        visibility = Visibility(args.visibility)
        if isinstance(message, CompositeSubscription) and visibility is not Visibility.ON_COMMIT:
            raise CommandError("a composite subscription sees committed publications only")
        options = {"visibility": visibility, "priority": args.priority, "scope": args.scope}
        if isinstance(message, CompositeSubscription) and (args.priority or args.scope != "global"):
            raise CommandError("--priority and --scope are options of atomic subscriptions")
        if isinstance(message, CompositeSubscription):
            handle = await client.subscribe_composite(message, durable=args.durable)
        elif isinstance(message, Subscription) and args.durable:
            handle = await client.subscribe(message.filter, durable=args.durable, **options)
        elif isinstance(message, Subscription):
            handle = await client.subscribe(message.filter, id=message.id, **options)
        else:  # pragma: no cover - parse_line returned what was asked
            raise CommandError("not a subscription")
        subscribed = f"subscribed {handle.id} at {client.broker}"
        if detached():
            announce(subscribed)  # the detaching command prints it
        else:
            print(subscribed, file=sys.stderr, flush=True)
        while args.count is None or received < args.count:
            try:
                delivery = await handle.get(args.timeout)
            except TimeoutError:
                break
            except ConnectionLost:
                if handle.replay is not None and not handle.replay.live:
                    break  # a historic subscription ends with its replay
                print("padres sub: the broker closed the connection", file=sys.stderr)
                return 1
            print(_format(delivery, args.json), flush=True)
            received += 1
        done = handle.replay
        if done is not None:
            failed = f"; did not finish: {', '.join(done.failed)}" if done.failed else ""
            answered = ", ".join(done.databases) or "no database"
            print(f"replayed {done.count} from {answered}{failed}", file=sys.stderr)
    except RequestFailed as exc:
        raise CommandError(str(exc)) from None
    finally:
        await client.close()
    return 0


# -- the shell ---------------------------------------------------------------------------------


def run_shell(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_shell(args))
    except (KeyboardInterrupt, EOFError):
        return 0


async def _shell(args: argparse.Namespace) -> int:
    client = await _connect(args, "shell")
    reader = BatchReader()
    interactive = sys.stdin.isatty()
    print(f"connected to {client.broker} as {client.session}; 'help' lists the commands")
    loop = asyncio.get_running_loop()
    show = _Shown()
    try:
        while True:
            if interactive:
                print("> ", end="", flush=True)
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            command = line.strip()
            if command in ("quit", "exit"):
                break
            await _shell_line(client, reader, command, show)
    finally:
        await client.close()
    return 0


_TABLES: Final = {
    "printsubs": "subscriptions",
    "printadvs": "advertisements",
    "printschemas": "schemas",
}


async def _shell_line(client: Client, reader: BatchReader, line: str, show: _Shown) -> None:
    word = line.split(maxsplit=1)[0] if line else ""
    try:
        if word == "help":
            print(SHELL_HELP)
        elif word in _TABLES:
            for row in await client.query(_TABLES[word]):
                print(row)
        elif word == "batch":
            path = line.split(maxsplit=1)[1] if " " in line else ""
            for lineno, text in enumerate(read_lines(path), 1):
                message = reader.parse_line(text, lineno, path)
                if message is not None:
                    await _send(client, message, show)
        elif line and not line.startswith("#"):
            message = reader.parse_line(line)
            if message is not None:
                await _send(client, message, show)
    except (ParseError, CommandError, RequestFailed) as exc:
        print(f"error: {exc}", flush=True)


class _Shown:
    """Prints each delivery once, with every subscription of the shell it matched: the broker
    sends one notification naming them all, which the client hands to each subscription."""

    def __init__(self) -> None:
        self._last: Delivery | None = None

    def __call__(self, delivery: Delivery) -> None:
        if delivery is not self._last:
            self._last = delivery
            print(_format(delivery, False), flush=True)


async def _send(client: Client, message: object, show: _Shown) -> None:
    match message:
        case Publication():  # with an id of this run, made by the client
            await client.publish(dict(message.attributes))
        case Subscription():
            await client.subscribe(message.filter, show, id=message.id)
            print(f"subscribed {message.id}: {format_filter(message.filter)}")
        case CompositeSubscription():
            await client.subscribe_composite(message, show)
            print(f"subscribed {message.id}")
        case Advertisement():
            await client.advertise(message.filter, id=message.id)
            print(f"advertised {message.id}: {format_filter(message.filter)}")
        case Unsubscribe():
            await client.unsubscribe(message.subscription_id)
            print(f"unsubscribed {message.subscription_id}")
        case Unadvertise():
            await client.unadvertise(message.advertisement_id)
            print(f"unadvertised {message.advertisement_id}")
