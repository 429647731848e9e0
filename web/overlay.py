"""The whole overlay as the monitor sees it, learned by publish/subscribe as PADRES' monitor
did: every broker publishes a ``BROKER_INFO`` publication about itself each ``PERIOD`` and
subscribes to everyone's; a broker not heard from for ``FORGET`` seconds is gone.

A ``BROKER_INFO`` publication: ``[class,'BROKER_INFO'],[broker,'B1'],[info,'<JSON>']``, the
JSON holding its neighbours, clients, the databases it knows of (their replay offers), its
address, uptime, queue bytes and its publications in and out per peer.

Monitoring costs traffic and routing state, so it runs only while someone watches: a broker
whose overlay, page or traces were asked for in the last ``IDLE`` seconds advertises
``MONITOR_WATCH``; that advertisement floods the overlay and wakes every broker's monitor
session, which runs while some broker's ``MONITOR_WATCH`` is in its routing table (or it is
asked itself), and ends, withdrawing its advertisements, when none is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Any, Final

import orjson

from padres.client.connection import Client, ClientState, SubscriptionHandle
from padres.errors import ConnectionLost, RequestFailed
from padres.model.messages import Publication
from padres.model.protocol import Notify, RouteAdvertise
from padres.runtime.node import Handled
from web.broker import databases
from web.clients import Clients, connect
from web.metrics import Metrics
from web.problems import Problem
from web.tracing import REPORT, REQUEST, Tracer

__all__ = ["FORGET", "INFO", "MONITOR", "PERIOD", "Overlay"]

INFO: Final = "BROKER_INFO"
MONITOR: Final = "monitor"
"""The name of each broker's monitoring session (left out of the clients it reports)."""
PERIOD: Final = 1.0
IDLE: Final = 60.0
"""Seconds after the last request for the overlay that this broker stops watching it."""
WATCH: Final = "MONITOR_WATCH"
FORGET: Final = 3.5
"""Seconds without a report after which a broker is shown down."""
DOWN_MEMORY: Final = 24 * 3600.0
DOWN_MOST: Final = 1000
"""A broker shown down is shown for a day at most, and at most this many of them."""
FIRST_ROUND: Final = 3 * PERIOD
"""Seconds the first request after a quiet time waits for the brokers' first reports."""
RETRY: Final = 1.0
CHANNELS: Final = {
    INFO: ("broker", "info"),
    REQUEST: ("trace", "filter", "targets"),
    REPORT: ("trace", "report"),
}
"""The classes the monitor sessions publish and subscribe to, and their attributes."""
PRIVATE: Final = frozenset([*CHANNELS, WATCH])
"""The monitor's own classes: never traced, nor counted in the metrics and rates."""

log = logging.getLogger("padres.web")


