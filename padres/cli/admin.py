"""``padres admin``: what an operator does to a running broker, through its web API (the
``web`` extra): list the durable subscriptions it keeps, delete one, close a client."""

from __future__ import annotations

import argparse
import base64
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Final

from padres.cli.addresses import DEFAULT_BROKER
from padres.cli.credentials import add_credential_options, credentials
from padres.errors import CommandError
from padres.model.protocol import http_url
from padres.security.tls import client_context

__all__ = ["arguments"]

TIMEOUT: Final = 10.0
"""Seconds a request to the broker may take."""


def arguments(p: argparse.ArgumentParser) -> None:
    verbs = p.add_subparsers(dest="verb", required=True, metavar="ACTION")
    ls = verbs.add_parser("durables", help="the durable subscriptions a broker keeps")
    _options(ls)
    ls.add_argument("--json", action="store_true", help="print each as a JSON line")
    ls.set_defaults(run=run_durables)
    rm = verbs.add_parser("drop-durable", help="delete a durable subscription, with its queue")
    _options(rm)
    rm.add_argument("owner", help="its client, as the broker names it (shop@B1)")
    rm.add_argument("name", help="the subscription's name")
    rm.set_defaults(run=run_drop)
    close = verbs.add_parser("close", help="close a client's connection")
    _options(close)
    close.add_argument("client", help="the client, as the broker names it (shop@B1)")
    close.set_defaults(run=run_close)


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--broker",
        default=DEFAULT_BROKER,
        metavar="URL",
        help=f"the broker, ws://host:port or host:port (default {DEFAULT_BROKER})",
    )
    p.add_argument(
        "--tls-ca",
        metavar="FILE",
        help="for a wss:// broker: PEM file of the CA certificates its certificate is checked "
        "against (default: the system's trusted authorities)",
    )
    add_credential_options(p, "the administrator")


def run_durables(args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = _call(args, "GET", "/durables")
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    if not rows:
        print("no durable subscriptions")
        return 0
    print(f"{'owner':<24} {'name':<16} {'state':<14} {'queued':>10} {'bytes':>12}  oldest")
    for row in rows:
        state = "connected" if row["connected"] else f"away {row['away'] or 0:.0f} s"
        print(
            f"{row['owner']:<24} {row['name']:<16} {state:<14} {row['queued']:>10,} "
            f"{row['queued_bytes']:>12,}  {row['oldest'] or '-'}"
        )
    return 0


def run_drop(args: argparse.Namespace) -> int:
    owner, name = (urllib.parse.quote(v, safe="") for v in (args.owner, args.name))
    _call(args, "DELETE", f"/durables/{owner}/{name}")
    print(f"deleted durable subscription {args.name!r} of {args.owner}")
    return 0


def run_close(args: argparse.Namespace) -> int:
    _call(args, "DELETE", f"/clients/{urllib.parse.quote(args.client, safe='')}")
    print(f"closed {args.client}")
    return 0


def _call(args: argparse.Namespace, method: str, path: str) -> Any:
    """One request to the broker's web API, as the administrator the options name; its
    problem's detail as a ``CommandError`` if it fails."""
    base = http_url(args.broker)
    request = urllib.request.Request(f"{base}/api/v1{path}", method=method)
    given = credentials(args)
    if given.token:
        request.add_header("Authorization", f"Bearer {given.token}")
    elif given.user:
        login = base64.b64encode(f"{given.user}:{given.password}".encode()).decode()
        request.add_header("Authorization", f"Basic {login}")
    context: ssl.SSLContext | None = (
        client_context(args.tls_ca) if base.startswith("https") else None
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT, context=context) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        raise CommandError(_problem(exc)) from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CommandError(f"cannot reach {base}: {reason}") from None
    return json.loads(body) if body else None


def _problem(exc: urllib.error.HTTPError) -> str:
    try:
        detail = json.loads(exc.read()).get("detail")
    except (ValueError, AttributeError):
        detail = None
    if exc.code == 404 and detail is None:
        return "this broker serves no web API (install padres[web])"
    return f"{exc.code}: {detail or exc.reason}"
