"""What the commands that run a node beside a broker share: attaching to the broker, and
running until asked to stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Coroutine, Sequence
from typing import Any

from padres.cli.logs import setup_logging
from padres.client.connection import Client
from padres.errors import AuthenticationError, CommandError, ConnectionLost, RequestFailed
from padres.security.accounts import Credentials

__all__ = ["attach", "run_node", "until_stopped"]


async def attach(
    stack: contextlib.AsyncExitStack,
    url: str | Sequence[str],
    name: str,
    credentials: Credentials | None = None,
    tls_ca: str | None = None,
) -> Client:
    """A client named ``name`` of the broker at ``url`` (or of the first of several that
    answers, failing over to the others), dialling again whenever the link is lost; closed
    with ``stack``. The first dial must work: ``CommandError`` says why not. ``tls_ca``: the
    CA file a ``wss://`` broker is checked against."""
    given = credentials or Credentials()
    client = Client(
        url,
        name,
        reconnect=True,
        user=given.user,
        password=given.password,
        token=given.token,
        tls_ca=tls_ca,
    )
    try:
        await client.connect()
    except (AuthenticationError, ConnectionLost, RequestFailed, TimeoutError) as exc:
        where = url if isinstance(url, str) else ", ".join(url)
        raise CommandError(f"cannot connect to {where}: {exc}") from None
    stack.push_async_callback(client.close)
    return client


async def until_stopped() -> None:
    """Wait for SIGINT or SIGTERM."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()


def run_node(
    main: Coroutine[Any, Any, int], *, quiet: bool, log: str, log_format: str = "text"
) -> int:
    """Run a node's ``main`` until it ends or is interrupted; the logger ``log`` reports at
    INFO even when ``quiet`` (what the node does matters to its operator)."""
    setup_logging(quiet, log_format)
    logging.getLogger(log).setLevel(logging.INFO)
    try:
        return asyncio.run(main)
    except KeyboardInterrupt:
        return 0
