"""Tracing a publication through the overlay, hop by hop.

``POST /api/v1/traces`` publishes a ``TRACE_REQUEST`` (``[trace, <id>]``, ``[filter, <text>]``,
``[targets, <JSON>]``) that every broker's monitor session subscribes to. Each broker arms as the
request passes through its core (an observer of the node, so in order with the publications
after it on every link), for ``ARMED_FOR`` seconds, and reports each publication it handles
that the trace is for (the ones named in ``targets``, or those matching ``filter``; at most
``MAX_REPORTS``) in a ``TRACE`` publication: where it came from, which brokers it was forwarded
to, and which subscriptions of which local clients it matched. The broker that started the
trace collects the reports; ``GET /api/v1/traces/{id}`` gives the path of the first publication
traced.

Each broker also reports when it armed. In a cyclic overlay the request and the publication may
travel different paths, so the publication could pass a broker the request has not reached yet:
the broker that starts a trace waits (``READY_WAIT`` at most) until every broker of the overlay
armed before it publishes the traced publication or answers.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
from fastapi import APIRouter

from padres.broker import Out
from padres.language.parser import parse_filter
from padres.matching.matcher import matches
from padres.model.messages import Filter, Publication
from padres.model.printer import format_filter
from padres.model.protocol import CompositeNotify, Notify, RoutePublish
from padres.runtime.node import Handled
from web.bodies import TraceBody
from web.clients import Clients
from web.inputs import filter_from, publications_from_json
from web.metrics import Metrics, published
from web.problems import Problem

__all__ = ["ARMED_FOR", "MAX_ARMED", "MAX_REPORTS", "REPORT", "REQUEST", "Tracer"]

REQUEST: Final = "TRACE_REQUEST"
REPORT: Final = "TRACE"
ARMED_FOR: Final = 30.0
MAX_REPORTS: Final = 50
KEPT: Final = 64
"""Traces a broker keeps the reports of."""
MAX_ARMED: Final = 16
"""Traces a broker is armed for at once: each costs a check of every publication it handles,
so a flood of requests arms no more (the oldest is let go of first)."""
READY_WAIT: Final = 5.0
"""Seconds a trace request waits for this broker's monitor session to start."""

Publish = Callable[[dict[str, str]], None]


@dataclass
class _Armed:
    filter: Filter | None
    targets: frozenset[tuple[str, str]]
    """(publisher, id) of the publications traced, when there is no filter."""
    until: float
    reported: int = 0

    def wants(self, pub: Publication) -> bool:
        if self.filter is None:
            return (pub.publisher, pub.id) in self.targets
        return matches(self.filter, pub)


@dataclass
class _Trace:
    id: str
    filter: str
    started: float = field(default_factory=time.time)
    reports: list[dict[str, Any]] = field(default_factory=list)
    armed: set[str] = field(default_factory=set)
    """The brokers that armed for it."""


