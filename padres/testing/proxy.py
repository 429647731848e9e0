"""A TCP proxy placed on a link between two brokers, to make faults on it: a slow link, a delay,
a stall, a cut, and the way restored.

``Proxy(port)`` forwards what reaches it to ``port`` (on ``host``, 127.0.0.1 by default); a
broker given the proxy's URL (``await proxy.start()``) as its neighbour links through it. It
runs in the caller's event loop, so a test that drives it must wait without blocking the loop.

- ``rate``: what goes toward the port is held to that many bytes a second (a slow link);
- ``delay``: every chunk, either way, is forwarded that many seconds after it was read (a long
  link), without lowering the throughput; it may be changed at any time;
- ``stall()``: nothing more is forwarded, either way, until ``resume()``, and nothing is closed:
  a peer that stopped reading and answering, or a silent partition;
- ``cut()``: every connection through the proxy is closed and no more are taken (a lost way
  to the port), until ``restore()`` listens again on the same address.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

__all__ = ["Proxy"]

_CHUNK = 16384
_IN_FLIGHT = 64
"""Chunks a delayed direction holds at most; past that it stops reading (TCP slows the sender)."""


class Proxy:
    """A TCP proxy in front of ``host``:``port`` (see the module docstring)."""

    def __init__(
        self,
        port: int,
        rate: float | None = None,
        buffers: int | None = None,
        *,
        host: str = "127.0.0.1",
        listen: str = "127.0.0.1",
        delay: float = 0.0,
    ) -> None:
        """``buffers``: the bytes of kernel buffer its sockets toward ``port`` ask for, and
        of its own reading (the system's defaults if None): what a stalled proxy holds.
        ``listen``: the address the proxy listens on (where the dialling broker reaches it)."""
        self.port = port
        self.host = host
        self.listen = listen
        self.rate = rate
        self.buffers = buffers
        self.delay = delay
        self.address: tuple[str, int] | None = None
        """Where the proxy listens, once started."""
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._flowing = asyncio.Event()
        self._flowing.set()

    @property
    def url(self) -> str:
        """The proxy's ``ws://`` URL, once started."""
        if self.address is None:
            raise RuntimeError("the proxy is not started")
        return f"ws://{self.address[0]}:{self.address[1]}/ws"

    async def start(self) -> str:
        """Listen (on a free port the first time, on the same one again after ``cut``);
        returns the proxy's ``ws://`` URL."""
        port = 0 if self.address is None else self.address[1]
        self._server = await asyncio.start_server(self._serve, self.listen, port)
        self.address = (self.listen, self._server.sockets[0].getsockname()[1])
        return self.url

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await self._connect()
        except OSError:
            writer.transport.abort()
            return
        self._writers += [writer, up_writer]
        try:
            await asyncio.gather(
                self._pipe(reader, writer, up_writer, self.rate),
                self._pipe(up_reader, up_writer, writer, None),
            )
        except asyncio.CancelledError:
            # The loop is ending. Not raised on: asyncio's streams would log a cancelled
            # connection handler as an error.
            writer.transport.abort()
            up_writer.transport.abort()
        finally:
            self._writers = [w for w in self._writers if w not in (writer, up_writer)]

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.buffers is None:
            return await asyncio.open_connection(self.host, self.port)
        up = socket.socket()
        up.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.buffers)
        up.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.buffers)
        up.setblocking(False)
        await asyncio.get_running_loop().sock_connect(up, (self.host, self.port))
        return await asyncio.open_connection(sock=up, limit=self.buffers)

    async def _pipe(
        self,
        source: asyncio.StreamReader,
        source_side: asyncio.StreamWriter,
        sink: asyncio.StreamWriter,
        rate: float | None,
    ) -> None:
        """Forward ``source`` to ``sink``: read chunks are stamped and queued, and written
        ``delay`` seconds after they were read. Without a delay the reading waits for each
        chunk to be taken (the proxy holds two at most, so a slow sink slows the source);
        with one it reads up to ``_IN_FLIGHT`` chunks ahead."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        taken = asyncio.Event()
        writing = asyncio.ensure_future(self._write(queue, taken, sink, source_side, rate))
        with contextlib.suppress(ConnectionError):
            while True:
                await self._flowing.wait()
                data = await source.read(_CHUNK)
                if not data:
                    break
                queue.put_nowait((time.monotonic(), data))
                while queue.qsize() >= (_IN_FLIGHT if self.delay else 1):
                    taken.clear()
                    await taken.wait()
        queue.put_nowait((time.monotonic(), b""))  # the end, however the reading ended
        await writing
        sink.close()

    async def _write(
        self,
        queue: asyncio.Queue[tuple[float, bytes]],
        taken: asyncio.Event,
        sink: asyncio.StreamWriter,
        source_side: asyncio.StreamWriter,
        rate: float | None,
    ) -> None:
        """Write what ``queue`` holds to ``sink`` until its end. A sink that fails closes the
        source's side (as a cut would), and what comes meanwhile is taken and dropped, so
        that the reading is never held up."""
        failed = False
        while True:
            read_at, data = await queue.get()
            taken.set()
            if not data:
                return
            if failed:
                continue
            try:
                due = read_at + self.delay - time.monotonic()
                if due > 0:
                    await asyncio.sleep(due)
                await self._flowing.wait()  # what was read as it stalled waits too
                sink.write(data)
                await sink.drain()
            except ConnectionError:
                failed = True
                source_side.transport.abort()
                continue
            if rate is not None:
                await asyncio.sleep(len(data) / rate)

    def stall(self) -> None:
        """Forward nothing more, either way, until ``resume``: the sockets stay open and
        unread, so what is sent toward them fills the buffers on the way."""
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    async def cut(self) -> None:
        """Close every connection through the proxy, and take no more until ``restore``."""
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def restore(self) -> None:
        """Listen again, on the same address, after ``cut``."""
        if self._server is None:
            await self.start()
