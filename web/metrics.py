"""``/metrics``: the broker's counters in the Prometheus text format (prometheus-client).

Counted as the core handles messages (``BrokerNode.observers``): publications in and out per
peer (a neighbour broker or a database node by name; every other client together, as
``clients``, so that the series stay as few as the overlay's brokers and databases however
many clients come and go), subscriptions matched, how long the core took over each
publication, historic replays and the time from a subscription to its replay's end, and the
publications delivered to database nodes (their ingest). Queue depths, drops, the durable
subscriptions' backlog, the links and readiness are read from the node when scraped, with the
process's own figures (CPU, memory, descriptors) and the version.

Counting is on the broker's hot path, so it is plain integers in dicts; they become Prometheus
metrics only when scraped (``collect``).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator
from importlib.metadata import version
from typing import Final

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from padres.model.messages import CompositeSubscription, Publication, Subscription
from padres.model.protocol import (
    CompositeNotify,
    Envelope,
    Guaranteed,
    Notify,
    ReplayDone,
    ReplayOffer,
    RoutePublish,
    TxNotify,
)
from padres.runtime.node import BrokerNode, Handled

__all__ = ["CLIENTS", "Histogram", "Metrics", "published"]

CLIENTS: Final = "clients"
"""The peer that stands for every client but database nodes in the per-peer series."""

_SUBSCRIBING: Final = (Subscription, CompositeSubscription)
_DELIVERY: Final = frozenset({Notify, TxNotify, CompositeNotify})
"""Exact types: observers test every message, and a set lookup of its type is faster than
isinstance (none of these message types has other subclasses)."""


def published(message: Envelope) -> Publication | None:
    """The publication ``message`` publishes or routes, if it is one (transactions aside)."""
    if type(message) is Publication:
        return message
    if type(message) is RoutePublish or type(message) is Guaranteed:
        return message.publication
    return None


LATENCY_BUCKETS: Final = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0)
REPLAY_BUCKETS: Final = (0.01, 0.05, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
MAX_ASKED: Final = 10_000
"""Historic subscriptions timed to the end of their replay at once, at most."""


class Histogram:
    """Observations counted in buckets (upper bounds), with their sum."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def family(self, name: str, documentation: str) -> HistogramMetricFamily:
        cumulative: list[tuple[str, float]] = []
        total = 0
        for bound, count in zip([*map(str, self.bounds), "+Inf"], self.counts, strict=True):
            total += count
            cumulative.append((bound, total))
        return HistogramMetricFamily(name, documentation, buckets=cumulative, sum_value=self.sum)


def _per_peer(name: str, documentation: str, counts: dict[str, int], label: str) -> Metric:
    family = CounterMetricFamily(name, documentation, labels=[label])
    for peer, count in sorted(counts.items()):
        family.add_metric([peer], count)
    return family


def _total(name: str, documentation: str, value: float) -> Metric:
    family = CounterMetricFamily(name, documentation)
    family.add_metric([], value)
    return family


