"""``padres bench peers``: the same workloads through NATS and through this system, in the same
run, NATS set up both as a hurried user would and as strongly as its users would.

Live: the workload of ``padres bench network`` (real quotes, PADRES-style subscriptions spread
over three subscriber clients, one publisher). A delivery is a quote that matched at least one
of a client's subscriptions, counted once per client, on every side; each run must make
exactly the deliveries the Rete matcher expects (``network.Work``). Figures: publications per
second end to end until every expected delivery has arrived, latency percentiles at a fixed
rate, and what the throughput phase cost per delivery: CPU of the servers (brokers or
nats-servers) and of the clients, from ``/proc``, the bytes every connection carried, as the
servers count them, and where the subscribers run in processes of their own, the bytes they
received on the wire, as the kernel counts them on every side (``padres.bench.usage``). With
``compress``, this system's subscriber clients offer compression (permessage-deflate), which
the brokers accept. The setups (``SETTINGS`` says each in one line):

- ``padres chain of 3``: the 3-broker chain of ``padres bench network``, its three subscriber
  clients in this process beside the publisher, as in every earlier run of this benchmark;
- ``padres chain of 3, subscribers apart``: the same chain, each subscriber client in a process
  of its own (``padres.bench.apart``), as the strong NATS subscribers run;
- ``NATS, one server`` and ``NATS, cluster of 3`` (a full mesh), set up weakly: NATS matches
  subjects only, so each quote goes to ``STOCK.<symbol>``; a subscription naming one symbol
  listens on that subject, the others on ``STOCK.*`` (a client holding both gets a quote twice
  and decodes it twice), and each client tests its subscriptions on that subject one by one
  with this project's reference matcher, after decoding with this project's validating codec;
  the three clients and the publisher share this process;
- ``NATS strong``: one server; each subscriber client in a process of its own, with one
  subscription on subjects that bring each quote once, decoding with msgspec straight into a
  struct of the quote's fields and matching everything received since the last batch with this
  project's Rete network (``historic.bench.strong``); the publisher leaves flushing to the
  client library;
- ``NATS strong, framed``: the same, the publisher sending each chunk of quotes as one message
  (the frames of ``Client.publish_many``), the subscribers unpacking them.

History: ``padres bench replay``'s query (about 1% of ``count`` stored publications, by a
time range and by content) through a broker and a database node, against NATS JetStream: a
stream (file storage) holding the same publications, read by a consumer from the start time of
the range; JetStream has no end time and no content filter, so the client filters and stops at
the first publication past the end. Weakly (as before): the publisher flushes every 500 and the
reader pull-fetches batches of 1,000 through the validating codec. Strongly: the publisher
does not wait (plain publishes into the stream's subjects, one flush at the end; then wait until
the stream holds them all), and again with ``js.publish`` acknowledgements awaited 1,000 at a
time, which is what a user wanting the durability promise does; the reader is an ordered push
consumer decoding with msgspec. ``PROMISES`` says what each side has promised when it counts a
publication stored.

Settings, stated because they decide whether NATS keeps up: the servers started here have
``write_deadline: 60s`` and ``max_pending: 1 GiB`` (with the defaults the servers cut the Python
subscribers off as slow consumers), and the subscriptions have no pending limits. This system
runs with its defaults (8 MiB per client queue, clients evicted after 5 s over it). Without a
``nats-server`` executable the NATS figures are skipped, saying why.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import msgspec
import nats
from nats.aio.client import Client as Nats
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType

from historic.bench import replay, strong
from historic.bench.history import publications, selection
from padres.bench import machine, network
from padres.bench.apart import Apart
from padres.bench.usage import Meter, get_json, processes, received
from padres.bench.workloads import stock_publications, stock_subscriptions
from padres.matching.matcher import matches
from padres.matching.rete_matcher import to_conjunction
from padres.model.codec import decode, encode, encode_frame
from padres.model.messages import Filter, Publication, Subscription
from padres.testing.processes import free_ports, wait_for_port
from rete import Test

__all__ = [
    "PROMISES",
    "SETTINGS",
    "SYNCED_SINCE",
    "NatsCluster",
    "ingest_strong",
    "ingested",
    "nats_missing",
    "nats_version",
    "read_strong",
    "report",
    "run",
]

PADRES = "padres chain of 3"
PADRES_APART = "padres chain of 3, subscribers apart"
NATS_ONE = "NATS, one server"
NATS_CLUSTER = "NATS, cluster of 3"
NATS_STRONG = "NATS strong"
NATS_FRAMED = "NATS strong, framed"

SETUPS: Final = {
    "chain": PADRES,
    "apart": PADRES_APART,
    "weak": NATS_ONE,
    "cluster": NATS_CLUSTER,
    "strong": NATS_STRONG,
    "framed": NATS_FRAMED,
}
"""The live setups by the short names ``padres bench peers --live`` takes."""

SETTINGS: Final = {
    PADRES: "3 padres brokers in a chain; publisher at the first, frames of 500; the 3 "
    "subscriber clients in the bench process beside the publisher",
    PADRES_APART: "the same chain; each subscriber client in a process of its own, its "
    "garbage collector settled once subscribed (as a broker's)",
    NATS_ONE: "1 nats-server; quotes to STOCK.<symbol>; per client a subscription per symbol "
    "named and STOCK.* (quotes twice); filters tested one by one after the validating codec; "
    "clients and publisher in one process, a flush every 500",
    NATS_CLUSTER: "as above on 3 nats-servers in a full mesh, a subscriber at each",
    NATS_STRONG: "1 nats-server; each subscriber a process of its own, one subscription "
    "(STOCK.*: every client holds symbol-free subscriptions), msgspec into a quote struct, "
    "Rete in batches of what has arrived, garbage collector settled once loaded (as a "
    "broker's); no flushes by the publisher",
    NATS_FRAMED: "as NATS strong, the publisher sending each chunk (500, 50 when paced) as one "
    "message on STOCKS, as publish_many frames them",
}
"""What each live setup is, one line each."""

PROMISES: Final = {
    "padres": "stored once the database node's SQLite transaction has committed "
    "(WAL, synchronous=FULL: fsync at each commit); a commit every 0.1 s or every 500 waiting, "
    "up to 10,000 a commit; the publisher is not acknowledged",
    "NATS JetStream": "file storage, in the server's files (the page cache) when acknowledged; "
    "fsync every 60 s in nats-server 2.9 (not configurable), every 2 min by default from 2.10 "
    "(sync_interval; 'always' syncs each write)",
}
"""What each side has promised when it counts a publication stored."""

_CONFIG = """
listen: "127.0.0.1:{port}"
http: "127.0.0.1:{http}"
server_name: "{name}"
write_deadline: "60s"
max_pending: 1073741824
{extra}
"""
_CLUSTER = 'cluster {{ name: "bench", listen: "127.0.0.1:{port}", routes: [{routes}] }}'
_JETSTREAM = 'jetstream {{ store_dir: "{store}"{sync} }}'
SYNCED_SINCE: Final = (2, 10)
"""The first nats-server version with ``sync_interval`` (``always``: an fsync at each write)."""


def nats_missing(server: str = "nats-server") -> str | None:
    """Why NATS cannot be measured here with the executable ``server``, or None."""
    if shutil.which(server) is None:
        return f"no {server} executable on the PATH (Debian: apt-get install nats-server)"
    return None


def nats_version(server: str = "nats-server") -> tuple[int, ...]:
    """The version of the nats-server executable ``server`` (``nats-server: v2.9.10``)."""
    out = subprocess.run([server, "--version"], capture_output=True, text=True, check=True)
    return tuple(int(part) for part in out.stdout.split("v")[-1].strip().split(".")[:3])


class NatsCluster(contextlib.AbstractContextManager["NatsCluster"]):
    """``size`` nats-server processes on loopback, clustered if more than one, with JetStream
    if asked (on a single server: JetStream on a cluster needs a quorum of its own). Each
    serves its monitoring endpoints (``monitors``: ``/connz``, ``/routez``...)."""

    def __init__(
        self,
        size: int,
        *,
        jetstream: bool = False,
        synced: bool = False,
        server: str = "nats-server",
    ) -> None:
        """``synced``: JetStream syncs each write to disk (``sync_interval: always``, from
        nats-server 2.10; the default syncs every 2 minutes); ``server``: the executable."""
        self.size = size
        self.jetstream = jetstream
        self.synced = synced
        self.server = server
        self.urls: list[str] = []
        self.monitors: list[str] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        self._dir = tempfile.TemporaryDirectory(prefix="padres-nats-")

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self._procs]

    def __enter__(self) -> NatsCluster:
        ports = free_ports(3 * self.size)
        clusters = ports[self.size : 2 * self.size]
        https = ports[2 * self.size :]
        try:
            for i, port in enumerate(ports[: self.size]):
                store = Path(self._dir.name, f"js{i}")
                config = Path(self._dir.name, f"n{i}.conf")
                routes = ", ".join(f'"nats-route://127.0.0.1:{c}"' for c in clusters[:i])
                extra = [
                    _CLUSTER.format(port=clusters[i], routes=routes) if self.size > 1 else "",
                    _JETSTREAM.format(
                        store=store, sync=", sync_interval: always" if self.synced else ""
                    )
                    if self.jetstream
                    else "",
                ]
                text = _CONFIG.format(
                    port=port, http=https[i], name=f"n{i}", extra="\n".join(extra)
                )
                config.write_text(text)
                self._procs.append(
                    subprocess.Popen(
                        [self.server, "-c", str(config)],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
                wait_for_port(port)
                wait_for_port(https[i])
                self.urls.append(f"nats://127.0.0.1:{port}")
                self.monitors.append(f"http://127.0.0.1:{https[i]}")
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

    def sent(self) -> dict[str, int]:
        """Bytes of message payloads sent so far, as the servers count them (without the
        protocol's lines): by each server (``n0``...) to its clients and the other servers,
        and by the client named ``publisher`` to its server."""
        out: dict[str, int] = {"publisher": 0}
        for i, monitor in enumerate(self.monitors):
            conns = get_json(f"{monitor}/connz")["connections"] or []
            routes = (get_json(f"{monitor}/routez")["routes"] or []) if self.size > 1 else []
            out[f"n{i}"] = sum(c["out_bytes"] for c in [*conns, *routes])
            out["publisher"] += sum(c["in_bytes"] for c in conns if c.get("name") == "publisher")
        return out


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
            if not isinstance(pub, Publication):
                raise TypeError(f"a {type(pub).__name__} where a publication was expected")
            if pub.id in self.seen or not any(matches(f, pub) for f in filters):
                return
            self.seen.add(pub.id)
            self.count += 1
            sent = pub.attributes.get("sent")
            if isinstance(sent, float):
                self.latencies.append(time.time() - sent)

        return on_message


async def _nats_live(
    urls: list[str],
    shares: list[list[Subscription]],
    work: network.Work,
    cluster: NatsCluster | None = None,
) -> dict[str, Any]:
    """The weak setup; ``cluster``: the servers, to meter the throughput phase."""
    publisher = await nats.connect(urls[0], name="publisher")
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

        meter = None
        if cluster is not None:
            roles = {"servers": cluster.pids, "clients": [os.getpid()]}
            meter = Meter(processes(roles), cluster.sent)
        return await network.measure(send, subscribers, work, meter)
    finally:
        for nc in [publisher, *clients]:
            await nc.close()


async def _nats_strong(
    cluster: NatsCluster,
    shares: list[list[Subscription]],
    work: network.Work,
    *,
    framed: bool,
) -> dict[str, Any]:
    """The strong setup on ``cluster``'s first server, subscribers in processes of their own;
    ``framed``: a message per chunk of quotes."""
    url = cluster.urls[0]
    publisher = await nats.connect(url, name="publisher")
    remotes: list[Apart] = []
    try:
        for i, share in enumerate(shares):
            encoded = [encode(sub) for sub in share]
            remotes.append(await Apart.start(strong.subscriber, url, f"sub{i}", encoded, framed))

        async def send_frame(pubs: list[Publication]) -> None:
            await publisher.publish(strong.FRAMES, encode_frame(pubs))

        async def send_each(pubs: list[Publication]) -> None:
            for pub in pubs:
                await publisher.publish(_subject(pub), encode(pub))

        roles = {
            "servers": cluster.pids[:1],
            "subscribers": [r.pid for r in remotes],
            "publisher": [os.getpid()],
        }
        wire = received({"subscribers": roles["subscribers"]})
        meter = Meter(processes(roles), cluster.sent, wire)
        return await network.measure(send_frame if framed else send_each, remotes, work, meter)
    finally:
        for remote in remotes:
            remote.stop()
        await publisher.close()


def _live(
    subs: int,
    pubs: int,
    rate: float,
    seconds: float,
    data: Path | None,
    setups: Sequence[str],
    compress: bool,
) -> dict[str, Any]:
    """One run of each of ``setups`` (names of ``SETUPS``' values), in ``SETUPS``' order;
    ``compress``: this system's subscribers compressed."""
    quotes = stock_publications(data)
    workload = list(stock_subscriptions(subs, quotes, seed=1))
    shares = [workload[i::3] for i in range(3)]
    work = network.Work.of(shares, quotes, pubs, rate, seconds)
    out: dict[str, Any] = {}
    if PADRES in setups:
        out[PADRES] = network.run(subs, pubs, rate, seconds, data, compress=compress)
    if PADRES_APART in setups:
        out[PADRES_APART] = network.run(
            subs, pubs, rate, seconds, data, apart=True, compress=compress
        )
    if nats_missing() is None:
        for size, name in ((1, NATS_ONE), (3, NATS_CLUSTER)):
            if name in setups:
                with NatsCluster(size) as cluster:
                    urls = (cluster.urls * 3)[:3] if size == 1 else cluster.urls
                    out[name] = asyncio.run(_nats_live(urls, shares, work, cluster))
        for framed, name in ((False, NATS_STRONG), (True, NATS_FRAMED)):
            if name in setups:
                with NatsCluster(1) as cluster:
                    out[name] = asyncio.run(_nats_strong(cluster, shares, work, framed=framed))
    return out


async def ingested(js: Any, count: int, timeout: float = 600) -> None:
    """Wait until the stream holds ``count`` messages."""
    deadline = time.perf_counter() + timeout
    while (held := (await js.stream_info("STOCK")).state.messages) < count:
        if time.perf_counter() > deadline:
            raise RuntimeError(f"the stream holds {held} of {count} publications")
        await asyncio.sleep(0.05)


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
        await ingested(js, len(pubs))
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
                if not isinstance(pub, Publication):
                    raise TypeError(f"a {type(pub).__name__} where a publication was expected")
                if pub.timestamp >= until:
                    return rows
                if pub.timestamp >= since and matches(flt, pub):
                    rows += 1
    finally:
        await sub.unsubscribe()


async def ingest_strong(nc: Nats, pubs: list[Publication], acked: bool) -> datetime:
    """Publish ``pubs`` into the stream as fast as the publisher can: without waiting, or
    awaiting ``js.publish``'s acknowledgements 1,000 at a time (``acked``). Returns a time
    before the first publication of the selected range was stored."""
    _, since, _ = selection(pubs)
    first = next(i for i, p in enumerate(pubs) if p.timestamp >= since)
    start_time = datetime.now(UTC)
    if acked:
        js = nc.jetstream()
        for i in range(0, len(pubs), 1000):
            if i <= first < i + 1000:
                start_time = datetime.now(UTC)
            await asyncio.gather(*(js.publish(_subject(p), encode(p)) for p in pubs[i : i + 1000]))
        return start_time
    for i, pub in enumerate(pubs):
        if i == first:
            start_time = datetime.now(UTC)  # stored later than this, whatever is in flight
        await nc.publish(_subject(pub), encode(pub))
    await nc.flush()
    return start_time


async def read_strong(
    js: Any, flt: Filter, since: datetime, until: datetime, start_time: datetime
) -> int:
    """The range read by an ordered push consumer from ``start_time``, decoding with msgspec
    and testing the filter's Rete tests."""
    tests = [t for t in to_conjunction(flt) if isinstance(t, Test)]
    if len(tests) != len(flt.predicates):
        raise ValueError("the selection's filter has variables")
    decoder = msgspec.json.Decoder(strong.Quote)
    done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    rows = 0

    async def on_message(msg: Msg) -> None:
        nonlocal rows
        if done.done():
            return
        quote = decoder.decode(msg.data)
        if quote.timestamp >= until:
            done.set_result(rows)
        elif quote.timestamp >= since and all(t.passes(quote.attributes) for t in tests):
            rows += 1

    sub = await js.subscribe(
        "STOCK.>",
        cb=on_message,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.BY_START_TIME,
        config=ConsumerConfig(opt_start_time=start_time),
        pending_msgs_limit=-1,
        pending_bytes_limit=-1,
    )
    try:
        return await asyncio.wait_for(done, 300)
    finally:
        await sub.unsubscribe()


async def _jetstream_strong(
    url: str, pubs: list[Publication], repeat: int, *, acked: bool
) -> dict[str, Any]:
    flt, since, until = selection(pubs)
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="STOCK", subjects=["STOCK.>"], storage=StorageType.FILE)
        started = time.perf_counter()
        start_time = await ingest_strong(nc, pubs, acked)
        await ingested(js, len(pubs))
        ingest = time.perf_counter() - started
        times, rows = [], 0
        for _ in range(repeat):
            t0 = time.perf_counter()
            rows = await read_strong(js, flt, since, until, start_time)
            times.append(time.perf_counter() - t0)
        return {
            "ingest_per_second": len(pubs) / ingest,
            "replay_seconds": statistics.median(times) if times else None,
            "query_rows": rows,
        }
    finally:
        await nc.close()


def _history(count: int, repeat: int, data: Path | None) -> dict[str, Any]:
    out: dict[str, Any] = {"padres": replay.run(count, data=data)}
    if nats_missing() is None:
        pubs = publications(count, data)
        with NatsCluster(1, jetstream=True) as cluster:
            out["NATS JetStream"] = asyncio.run(_jetstream(cluster.urls[0], pubs, repeat))
        with NatsCluster(1, jetstream=True) as cluster:
            quick = asyncio.run(_jetstream_strong(cluster.urls[0], pubs, repeat, acked=False))
        with NatsCluster(1, jetstream=True) as cluster:
            acked = asyncio.run(_jetstream_strong(cluster.urls[0], pubs, 0, acked=True))
        out["NATS JetStream strong"] = {
            **quick,
            "ingest_acked_per_second": acked["ingest_per_second"],
        }
    return out


def run(
    subs: int = 10_000,
    pubs: int = 50_000,
    rate: float = 5_000,
    seconds: float = 5.0,
    count: int = 1_000_000,
    repeat: int = 3,
    data: Path | None = None,
    setups: Sequence[str] = tuple(SETUPS),
    history: bool = True,
    compress: bool = False,
) -> dict[str, Any]:
    """``setups``: the live setups to run, by short name (``SETUPS``); each round runs each
    once, so that ``repeat`` rounds alternate them; ``history``: measure the historic side;
    ``compress``: this system's subscriber clients offer compression."""
    unknown = sorted(set(setups) - set(SETUPS))
    if unknown:
        raise ValueError(f"unknown setups {', '.join(unknown)}: choose from {', '.join(SETUPS)}")
    chosen = [SETUPS[name] for name in setups]
    live = [_live(subs, pubs, rate, seconds, data, chosen, compress) for _ in range(repeat)]
    return {
        "machine": machine(),
        "subscriptions": subs,
        "publications": pubs,
        "rate": rate,
        "count": count,
        "compressed": compress,
        "nats_missing": nats_missing(),
        "settings": {name: SETTINGS[name] for name in live[0]},
        "promises": PROMISES,
        "live": {name: _medians([r[name] for r in live]) for name in live[0]},
        "history": _history(count, repeat, data) if history else None,
    }


def _median_of(runs: Sequence[dict[str, Any]], key: str) -> Any:
    values = [r[key] for r in runs if r.get(key) is not None]
    if not values:
        return None
    if isinstance(values[0], dict):
        return {k: statistics.median(v[k] for v in values) for k in values[0]}
    return statistics.median(values)


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of the runs' figures, and each run's throughput (``runs``)."""
    keys = (
        "publications_per_second",
        "latency_p50_ms",
        "latency_p99_ms",
        "cpu_us_per_delivery",
        "bytes_per_delivery",
        "bytes_received_per_delivery",
    )
    return {
        **{k: _median_of(runs, k) for k in keys},
        "throughput_deliveries": runs[0]["throughput_deliveries"],
        "runs": [r["publications_per_second"] for r in runs],
    }


_ROLES = {
    "servers": "servers",
    "subscribers": "subscribers",
    "publisher": "publisher",
    "clients": "clients in one process",
}


def _ratio(ours: float | None, theirs: float | None) -> str:
    return f"{ours / theirs:.2f}" if ours and theirs else "-"


def _lines(r: dict[str, Any]) -> Iterator[str]:
    live = r["live"]
    base = live.get(PADRES) or live.get(PADRES_APART) or {}
    apart = live.get(PADRES_APART, base)
    yield (
        f"live: {r['subscriptions']:,} subscriptions, {r['publications']:,} real quotes, "
        f"medians of the runs; latency at {r['rate']:,.0f} per s; padres/this: the ratio of "
        f"padres' figure to this setup's, for the chain as run so far (and with its "
        "subscribers apart); per delivery: what the throughput phase cost, CPU in "
        "microseconds, bytes sent on every connection (padres/this: with subscribers apart), "
        "bytes the subscribers received on the wire where they run apart"
        + (" (padres' subscribers compressed)" if r.get("compressed") else "")
    )
    for name, m in live.items():
        rate = m["publications_per_second"]
        yield (
            f"  {name:<37} {rate:>9,.0f} publications/s, padres/this "
            f"{_ratio(base.get('publications_per_second'), rate)} "
            f"({_ratio(apart.get('publications_per_second'), rate)}); "
            f"p50 {m['latency_p50_ms']:.1f} ms, p99 {m['latency_p99_ms']:.1f} ms"
        )
        yield f"      settings: {r['settings'][name]}"
        cpu = m.get("cpu_us_per_delivery")
        sent = m.get("bytes_per_delivery")
        if cpu and sent:
            ours_cpu = (apart.get("cpu_us_per_delivery") or {}).get("servers")
            ours_sent = (apart.get("bytes_per_delivery") or {}).get("total")
            spent = ", ".join(f"{_ROLES.get(k, k)} {v:,.1f}" for k, v in cpu.items())
            yield (
                f"      per delivery: CPU {spent} us (servers padres/this "
                f"{_ratio(ours_cpu, cpu.get('servers'))}); bytes {sent['total']:,.0f} "
                f"(padres/this {_ratio(ours_sent, sent['total'])})"
            )
        got = (m.get("bytes_received_per_delivery") or {}).get("subscribers")
        if got:
            ours_got = (apart.get("bytes_received_per_delivery") or {}).get("subscribers")
            yield (
                f"      the subscribers received {got:,.1f} bytes per delivery on the wire "
                f"(padres/this {_ratio(ours_got, got)})"
            )
    if r["nats_missing"]:
        yield f"NATS not measured: {r['nats_missing']}"
    history = r["history"]
    if history is None:
        return
    mine = history["padres"]
    yield f"history: about 1% of {r['count']:,} stored publications by time and content"
    yield (
        f"  padres (SQLite node)   ingest {mine['ingest_per_second']:>9,.0f}/s  "
        f"replay {mine['replay_seconds'] * 1000:,.0f} ms ({mine['query_rows']:,} rows)"
    )
    for name in ("NATS JetStream", "NATS JetStream strong"):
        js = history.get(name)
        if js is None:
            continue
        acked = js.get("ingest_acked_per_second")
        also = f", acknowledged {acked:,.0f}/s" if acked else ""
        same = "the same as" if js["query_rows"] == mine["query_rows"] else "NOT the same as"
        yield (
            f"  {name:<22} ingest {js['ingest_per_second']:>9,.0f}/s{also}  "
            f"replay {js['replay_seconds'] * 1000:,.0f} ms ({js['query_rows']:,} rows, {same} "
            f"padres); padres {js['replay_seconds'] / mine['replay_seconds']:.1f}x faster"
        )
    yield "  promises when a publication counts as stored:"
    for side, promise in r["promises"].items():
        yield f"    {side}: {promise}"


def report(r: dict[str, Any]) -> str:
    return "\n".join(_lines(r))
