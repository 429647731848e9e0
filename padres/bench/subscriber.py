"""``padres bench hop --client``: what a subscriber client costs a delivery, in CPU time.

The chain of ``padres bench network`` is built in the simulation (``hop.chain``) and B2's core
is handed the quotes, as from B1; what it sends its subscriber client (``sub1``, holding its
third of the workload as one ``subscribe_many`` group) is recorded: the notifications, each
encoded once and joined into frames of ``frame`` of them, as a broker's send queue joins them
(in the chain a subscriber's frames held about 150 notifications each).

A process of its own (``spawn``) then plays that subscriber's broker over a WebSocket on
loopback: it answers the client's hello and subscriptions, and sends every recorded frame when
the client asks for its subscriptions (``Client.query``), the answer after them. A real
``Client`` in this process, subscribed as the chain's subscribers are and counting as they
do (``network.Deliveries``), reads it all: the socket, the WebSocket, decoding, handing each
delivery to its subscription and the callback. Its process CPU time from the query until the
answer, per delivery, is the figure; the median and the best of the repetitions are reported.
The broker's side runs in the other process and is not counted.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import statistics
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final

from msgspec.structs import replace
from websockets.asyncio.server import ServerConnection, serve

from padres.bench import machine
from padres.bench.hop import FRAME, chain
from padres.bench.network import Deliveries
from padres.bench.workloads import stock_publications
from padres.client.connection import Client
from padres.model.codec import encode, encode_frame
from padres.model.protocol import (
    Hello,
    Notify,
    Ok,
    Query,
    QueryResult,
    RoutePublish,
    Subscribe,
    Welcome,
    decode_frame,
)
from padres.runtime import collector
from padres.runtime.pump import Pump

__all__ = ["record", "report", "run"]

NOTIFICATIONS: Final = 150
"""Notifications a frame, by default (about as many as a subscriber's frames held in the chain)."""


def record(subs: int, pubs: int, frame: int, data: Path | None = None) -> list[bytes]:
    """The frames B2 sends its subscriber client for the first ``pubs`` quotes."""
    every = stock_publications(data)
    sim = chain(subs, every)
    core = sim.brokers["B2"]
    source = next(hop for hop, name in core.peers.items() if name == "B1")
    tree = next(iter(sim.brokers["B1"].trees)).id
    pump = Pump(core, lambda outs: None)
    quotes = [
        RoutePublish(replace(q, id=f"p{i}", publisher="publisher@B1"), tree)
        for i, q in enumerate(every[:pubs])
    ]
    encoded: list[bytes] = []
    for start in range(0, len(quotes), FRAME):
        _, outs, _ = pump.walk(source, quotes[start : start + FRAME], lambda: sim.clock)
        encoded += [encode(m) for hop, m in outs if hop == "sub1" and isinstance(m, Notify)]
    return [b"[" + b",".join(encoded[i : i + frame]) + b"]" for i in range(0, len(encoded), frame)]


def _broker(conn: Connection, frames: list[bytes]) -> None:
    """The subscriber's broker, in a process of its own: tells its port through ``conn``."""
    asyncio.run(_serve(conn, frames))


async def _serve(conn: Connection, frames: list[bytes]) -> None:
    async def handler(ws: ServerConnection) -> None:
        async for data in ws:
            replies: list[Any] = []
            for item in decode_frame(data if isinstance(data, bytes) else data.encode()):
                match item:
                    case Hello():
                        replies.append(Welcome("B2", item.name))
                    case Subscribe():
                        replies.append(Ok(item.subscription.id))
                    case Query():
                        for frame in frames:
                            await ws.send(frame)
                        replies.append(QueryResult(item.what, ()))
            if replies:
                await ws.send(encode_frame(replies))

    async with serve(handler, "127.0.0.1", 0, compression=None, max_size=None) as server:
        conn.send(server.sockets[0].getsockname()[1])
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)  # until told to stop


async def _measure(url: str, frames: list[bytes], repeat: int) -> tuple[int, list[float]]:
    counter = Deliveries()
    spent: list[float] = []
    async with Client(url, "sub1", timeout=60) as client:
        await client.subscribe_many(["[class,eq,'STOCK']"], counter, id="g")
        collector.freeze()  # loaded: settled as a subscriber process settles it
        for _ in range(repeat):
            counter.reset()
            started = time.process_time()
            await client.query("subscriptions")
            spent.append(time.process_time() - started)
    return counter.count, spent


def run(
    subs: int = 10_000,
    pubs: int = 20_000,
    repeat: int = 7,
    frame: int = NOTIFICATIONS,
    data: Path | None = None,
) -> dict[str, Any]:
    frames = record(subs, pubs, frame, data)
    context = multiprocessing.get_context("spawn")
    here, there = context.Pipe()
    broker = context.Process(target=_broker, args=(there, frames), daemon=True)
    broker.start()
    try:
        if not here.poll(120):
            raise TimeoutError("the recorded broker did not start")
        port = here.recv()
        count, spent = asyncio.run(_measure(f"ws://127.0.0.1:{port}/", frames, repeat))
    finally:
        here.send("stop")
        broker.join(10)
        if broker.is_alive():
            broker.kill()
    per = [s / count * 1e6 for s in spent]
    return {
        "machine": machine(),
        "subscriptions": subs,
        "publications": pubs,
        "deliveries": count,
        "frames": len(frames),
        "per_frame": frame,
        "median_us": statistics.median(per),
        "best_us": min(per),
        "runs_us": per,
    }


def report(r: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"subscriber client of B2 in the chain ({r['subscriptions']:,} subscriptions, a "
            f"third as one group), {r['publications']:,} quotes: {r['deliveries']:,} "
            f"deliveries in {r['frames']:,} frames of {r['per_frame']} over a WebSocket",
            f"  CPU per delivery: median {r['median_us']:.2f} us, best {r['best_us']:.2f} us",
        ]
    )
