"""``padres bench peers``: the same workloads through NATS, built as a NATS user would have to,
and through this system, in the same run.

Live: the workload of ``padres bench network`` (real quotes, PADRES-style subscriptions spread
over three subscriber clients, one publisher). Through this system: the 3-broker chain of that
benchmark. Through NATS: nats-server processes started here (one server, then a cluster of
three, which NATS links as a full mesh), the publisher on the first and one subscriber client
per server. NATS matches subjects only, so each quote goes to ``STOCK.<symbol>``; a
subscription naming one symbol listens on that subject, the others on ``STOCK.*``, and each
client evaluates the rest of its subscriptions' predicates in Python on every message it gets,
with this project's matcher. A delivery is a quote that matched at least one of a client's
subscriptions, counted once per client, on both sides. Figures: publications per second end
to end until every expected delivery has arrived, and latency percentiles at a fixed rate.

History: ``padres bench replay``'s query (about 1% of ``count`` stored publications, by a
time range and by content) through a broker and a database node, against NATS JetStream: a
stream (file storage) holding the same publications, read by a consumer from the start time of
the range; JetStream has no end time and no content filter, so the client filters and stops at
the first publication past the end.

Settings, stated because they decide whether NATS keeps up: the servers started here have
``write_deadline: 60s`` and ``max_pending: 1 GiB`` (with the defaults the servers cut the Python
subscribers off as slow consumers), and the subscriptions have no pending limits. This system
runs with its defaults (8 MiB per client queue, clients evicted after 5 s over it). Without a
``nats-server`` executable the NATS figures are skipped, saying why.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as Nats
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType

from historic.bench import replay
from historic.bench.history import publications, selection
from padres.bench import machine, network
from padres.bench.workloads import stock_publications, stock_subscriptions
from padres.matching.matcher import matches
from padres.model.codec import decode, encode
from padres.model.messages import Filter, Publication, Subscription
from padres.testing.processes import free_ports, wait_for_port

__all__ = ["NatsCluster", "nats_missing", "report", "run"]

_CONFIG = """
listen: "127.0.0.1:{port}"
server_name: "{name}"
write_deadline: "60s"
max_pending: 1073741824
{extra}
"""
_CLUSTER = 'cluster {{ name: "bench", listen: "127.0.0.1:{port}", routes: [{routes}] }}'
_JETSTREAM = 'jetstream {{ store_dir: "{store}" }}'


def nats_missing() -> str | None:
    """Why NATS cannot be measured here, or None."""
    if shutil.which("nats-server") is None:
        return "no nats-server executable on the PATH (Debian: apt-get install nats-server)"
    return None


class NatsCluster(contextlib.AbstractContextManager["NatsCluster"]):
    """``size`` nats-server processes on loopback, clustered if more than one, with JetStream
    if asked (on a single server: JetStream on a cluster needs a quorum of its own)."""

    def __init__(self, size: int, *, jetstream: bool = False) -> None:
        self.size = size
        self.jetstream = jetstream
        self.urls: list[str] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        self._dir = tempfile.TemporaryDirectory(prefix="padres-nats-")

    def __enter__(self) -> NatsCluster:
        ports = free_ports(2 * self.size)
        clusters = ports[self.size :]
        try:
            for i, port in enumerate(ports[: self.size]):
                store = Path(self._dir.name, f"js{i}")
                config = Path(self._dir.name, f"n{i}.conf")
                routes = ", ".join(f'"nats-route://127.0.0.1:{c}"' for c in clusters[:i])
                extra = [
                    _CLUSTER.format(port=clusters[i], routes=routes) if self.size > 1 else "",
                    _JETSTREAM.format(store=store) if self.jetstream else "",
                ]
                config.write_text(_CONFIG.format(port=port, name=f"n{i}", extra="\n".join(extra)))
                self._procs.append(
                    subprocess.Popen(
                        ["nats-server", "-c", str(config)],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
                wait_for_port(port)
                self.urls.append(f"nats://127.0.0.1:{port}")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *_: object) -> None:
        for proc in self._procs:
            proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self._dir.cleanup()


def _subject(pub: Publication) -> str:
    return f"STOCK.{pub.attributes['symbol']}"


def _listens_on(sub: Subscription) -> str:
    for p in sub.filter.predicates:
        if p.attribute == "symbol" and p.op.value == "eq":
            return f"STOCK.{p.value}"
    return "STOCK.*"


class _Subscriber:
    """One NATS client holding a share of the subscriptions, matching in Python."""

    def __init__(self, share: list[Subscription]) -> None:
        self.by_subject: dict[str, list[Filter]] = {}
        for sub in share:
            self.by_subject.setdefault(_listens_on(sub), []).append(sub.filter)
        self.seen: set[str] = set()
        self.count = 0
        self.latencies: list[float] = []

    def reset(self) -> None:
        self.seen, self.count, self.latencies = set(), 0, []

    def callback(self, filters: list[Filter]) -> Callable[[Msg], Awaitable[None]]:
        async def on_message(msg: Msg) -> None:
            pub = decode(msg.data)
            assert isinstance(pub, Publication)
            if pub.id in self.seen or not any(matches(f, pub) for f in filters):
                return
            self.seen.add(pub.id)
            self.count += 1
            sent = pub.attributes.get("sent")
            if isinstance(sent, float):
                self.latencies.append(time.time() - sent)

        return on_message


async def _nats_live(
    urls: list[str], shares: list[list[Subscription]], work: network.Work
) -> dict[str, Any]:
    publisher = await nats.connect(urls[0])
    clients: list[Nats] = []
    try:
        subscribers = [_Subscriber(share) for share in shares]
        for url, subscriber in zip(urls, subscribers, strict=True):
            nc = await nats.connect(url)
            clients.append(nc)
            for subject, filters in subscriber.by_subject.items():
                await nc.subscribe(
                    subject,
                    cb=subscriber.callback(filters),
                    pending_msgs_limit=-1,
                    pending_bytes_limit=-1,
                )
            await nc.flush()
        await asyncio.sleep(0.5)  # interest propagates between the servers

        async def send(pubs: list[Publication]) -> None:
            for pub in pubs:
                await publisher.publish(_subject(pub), encode(pub))
            await publisher.flush()

        return await network.measure(send, subscribers, work)
    finally:
        for nc in [publisher, *clients]:
            await nc.close()


def _live(subs: int, pubs: int, rate: float, seconds: float, data: Path | None) -> dict[str, Any]:
    quotes = stock_publications(data)
    workload = list(stock_subscriptions(subs, quotes, seed=1))
    shares = [workload[i::3] for i in range(3)]
    work = network.Work.of(shares, quotes, pubs, rate, seconds)
    out: dict[str, Any] = {
        "padres chain of 3": network.run(subs, pubs, rate, seconds, data),
    }
    if nats_missing() is None:
        for size, name in ((1, "NATS, one server"), (3, "NATS, cluster of 3")):
            with NatsCluster(size) as cluster:
                urls = (cluster.urls * 3)[:3] if size == 1 else cluster.urls
                out[name] = asyncio.run(_nats_live(urls, shares, work))
    return out


async def _jetstream(url: str, pubs: list[Publication], repeat: int) -> dict[str, Any]:
    flt, since, until = selection(pubs)
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="STOCK", subjects=["STOCK.>"], storage=StorageType.FILE)
        first = next(i for i, p in enumerate(pubs) if p.timestamp >= since)
        started = time.perf_counter()
        start_time = datetime.now(UTC)
        for i in range(0, len(pubs), 500):
            if i <= first < i + 500:
                await nc.flush()
                start_time = datetime.now(UTC)
            for pub in pubs[i : i + 500]:
                await nc.publish(_subject(pub), encode(pub))
            await nc.flush()
        while (await js.stream_info("STOCK")).state.messages < len(pubs):
            await asyncio.sleep(0.05)
        ingest = time.perf_counter() - started
        times, rows = [], 0
        for _ in range(repeat):
            t0 = time.perf_counter()
            rows = await _read_range(js, flt, since, until, start_time)
            times.append(time.perf_counter() - t0)
        return {
            "ingest_per_second": len(pubs) / ingest,
            "replay_seconds": statistics.median(times),
            "query_rows": rows,
        }
    finally:
        await nc.close()


async def _read_range(
    js: Any, flt: Filter, since: datetime, until: datetime, start_time: datetime
) -> int:
    """What a JetStream user does for a time range and a content filter."""
    config = ConsumerConfig(
        ack_policy=AckPolicy.NONE,  # a reader, not a worker: nothing to acknowledge
        deliver_policy=DeliverPolicy.BY_START_TIME,
        opt_start_time=start_time,
    )
    sub = await js.pull_subscribe("STOCK.>", config=config)
    rows = 0
    try:
        while True:
            for msg in await sub.fetch(1000, timeout=5):
                pub = decode(msg.data)
                assert isinstance(pub, Publication)
                if pub.timestamp >= until:
                    return rows
                if pub.timestamp >= since and matches(flt, pub):
                    rows += 1
    finally:
        await sub.unsubscribe()


def _history(count: int, repeat: int, data: Path | None) -> dict[str, Any]:
    out: dict[str, Any] = {"padres": replay.run(count, data=data)}
    if nats_missing() is None:
        with NatsCluster(1, jetstream=True) as cluster:
            out["NATS JetStream"] = asyncio.run(
                _jetstream(cluster.urls[0], publications(count, data), repeat)
            )
    return out


def run(
    subs: int = 10_000,
    pubs: int = 50_000,
    rate: float = 5_000,
    seconds: float = 5.0,
    count: int = 1_000_000,
    repeat: int = 3,
    data: Path | None = None,
) -> dict[str, Any]:
    live = [_live(subs, pubs, rate, seconds, data) for _ in range(repeat)]
    return {
        "machine": machine(),
        "subscriptions": subs,
        "publications": pubs,
        "rate": rate,
        "count": count,
        "nats_missing": nats_missing(),
        "live": {name: _medians([r[name] for r in live]) for name in live[0]},
        "history": _history(count, repeat, data),
    }


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("publications_per_second", "latency_p50_ms", "latency_p99_ms")
    return {k: statistics.median(r[k] for r in runs) for k in keys}


def _lines(r: dict[str, Any]) -> Iterator[str]:
    live = r["live"]
    ours = live["padres chain of 3"]["publications_per_second"]
    yield (
        f"live: {r['subscriptions']:,} subscriptions, {r['publications']:,} real quotes, "
        f"medians of the runs; latency at {r['rate']:,.0f} per s"
    )
    for name, m in live.items():
        yield (
            f"  {name:<20} {m['publications_per_second']:>9,.0f} publications/s "
            f"(padres {ours / m['publications_per_second']:.2f}x)  "
            f"p50 {m['latency_p50_ms']:.1f} ms  p99 {m['latency_p99_ms']:.1f} ms"
        )
    history = r["history"]
    mine = history["padres"]
    yield f"history: about 1% of {r['count']:,} stored publications by time and content"
    yield (
        f"  padres (SQLite node)   ingest {mine['ingest_per_second']:>9,.0f}/s  "
        f"replay {mine['replay_seconds'] * 1000:,.0f} ms ({mine['query_rows']:,} rows)"
    )
    js = history.get("NATS JetStream")
    if js is not None:
        yield (
            f"  NATS JetStream         ingest {js['ingest_per_second']:>9,.0f}/s  "
            f"replay {js['replay_seconds'] * 1000:,.0f} ms ({js['query_rows']:,} rows, "
            f"{'the same as' if js['query_rows'] == mine['query_rows'] else 'NOT the same as'} "
            f"padres); padres {js['replay_seconds'] / mine['replay_seconds']:.1f}x faster"
        )
    if r["nats_missing"]:
        yield f"NATS not measured: {r['nats_missing']}"


def report(r: dict[str, Any]) -> str:
    return "\n".join(_lines(r))