class Tracer:
    """Arms on requests, reports matching publications, and collects reports of its traces.
    ``publish`` (set by the monitor session) sends a publication's attributes."""

    def __init__(self, metrics: Metrics, private: frozenset[str]) -> None:
        self.metrics = metrics
        self.private = private
        """Classes never traced (the monitor's own)."""
        self.publish: Publish | None = None
        self.armed: dict[str, _Armed] = {}
        self.traces: OrderedDict[str, _Trace] = OrderedDict()
        self._count = 0

    def start(
        self, broker: str, flt: Filter | None, targets: Sequence[tuple[str, str]] = ()
    ) -> _Trace:
        """Trace what matches ``flt``, or the publications ``targets`` (publisher, id)."""
        if self.publish is None:
            raise Problem(
                409, "not ready", "the brokers' monitor sessions are starting: try again shortly"
            )
        self._count += 1
        text = format_filter(flt) if flt is not None else ""
        trace = _Trace(f"{broker}.t{self._count}", text)
        self.traces[trace.id] = trace
        while len(self.traces) > KEPT:
            self.traces.popitem(last=False)
        wanted = orjson.dumps([list(t) for t in targets]).decode()
        self.publish({"class": REQUEST, "trace": trace.id, "filter": text, "targets": wanted})
        return trace

    def heard(self, pub: Publication) -> None:
        """A ``TRACE`` publication from the overlay: a report for a trace started here."""
        attrs = pub.attributes
        trace, report = attrs.get("trace"), attrs.get("report")
        if attrs.get("class") == REPORT and trace in self.traces and isinstance(report, str):
            found = orjson.loads(report)
            if found.get("armed"):
                self.traces[str(trace)].armed.add(str(found["broker"]))
            else:
                self.traces[str(trace)].reports.append(found)

    def _arm(self, request: Publication) -> None:
        attrs = request.attributes
        trace, text, targets = attrs.get("trace"), attrs.get("filter"), attrs.get("targets")
        if not (isinstance(trace, str) and isinstance(text, str) and isinstance(targets, str)):
            return
        try:
            flt = parse_filter(text) if text else None
            wanted = frozenset((str(p), str(i)) for p, i in orjson.loads(targets))
        except (ValueError, TypeError):
            return  # not a request this version understands
        self.armed.pop(trace, None)
        while len(self.armed) >= MAX_ARMED:
            del self.armed[next(iter(self.armed))]
        self.armed[trace] = _Armed(flt, wanted, time.monotonic() + ARMED_FOR)
        self._send({"broker": self.metrics.node.broker.id, "armed": True}, trace)

    def observe(self, hop: str, handled: list[Handled]) -> None:
        """A ``BrokerNode`` observer: arm on requests, report what armed traces want."""
        for message, outs, _ in handled:
            pub = published(message)
            if pub is not None and (self.armed or pub.attributes.get("class") == REQUEST):
                self._saw(hop, pub, outs)

    def _saw(self, hop: str, pub: Publication, outs: list[Out]) -> None:
        kind = pub.attributes.get("class")
        if kind == REQUEST:
            self._arm(pub)
        if not self.armed or kind in self.private:
            return
        now = time.monotonic()
        for tid, armed in list(self.armed.items()):
            if now > armed.until or armed.reported >= MAX_REPORTS:
                del self.armed[tid]
            elif armed.wants(pub):
                armed.reported += 1
                self._report(tid, hop, pub, outs)

    def _report(self, tid: str, hop: str, pub: Publication, outs: list[Out]) -> None:
        name = self.metrics.name
        matched = [
            {"client": name(to), "subscription": s}
            for to, out in outs
            if isinstance(out, Notify)
            for s in out.subscriptions
        ] + [
            {"client": name(to), "subscription": out.subscription}
            for to, out in outs
            if isinstance(out, CompositeNotify)
        ]
        report = {
            "broker": self.metrics.node.broker.id,
            "publication": pub.id,
            "publisher": pub.publisher or _publisher(outs, name(hop)),
            "from": name(hop),
            "to": sorted(name(to) for to, out in outs if isinstance(out, RoutePublish)),
            "matched": matched,
            "at": time.time(),
        }
        self._send(report, tid)

    def _send(self, report: dict[str, Any], tid: str) -> None:
        attrs = {"class": REPORT, "trace": tid, "report": orjson.dumps(report).decode()}
        if self.publish is not None:  # not from within the core's call: after it
            asyncio.get_running_loop().call_soon(self.publish, attrs)

    async def _armed(self, trace: _Trace, brokers: set[str]) -> None:
        """Wait until every broker of ``brokers`` armed for ``trace`` (``READY_WAIT`` at most)."""
        for _ in range(int(READY_WAIT / 0.05)):
            if brokers <= trace.armed:
                return
            await asyncio.sleep(0.05)

    def view(self, tid: str) -> dict[str, Any]:
        trace = self.traces.get(tid)
        if trace is None:
            raise Problem(404, "no such trace", f"no trace {tid!r} here")
        reports = trace.reports
        # The first publication seen where it entered the overlay (from a client), else any.
        origin = next((r for r in reports if "@" in r["from"]), reports[0] if reports else None)
        hops: list[dict[str, Any]] = []
        if origin is not None:
            key = (origin["publication"], origin["publisher"])
            hops = [r for r in reports if (r["publication"], r["publisher"]) == key]
            hops.sort(key=lambda r: r["at"])
        return {
            "id": trace.id,
            "filter": trace.filter,
            "started": trace.started,
            "expires_in": max(0.0, trace.started + ARMED_FOR - time.time()),
            "armed": sorted(trace.armed),
            "publication": origin["publication"] if origin else None,
            "publisher": origin["publisher"] if origin else None,
            "hops": hops,
        }

    def router(self, clients: Clients, overlay: Callable[[], Awaitable[set[str]]]) -> APIRouter:
        """The API; ``overlay`` gives the overlay's brokers, and says it is watched (the
        brokers report while it is)."""
        api = APIRouter(prefix="/api/v1", tags=["monitor"])

        @api.post("/traces", status_code=201)
        async def trace(body: TraceBody) -> dict[str, Any]:
            """Publish ``publication`` as ``client`` and trace it, or trace the next
            publications matching ``filter``, through the overlay."""
            if (body.filter is None) == (body.publication is None):
                raise Problem(
                    400, "invalid trace", "give exactly one of 'filter' and 'publication'"
                )
            flt = filter_from(body.filter) if body.filter is not None else None
            pubs = publications_from_json([body.publication]) if flt is None else []
            brokers = await overlay()
            for _ in range(int(READY_WAIT / 0.1)):  # the monitor session, if it was asleep
                if self.publish is not None:
                    break
                await asyncio.sleep(0.1)
            broker = self.metrics.node.broker.id
            if flt is not None:
                started = self.start(broker, flt)
                await self._armed(started, brokers)
                return self.view(started.id)
            publisher = (await clients.publisher(body.client)).session
            started = self.start(broker, None, [(publisher, p.id) for p in pubs])
            await self._armed(started, brokers)
            await clients.publish(body.client, pubs, guaranteed=False)
            return self.view(started.id)

        @api.get("/traces/{tid}")
        async def traced(tid: str) -> dict[str, Any]:
            """A trace's path so far: each broker the publication reached, in order, where it
            came from, where it went, and the subscriptions it matched there."""
            return self.view(tid)

        return api


def _publisher(outs: list[Out], client: str) -> str:
    """Who published a publication that came from ``client`` with no publisher of its own:
    as the broker names it in what it sent on (``name@broker``), or as the client is named."""
    for _, out in outs:
        if isinstance(out, Notify | RoutePublish) and out.publication.publisher:
            return out.publication.publisher
    return client
