"""What the tests with real processes share: waiting for a condition, a broker's status."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import orjson

from padres.client.connection import Delivery
from padres.model.protocol import Notify, http_url
from padres.runtime.backoff import Backoff

__all__ = ["Numbers", "Proxy", "eventually", "health", "wait_linked"]


async def eventually(check: Callable[[], bool | Awaitable[bool]], timeout: float = 15.0) -> None:
    """Wait until ``check`` holds; ``AssertionError`` after ``timeout`` seconds.

    The checks come quickly at first and then a few times a second, which stays under a
    broker's limit on queries when ``check`` asks one."""
    deadline = time.monotonic() + timeout
    backoff = Backoff(first=0.02, most=0.25)
    while True:
        result = check()
        if result if isinstance(result, bool) else await result:
            return
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await backoff.wait()


def health(url: str, admin: tuple[str, str] | None = None) -> dict[str, Any]:
    """``/health`` of the broker at ``url`` (its ``ws://`` address); of a broker with accounts,
    the same figures from ``/api/v1/broker`` as the administrator ``admin`` (user, password)."""
    base = http_url(url)
    if admin is None:
        with urllib.request.urlopen(f"{base}/health") as r:
            return orjson.loads(r.read())  # type: ignore[no-any-return]
    request = urllib.request.Request(f"{base}/api/v1/broker")
    login = base64.b64encode(":".join(admin).encode()).decode()
    request.add_header("Authorization", f"Basic {login}")
    with urllib.request.urlopen(request) as r:
        return orjson.loads(r.read())["status"]  # type: ignore[no-any-return]


def wait_linked(
    links: Iterable[Sequence[str]], urls: Mapping[str, str], timeout: float = 15.0
) -> None:
    """Wait until the brokers at ``urls`` (by name) have each link of ``links`` up ("AB", or
    ("A", "B"): A and B are neighbours). A broker listens before its links are up: the
    neighbour it dials may have started after it, and it dials again after a backoff. Until
    then a publication is not routed across the missing link."""
    wanted: dict[str, set[str]] = {name: set() for name in urls}
    for link in links:
        wanted[link[0]].add(link[1])
        wanted[link[1]].add(link[0])
    deadline = time.monotonic() + timeout
    for name, url in urls.items():
        while set(health(url)["neighbours"]) != wanted[name]:
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} did not link to {sorted(wanted[name])} in time")
            time.sleep(0.05)


class Numbers:
    """A subscriber's callback keeping the ``n`` of each publication it gets, in order."""

    def __init__(self) -> None:
        self.got: list[int] = []

    def __call__(self, delivery: Delivery) -> None:
        assert isinstance(delivery, Notify)
        self.got.append(int(delivery.publication.attributes["n"]))


class Proxy:
    """A TCP proxy in front of a port on this machine: what goes toward that port can be held
    to ``rate`` bytes a second (a slow link), the proxy stalled (it forwards nothing either way
    until resumed, and closes nothing: a peer that stopped reading and answering), and cut (a
    lost way to it alone)."""

    def __init__(self, port: int, rate: float | None = None, buffers: int | None = None) -> None:
        """``buffers``: the bytes of kernel buffer its sockets toward ``port`` ask for, and
        of its own reading (the system's defaults if None): what a stalled proxy holds."""
        self.port = port
        self.rate = rate
        self.buffers = buffers
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._flowing = asyncio.Event()
        self._flowing.set()

    async def start(self) -> str:
        """Listen; returns the proxy's ``ws://`` URL."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"ws://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/ws"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.buffers is None:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        else:
            up = socket.socket()
            up.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.buffers)
            up.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.buffers)
            up.setblocking(False)
            await asyncio.get_running_loop().sock_connect(up, ("127.0.0.1", self.port))
            up_reader, up_writer = await asyncio.open_connection(sock=up, limit=self.buffers)
        self._writers += [writer, up_writer]
        await asyncio.gather(
            self._pipe(reader, up_writer, self.rate), self._pipe(up_reader, writer, None)
        )

    async def _pipe(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, rate: float | None
    ) -> None:
        with contextlib.suppress(ConnectionError):
            while True:
                await self._flowing.wait()
                data = await source.read(16384)
                if not data:
                    break
                await self._flowing.wait()  # what was read as it stalled waits too
                sink.write(data)
                await sink.drain()
                if rate is not None:
                    await asyncio.sleep(len(data) / rate)
        sink.close()

    def stall(self) -> None:
        """Forward nothing more, either way, until ``resume``: the sockets stay open and
        unread, so what is sent toward them fills the buffers on the way."""
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    async def cut(self) -> None:
        """Close every connection through the proxy, and take no more."""
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()
        if self._server is not None:
            await self._server.wait_closed()