class Overlay:
    """What this broker has learned of the overlay (see the module docstring)."""

    def __init__(self, clients: Clients, metrics: Metrics, tracer: Tracer) -> None:
        self.clients = clients
        self.metrics = metrics
        self.tracer = tracer
        self.brokers: dict[str, dict[str, Any]] = {}
        self._heard: dict[str, float] = {}
        self.down: dict[str, dict[str, Any]] = {}
        """Brokers not heard from for ``FORGET`` seconds: their last report, oldest first."""
        self._count = 0
        self._asked = -IDLE
        """When (``time.monotonic()``) the overlay was last asked for here."""
        self._nudged = asyncio.Event()

    def watch(self) -> None:
        """Someone wants the overlay (the page, the API, a trace): monitor it."""
        self._asked = time.monotonic()
        self._nudged.set()

    def _watched_here(self) -> bool:
        return time.monotonic() - self._asked < IDLE

    def _watched(self) -> bool:
        """Whether this broker or another watches the overlay (another's ``MONITOR_WATCH``
        advertisement is in the routing table)."""
        if self._watched_here():
            return True
        broker = self.clients.node.broker
        return any(
            tree.path[0] != broker.id and adv.filter.class_name == WATCH
            for tree in broker.trees
            for adv in tree.advertisements.values()
        )

    def observe(self, hop: str, handled: list[Handled]) -> None:
        """A ``BrokerNode`` observer: another broker's ``MONITOR_WATCH`` wakes this one."""
        for message, _, _ in handled:
            if (
                isinstance(message, RouteAdvertise)
                and message.advertisement.filter.class_name == WATCH
            ):
                self._nudged.set()

    def own_info(self) -> dict[str, Any]:
        node = self.clients.node
        broker = node.broker
        status = node.status()
        clients = [s.name for s in broker.sessions.values() if not s.name.startswith(MONITOR + "@")]
        url = f"http://{node.address[0]}:{node.address[1]}" if node.address else ""
        return {
            "id": broker.id,
            "url": url,
            "neighbours": sorted(broker.peers.values()),
            "clients": sorted(clients),
            "databases": databases(self.clients),
            "uptime": status["uptime"],
            "queued_bytes": status["queued_bytes"],
            "dropped": status["dropped"],
            "evicted": status["evicted"],
            "rejected": status["rejected"],
            "publications": self.metrics.totals,
            "version": version("padres"),
            "time": time.time(),
        }

    async def fresh_view(self) -> dict[str, Any]:
        """``view``, after waiting (``FIRST_ROUND`` at most) for a report from this broker and
        from every neighbour the reports name, when the overlay was not watched until now."""
        quiet = not self._watched_here()
        self.watch()
        if quiet:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + FIRST_ROUND
            while loop.time() < deadline and not self._complete():
                await asyncio.sleep(PERIOD / 10)
        return self.view()

    async def brokers_now(self) -> set[str]:
        """The ids of the overlay's brokers (after ``fresh_view``'s wait, if it waits)."""
        return {str(info["id"]) for info in (await self.fresh_view())["brokers"]}

    def _complete(self) -> bool:
        """Whether this broker and every broker a report names as a neighbour reported."""
        own = self.clients.node.broker.id
        named = {n for info in self.brokers.values() for n in info["neighbours"]}
        return own in self.brokers and named <= self.brokers.keys()

    def view(self) -> dict[str, Any]:
        """Brokers, links, clients and databases of the overlay now."""
        self.watch()
        self._forget()
        brokers = sorted(self.brokers)
        links = sorted(
            {
                tuple(sorted((b, n)))
                for b, info in self.brokers.items()
                for n in info["neighbours"]
                if n in self.brokers
            }
        )
        stores: dict[str, list[str]] = {}
        for info in self.brokers.values():
            stores |= info["databases"]
        clients = [
            {"name": c, "broker": b, "database": c in stores}
            for b, info in sorted(self.brokers.items())
            for c in info["clients"]
        ]
        return {
            "brokers": [self.brokers[b] for b in brokers],
            "down": [
                {"id": b, "url": info.get("url", ""), "last_seen": info.get("time")}
                for b, info in sorted(self.down.items())
            ],
            "links": [{"source": a, "target": b} for a, b in links],
            "clients": clients,
            "databases": [
                {"id": name, "broker": name.split("@")[-1], "stores": specs}
                for name, specs in sorted(stores.items())
            ],
        }

    def _forget(self) -> None:
        """Brokers silent for ``FORGET`` seconds go down; those down for too long go."""
        now = time.monotonic()
        for b in [b for b, at in self._heard.items() if now - at > FORGET]:
            del self._heard[b]
            info = self.brokers.pop(b, None)
            if info is not None:
                self.down.pop(b, None)
                self.down[b] = info
        long_ago = time.time() - DOWN_MEMORY
        for b in [b for b, info in self.down.items() if info.get("time", 0) < long_ago]:
            del self.down[b]
        while len(self.down) > DOWN_MOST:
            del self.down[next(iter(self.down))]

    def _heard_from(self, pub: Publication) -> None:
        text = pub.attributes.get("info")
        if not isinstance(text, str):
            return
        try:
            info = orjson.loads(text)
        except orjson.JSONDecodeError:
            return
        if isinstance(info, dict) and isinstance(info.get("id"), str):
            self.brokers[info["id"]] = info
            self._heard[info["id"]] = time.monotonic()
            self.down.pop(info["id"], None)

    async def run(self) -> None:
        """Publish this broker's info and learn everyone's while the overlay is watched."""
        while True:
            await self._nudged.wait()
            self._nudged.clear()
            if not self._watched():
                continue
            client: Client | None = None
            try:
                client = await connect(self.clients.node, MONITOR)
                await self._serve(client)
            except (Problem, RequestFailed, ConnectionLost, TimeoutError) as exc:
                log.warning("monitor: %s; starting again", exc)
                self._nudged.set()
                await asyncio.sleep(RETRY)
            finally:
                if client is not None:
                    with contextlib.suppress(Exception):
                        await client.close()

    async def _serve(self, client: Client) -> None:
        heard = []
        for kind, fields in CHANNELS.items():
            predicates = "".join(f",[{f},isPresent,'']" for f in fields)
            await client.advertise(f"[class,eq,'{kind}']{predicates}", id=kind)
            heard.append(await client.subscribe(f"[class,eq,'{kind}']", id=kind))
        sending: set[asyncio.Task[None]] = set()

        def publish(attributes: dict[str, str]) -> None:
            self._count += 1
            if client.state is ClientState.OPEN:
                now = datetime.now(UTC)
                pub = Publication(f"m{self._count}", attributes, now, client.session)
                task = asyncio.get_running_loop().create_task(client.publish_many([pub]))
                sending.add(task)
                task.add_done_callback(sending.discard)

        reading = asyncio.get_running_loop().create_task(self._read(client, heard))
        self.tracer.publish = publish
        watching = False
        try:
            while not reading.done() and self._watched():
                if watching != self._watched_here():
                    watching = not watching
                    await _watching(client, watching)
                info = self.own_info()
                publish({"class": INFO, "broker": info["id"], "info": orjson.dumps(info).decode()})
                await asyncio.sleep(PERIOD)
            if reading.done():
                await reading
        finally:
            self.tracer.publish = None
            reading.cancel()

    async def _read(self, client: Client, heard: list[SubscriptionHandle]) -> None:
        """What the monitor's subscriptions deliver, until its client is gone."""
        async with asyncio.TaskGroup() as group:
            for handle in heard:
                group.create_task(self._take(handle))
        raise ConnectionLost(client.closed_reason or "the monitor's client closed")

    async def _take(self, handle: SubscriptionHandle) -> None:
        async for message in handle:
            if not isinstance(message, Notify):
                continue
            if message.publication.attributes.get("class") == INFO:
                self._heard_from(message.publication)
            else:
                self.tracer.heard(message.publication)


async def _watching(client: Client, on: bool) -> None:
    """Advertise (or withdraw) ``MONITOR_WATCH``: the other brokers monitor while it stands."""
    if on:
        await client.advertise(f"[class,eq,'{WATCH}']", id=WATCH)
    else:
        await client.unadvertise(WATCH)
