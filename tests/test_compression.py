"""Compressed WebSocket connections (permessage-deflate): a broker negotiates it with a client
that offers it, and only with one that does; deliveries are the same either way; links
between brokers may be compressed; a compressed frame is bounded by its size once inflated."""

from __future__ import annotations

import asyncio
import contextlib
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosedError

import padres.runtime.node as node_module
from padres.broker import Broker
from padres.client.connection import Client
from padres.client.transport import WebSocketTransport
from padres.model.protocol import Notify
from padres.runtime.compression import client_extensions, server_extensions
from padres.runtime.node import BrokerNode, Limits
from padres.testing.cluster import cluster
from padres.testing.processes import BrokerProcess

QUOTE = "[class,eq,'Quote'],[n,isPresent,0],[symbol,isPresent,'']"


def _quote(n: int) -> dict[str, Any]:
    return {"class": "Quote", "n": n, "symbol": f"S{n % 7}", "price": 100.0 + n / 8}


def _compressed(client: Client) -> bool:
    transport = client.transport
    assert isinstance(transport, WebSocketTransport)
    return transport.compressed


@contextlib.asynccontextmanager
async def _served(**options: Any) -> AsyncIterator[str]:
    """One broker node serving on a free loopback port: its WebSocket URL."""
    node = BrokerNode(Broker("B1"), **options)
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    serving = asyncio.ensure_future(node.serve(port=0, ready=ready.set_result))
    try:
        port = await asyncio.wait_for(ready, 10)
        yield f"ws://127.0.0.1:{port}/ws"
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving


async def _receive(subscriber: Client, publisher: Client, count: int) -> list[Notify]:
    wanted = await subscriber.subscribe("[class,eq,'Quote'],[n,>=,0]")
    await publisher.advertise(QUOTE)
    for n in range(count):
        await publisher.publish(_quote(n))
    got = [await wanted.get(10) for _ in range(count)]
    assert all(isinstance(d, Notify) for d in got)
    return got  # type: ignore[return-value]


async def test_a_client_that_offers_compression_gets_it_and_the_same_deliveries() -> None:
    async with (
        _served() as url,
        Client(url, "packed", compress=True) as packed,
        Client(url, "plain") as plain,
        Client(url, "pub") as publisher,
    ):
        assert _compressed(packed)
        assert not _compressed(plain)  # a client that does not offer it is served as before
        assert not _compressed(publisher)
        subscription = await plain.subscribe("[class,eq,'Quote'],[n,>=,0]")
        got = await _receive(packed, publisher, 50)
        also = [await subscription.get(10) for _ in range(50)]
        assert [d.publication for d in got] == [d.publication for d in also]  # type: ignore[union-attr]
        assert [d.publication.attributes for d in got] == [_quote(n) for n in range(50)]
        # and what it sends goes compressed too
        await packed.advertise(QUOTE)
        await packed.publish(_quote(99))
        assert (await subscription.get(10)).publication.attributes == _quote(99)  # type: ignore[union-attr]


async def test_the_handshake_says_permessage_deflate_at_the_brokers_window() -> None:
    async with (
        _served() as url,
        connect(url, compression=None, extensions=client_extensions(1)) as offered,
        connect(url, compression=None) as silent,
        connect(url) as default,  # websockets' own offer, a browser's: no window asked for
    ):
        assert offered.response is not None and silent.response is not None
        accepted = offered.response.headers.get("Sec-WebSocket-Extensions")
        assert accepted is not None and accepted.startswith("permessage-deflate")
        assert "server_max_window_bits=12" in accepted
        assert silent.response.headers.get("Sec-WebSocket-Extensions") is None
        assert [e.name for e in default.protocol.extensions] == ["permessage-deflate"]


async def test_a_broker_with_compression_off_accepts_it_from_nobody() -> None:
    async with _served(compression=None) as url, Client(url, "packed", compress=True) as packed:
        assert not _compressed(packed)
        assert await packed.query("subscriptions") == ()


def test_a_compression_level_is_checked() -> None:
    with pytest.raises(ValueError, match="give 1"):
        server_extensions(0)
    with pytest.raises(ValueError, match="give 1"):
        BrokerNode(Broker("B1"), compression=10)