class Metrics(Collector):
    """The counters of one node, its Prometheus registry, and the totals the monitor shows."""

    def __init__(self, node: BrokerNode, private: frozenset[str] = frozenset()) -> None:
        """``private``: classes of publications not counted (the monitor's own)."""
        self.node = node
        self.private = private
        self.totals: dict[str, dict[str, int]] = {"in": {}, "out": {}}
        """Publications in and out per peer name (also the monitor's rates)."""
        self.matched = 0
        self.latency = Histogram(LATENCY_BUCKETS)
        self.replays = 0
        self.replay_latency = Histogram(REPLAY_BUCKETS)
        self.ingest: dict[str, int] = {}
        self.registry = CollectorRegistry()
        self.registry.register(self)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self._databases: set[str] = set()
        """The hops of database nodes (they offer replay)."""
        self._asked: dict[tuple[str, str], float] = {}

    def name(self, hop: str) -> str:
        """The broker or client on ``hop`` (the hop itself once it is gone)."""
        broker = self.node.broker
        session = broker.sessions.get(hop)
        return session.name if session is not None else broker.peers.get(hop, hop)

    def _peer(self, hop: str) -> str:
        """``hop`` as the per-peer series name it: a neighbour or a database node by name,
        any other client as ``CLIENTS``."""
        broker = self.node.broker
        neighbour = broker.peers.get(hop)
        if neighbour is not None:
            return neighbour
        return self.name(hop) if hop in self._databases else CLIENTS

    def _count(self, table: dict[str, int], hop: str, count: int) -> str:
        peer = self._peer(hop)
        table[peer] = table.get(peer, 0) + count
        return peer

    def observe(self, hop: str, handled: list[Handled]) -> None:
        """A ``BrokerNode`` observer: count what the core just did."""
        ins = 0
        matched = 0
        routed: dict[str, int] = {}
        """Publications routed to each neighbour."""
        delivered: dict[str, int] = {}
        """Deliveries to each client: what a database ingests."""
        private = self.private
        latency = self.latency.observe
        for message, sent, took in handled:
            pub = published(message)
            if pub is not None:
                if pub.attributes.get("class") in private:
                    continue
                ins += 1
                latency(took)
            elif isinstance(message, ReplayOffer):
                self._databases.add(hop)
            elif isinstance(message, _SUBSCRIBING) and _historic(message):
                self._asked[(hop, message.id)] = time.monotonic()
                if len(self._asked) > MAX_ASKED:  # asked by clients that left before the end
                    del self._asked[next(iter(self._asked))]
            for to, out in sent:
                kind = type(out)
                if kind is RoutePublish:
                    routed[to] = routed.get(to, 0) + 1
                elif kind in _DELIVERY:
                    delivered[to] = delivered.get(to, 0) + 1
                    matched += len(out.subscriptions) if isinstance(out, Notify) else 1
                elif isinstance(out, ReplayDone):
                    self.replays += 1
                    asked = self._asked.pop((to, out.subscription), None)
                    if asked is not None:
                        self.replay_latency.observe(time.monotonic() - asked)
        self.matched += matched
        if ins:
            self._count(self.totals["in"], hop, ins)
        for to in routed.keys() | delivered.keys():
            count = delivered.get(to, 0)
            name = self._count(self.totals["out"], to, routed.get(to, 0) + count)
            if count and to in self._databases:
                self.ingest[name] = self.ingest.get(name, 0) + count

    def collect(self) -> Iterator[Metric]:
        """Every metric, as it is now."""
        yield _per_peer(
            "padres_publications_in", "Publications received", self.totals["in"], "peer"
        )
        yield _per_peer(
            "padres_publications_out",
            "Publications forwarded to a neighbour or delivered to a client",
            self.totals["out"],
            "peer",
        )
        yield _total("padres_matches", "Subscriptions matched by deliveries", self.matched)
        yield self.latency.family(
            "padres_match_seconds", "Time the broker core took over a publication"
        )
        yield _total("padres_replays", "Historic replays completed", self.replays)
        yield self.replay_latency.family(
            "padres_replay_seconds", "Time from a historic subscription to the end of its replay"
        )
        yield _per_peer(
            "padres_database_ingest",
            "Publications delivered to database nodes",
            self.ingest,
            "database",
        )
        yield from self._queues()
        yield from self._state()
        status = self.node.status()
        yield _total(
            "padres_dropped_messages",
            "Messages dropped for clients too slow to take them",
            status["dropped"],
        )
        yield _total("padres_evicted_clients", "Clients evicted for lagging", status["evicted"])
        yield _total("padres_rejected_messages", "Messages refused on decoding", status["rejected"])

    def _queues(self) -> Iterator[Metric]:
        """What waits for each link, and for the clients together."""
        queued: dict[tuple[str, str], list[int]] = {}
        for hop, q in self.node.queues().items():
            key = (self._peer(hop), "link" if q["link"] else "client")
            figures = queued.setdefault(key, [0, 0])
            figures[0] += q["queued_bytes"]
            figures[1] += q["queued"]
        in_bytes = GaugeMetricFamily(
            "padres_queue_bytes", "Bytes queued for a peer", labels=["peer", "kind"]
        )
        messages = GaugeMetricFamily(
            "padres_queue_messages", "Messages queued for a peer", labels=["peer", "kind"]
        )
        for (peer, kind), (size, count) in sorted(queued.items()):
            in_bytes.add_metric([peer, kind], size)
            messages.add_metric([peer, kind], count)
        yield in_bytes
        yield messages

    def _state(self) -> Iterator[Metric]:
        """The durable subscriptions' backlog, the links, readiness and the version."""
        durables = self.node.broker.durables.statistics()
        kept = GaugeMetricFamily(
            "padres_durable_subscriptions", "Durable subscriptions kept here", labels=["client"]
        )
        for state in ("connected", "away"):
            kept.add_metric(
                [state], sum(1 for d in durables if d["connected"] == (state == "connected"))
            )
        yield kept
        yield GaugeMetricFamily(
            "padres_durable_queued_messages",
            "Deliveries waiting for durable subscriptions, in all",
            value=sum(d["queued"] for d in durables),
        )
        yield GaugeMetricFamily(
            "padres_durable_queued_bytes",
            "Bytes of deliveries waiting for durable subscriptions, in all",
            value=sum(d["queued_bytes"] for d in durables),
        )
        yield GaugeMetricFamily(
            "padres_durable_away_seconds_max",
            "How long the client away the longest has been away",
            value=max((d["away"] or 0.0 for d in durables), default=0.0),
        )
        readiness = self.node.readiness()
        yield GaugeMetricFamily(
            "padres_links", "Neighbour brokers linked now", value=len(self.node.broker.peers)
        )
        yield GaugeMetricFamily(
            "padres_links_missing",
            "Neighbours this broker dials that it is not linked to",
            value=len(readiness.get("missing", ())),
        )
        yield GaugeMetricFamily(
            "padres_ready",
            "Whether the broker is ready for clients (/ready)",
            value=readiness["ready"],
        )
        info = GaugeMetricFamily("padres_build", "The version this broker runs", labels=["version"])
        info.add_metric([version("padres")], 1)
        yield info

    def router(self) -> APIRouter:
        api = APIRouter(tags=["metrics"])

        @api.get("/metrics", response_class=Response)
        async def metrics() -> Response:
            """The broker's metrics in the Prometheus text format."""
            return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)

        return api


def _historic(message: Subscription | CompositeSubscription) -> bool:
    filters = [message.filter] if isinstance(message, Subscription) else message.filters
    return any(f.window is not None and f.window.start is not None for f in filters)
