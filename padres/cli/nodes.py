"""What the commands that run a node beside a broker share: attaching to the broker, and
running until asked to stop."""

from __future__ import annotations

import asyncio
import contextlib
import signal

from padres.client import Client
from padres.errors import CommandError, ConnectionLost, RequestFailed

__all__ = ["attach", "until_stopped"]


async def attach(stack: contextlib.AsyncExitStack, url: str, name: str) -> Client:
    """A client named ``name`` of the broker at ``url``, dialling again whenever the link is
    lost; closed with ``stack``. The first dial must work: ``CommandError`` says why not."""
    client = Client(url, name, reconnect=True)
    try:
        await client.connect()
    except (ConnectionLost, RequestFailed, TimeoutError) as exc:
        raise CommandError(f"cannot connect to {url}: {exc}") from None
    stack.push_async_callback(client.close)
    return client


async def until_stopped() -> None:
    """Wait for SIGINT or SIGTERM."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