async def test_a_compressed_frame_that_inflates_beyond_the_limit_is_refused() -> None:
    """64 KiB that inflate to 64 MiB, to a broker that takes frames of 256 KiB at most (four
    times ``frame_bytes``): the connection is closed with 1009 as the frame is inflated, no
    more than the limit of it is ever held (the process's peak allocation stays a few times the
    limit), and the broker serves on."""
    limits = Limits(frame_bytes=64 << 10)
    payload = b"[" + b" " * (64 << 20) + b"]"
    assert len(zlib.compress(payload, 9)) < limits.frame_bytes
    async with _served(limits=limits) as url:
        async with connect(url, compression=None, extensions=client_extensions(9)) as bomb:
            assert [e.name for e in bomb.protocol.extensions] == ["permessage-deflate"]
            await bomb.send(orjson.dumps({"type": "hello", "name": "bomb"}))
            await bomb.recv()
            tracemalloc.start()
            try:
                await bomb.send(payload)
                with pytest.raises(ConnectionClosedError) as closed:
                    await asyncio.wait_for(bomb.recv(), 10)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1009
        assert "exceeds limit of 262144 bytes" in closed.value.rcvd.reason
        assert peak < 4 << 20, peak
        async with Client(url, "after", compress=True) as after:
            assert await after.query("subscriptions") == ()


async def test_a_frame_under_the_closing_limit_but_over_frame_bytes_is_refused_politely() -> None:
    limits = Limits(frame_bytes=64 << 10)
    async with (
        _served(limits=limits) as url,
        connect(url, compression=None, extensions=client_extensions(1)) as ws,
    ):
        await ws.send(orjson.dumps({"type": "hello", "name": "big"}))
        await ws.recv()
        await ws.send(b"[" + b" " * (128 << 10) + b"]")
        refusal = orjson.loads(await asyncio.wait_for(ws.recv(), 10))
        assert "frame refused" in refusal[0]["text"]


class _Dialled:
    """``connect`` as the node calls it, keeping each connection it opens."""

    def __init__(self, real: Callable[..., Any], opened: list[ClientConnection]) -> None:
        self._real = real
        self._opened = opened

    def __call__(self, *args: Any, **kwargs: Any) -> _Dialled:
        self._connecting = self._real(*args, **kwargs)
        return self

    async def __aenter__(self) -> ClientConnection:
        ws: ClientConnection = await self._connecting.__aenter__()
        self._opened.append(ws)
        return ws

    async def __aexit__(self, *exc: object) -> Any:
        return await self._connecting.__aexit__(*exc)


async def _linked(monkeypatch: pytest.MonkeyPatch, compress_links: bool) -> list[str]:
    """The extensions of the link B2 dials to B1, once deliveries cross it."""
    opened: list[ClientConnection] = []
    monkeypatch.setattr(node_module, "connect", _Dialled(connect, opened))
    async with cluster(2, compress_links=compress_links) as c:
        assert len(opened) == 1
        far = await c.client(1, "far")
        near = await c.client(0, "near")
        got = await _receive(far, near, 30)
        assert [d.publication.attributes for d in got] == [_quote(n) for n in range(30)]
        return [e.name for e in opened[0].protocol.extensions]


async def test_a_link_is_compressed_when_its_broker_offers_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert await _linked(monkeypatch, compress_links=True) == ["permessage-deflate"]


async def test_a_link_is_not_compressed_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert await _linked(monkeypatch, compress_links=False) == []


async def test_the_broker_command_sets_the_level_or_turns_compression_off(
    brokers: dict[str, BrokerProcess],
) -> None:
    brokers["B1"] = BrokerProcess("B1", options=["--compression", "0"])
    brokers["B2"] = BrokerProcess("B2", options=["--compression", "9"])
    off, nine = brokers["B1"].start(), brokers["B2"].start()
    async with Client(off, "a", compress=True) as a, Client(nine, "b", compress=True) as b:
        assert not _compressed(a)
        assert _compressed(b)
        assert await b.query("subscriptions") == ()
