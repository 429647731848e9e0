"""``padres bench replay --peer jetstream``: the historic path and NATS JetStream in turns, in
one run.

Both sides take the same ``count`` publications (``historic.bench.history.publications``), then
answer the same 1% query (``selection``: a tenth of the span by time, the top tenth by volume)
in ``rounds`` rounds, each round one padres query then one JetStream read, so that both meet
the same load on the machine; the figures are the medians of the rounds and the median of the
rounds' ratios. The publications are loaded in this process, which hosts the padres client and
the JetStream reader in turns: it settles its garbage collector once they are loaded
(``padres.runtime.collector.freeze``), as brokers and the strong NATS subscribers do, so that
neither side's collections walk the harness's million publications.

- padres: a broker and a database node (``historic.bench.replay.node``); the ingest publishes
  through the broker and counts until the store holds the last one; the query is a historic
  subscription whose results a callback takes, timed to its ``ReplayDone``.
- JetStream: a nats-server of its own with JetStream (file storage) and the strong reader of
  ``padres bench peers`` (``peers.read_strong``: an ordered push consumer from the range's start
  time, msgspec decoding, the filter's Rete tests, in the subscription's callback); its stream
  is filled without waiting for acknowledgements (``peers.ingest_strong``).

The CPU a query costs is read from ``/proc`` for each side's processes (this one, the broker and
the node; this one and the nats-server): on a loaded machine it moves less than the time.

Ingest with the same promise: padres' figure is durable (an fsync at each commit); JetStream's
acknowledgements promise only the page cache unless the server syncs each write
(``sync_interval: always``, nats-server 2.10 and later), so its acknowledged ingest is measured
on ``synced_count`` publications both ways, with the default sync and with each write synced.
Without a nats-server (or the ``nats`` Python package), or with one too old to sync each write,
what cannot be measured is skipped, saying why.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Final

from historic.bench import replay
from historic.bench.history import publications, selection
from padres.bench import machine
from padres.bench.usage import cpu_seconds
from padres.client.connection import Client
from padres.model.messages import Publication
from padres.runtime import collector

__all__ = ["PROMISES", "SETTINGS", "report", "run"]

SETTINGS: Final = {
    "padres": "a broker and a database node (padres db, SQLite, WAL) as processes; the "
    "publisher sends frames of 500 through the broker; the query is a historic subscription, "
    "its results taken by a callback, timed to its ReplayDone",
    "JetStream": "one nats-server of its own, JetStream file storage, one stream STOCK.>; "
    "filled by plain publishes, one flush at the end; read by an ordered push consumer from "
    "the range's start time, msgspec into a quote struct, the filter's Rete tests, stopping at "
    "the first publication past the range, in its callback",
    "harness": "both clients in this process, in turns; its garbage collector settled once "
    "the publications are loaded (as a broker's)",
}
"""Each side's setup, one line each."""

PROMISES: Final = {
    "padres": "stored once the database node's SQLite transaction has committed (WAL, "
    "synchronous=FULL: an fsync at each commit; a commit every 0.1 s or every 500 waiting, up "
    "to 10,000 a commit); the publisher is not acknowledged",
    "JetStream, default sync": "acknowledged once in the server's files (the page cache); "
    "synced to disk every 2 minutes (every 60 s before nats-server 2.10)",
    "JetStream, sync_interval: always": "acknowledged once written and synced to disk "
    "(an fsync at each write)",
}
"""What each ingest has promised when it counts a publication stored."""


def _nats_missing(server: str) -> str | None:
    """Why JetStream cannot be measured here, or None."""
    try:
        from historic.bench import peers  # needs nats-py, a development dependency
    except ImportError as exc:
        return f"the nats Python package is missing ({exc}): pip install nats-py"
    return peers.nats_missing(server)


async def _padres_ingest(url: str, store: Any, pubs: list[Publication], rate: float) -> float:
    _, seconds = await replay.ingest(url, store, pubs, rate)
    return len(pubs) / seconds


class _Side:
    """One side's rounds: seconds, results, and CPU seconds of its processes."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.seconds: list[float] = []
        self.rows: list[int] = []
        self.cpu: list[float] = []

    async def time(self, read: Awaitable[int]) -> None:
        cpu = sum(map(cpu_seconds, self.pids))
        started = time.perf_counter()
        self.rows.append(await read)
        self.seconds.append(time.perf_counter() - started)
        self.cpu.append(sum(map(cpu_seconds, self.pids)) - cpu)

    def figures(self) -> dict[str, Any]:
        return {
            "replay_seconds": statistics.median(self.seconds),
            "cpu_seconds": statistics.fmean(self.cpu),  # /proc counts in ticks: summed up
            "runs": self.seconds,
            "cpu_runs": self.cpu,
            "rows": self.rows,
        }


async def _padres_read(analyst: Client, text: str) -> int:
    return (await replay.replayed(analyst, text))[1]


async def _rounds(
    stack: replay.Node, nats: tuple[str, int] | None, pubs: list[Publication], rounds: int
) -> dict[str, Any]:
    """Fill JetStream (if ``nats``: its URL and the server's process id), then ``rounds``
    rounds of one padres query and one JetStream read."""
    flt, since, until = selection(pubs)
    text = replay.query(pubs)
    here = os.getpid()
    mine = _Side([here, stack.broker_pid, stack.node_pid])
    theirs = _Side([here] if nats is None else [here, nats[1]])
    out: dict[str, Any] = {}
    nc = js = None
    try:
        if nats is not None:
            from nats import connect
            from nats.js.api import StorageType

            from historic.bench import peers

            nc = await connect(nats[0])
            js = nc.jetstream()
            await js.add_stream(name="STOCK", subjects=["STOCK.>"], storage=StorageType.FILE)
            started = time.perf_counter()
            start_time = await peers.ingest_strong(nc, pubs, acked=False)
            await peers.ingested(js, len(pubs))
            out["jetstream_ingest_per_second"] = len(pubs) / (time.perf_counter() - started)
        async with Client(stack.url, "analyst") as analyst:
            for _ in range(rounds):
                await mine.time(_padres_read(analyst, text))
                if js is not None:
                    await theirs.time(peers.read_strong(js, flt, since, until, start_time))
    finally:
        if nc is not None:
            await nc.close()
    out["padres"] = mine.figures()
    if theirs.seconds:
        out["JetStream"] = theirs.figures()
        ratios = [j / p for p, j in zip(mine.seconds, theirs.seconds, strict=True)]
        out["ratio"] = statistics.median(ratios)
        out["ratios"] = ratios
        spent = sum(mine.cpu)  # /proc counts in ticks (10 ms): a small query may show none
        out["cpu_ratio"] = sum(theirs.cpu) / spent if spent else None
    return out


async def _acked(nats_url: str, pubs: list[Publication]) -> float:
    """Publications per second into a fresh stream, each acknowledgement awaited (1,000 in
    flight), until the stream holds them all."""
    import nats
    from nats.js.api import StorageType

    from historic.bench import peers

    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="STOCK", subjects=["STOCK.>"], storage=StorageType.FILE)
        started = time.perf_counter()
        await peers.ingest_strong(nc, pubs, acked=True)
        await peers.ingested(js, len(pubs))
        return len(pubs) / (time.perf_counter() - started)
    finally:
        await nc.close()


def _synced_ingest(pubs: list[Publication], server: str) -> dict[str, Any]:
    """JetStream's acknowledged ingest with the default sync and with each write synced, and
    why either was not measured."""
    from historic.bench import peers

    out: dict[str, Any] = {}
    with peers.NatsCluster(1, jetstream=True, server=server) as cluster:
        out["default_per_second"] = asyncio.run(_acked(cluster.urls[0], pubs))
    version = peers.nats_version(server)
    out["version"] = ".".join(map(str, version))
    if version < peers.SYNCED_SINCE:
        out["synced_missing"] = (
            f"nats-server {out['version']} cannot sync each write (sync_interval came in "
            "2.10): give --nats-server a newer one"
        )
        return out
    with peers.NatsCluster(1, jetstream=True, synced=True, server=server) as cluster:
        out["synced_per_second"] = asyncio.run(_acked(cluster.urls[0], pubs))
    return out


def run(
    count: int = 1_000_000,
    rate: float = 100_000,
    data: Path | None = None,
    url: str | None = None,
    rounds: int = 10,
    synced_count: int = 20_000,
    server: str = "nats-server",
) -> dict[str, Any]:
    """See the module docstring; ``server``: the nats-server executable."""
    pubs = publications(count, data)
    flt, since, until = selection(pubs)
    collector.freeze()  # loaded: the harness's publications are not walked again
    missing = _nats_missing(server)
    with replay.node(url) as stack:
        ingest = asyncio.run(_padres_ingest(stack.url, stack.store, pubs, rate))
        expected = len(stack.store.query(flt, since=since, until=until))
        if missing is None:
            from historic.bench import peers

            with peers.NatsCluster(1, jetstream=True, server=server) as cluster:
                nats = (cluster.urls[0], cluster.pids[0])
                turns = asyncio.run(_rounds(stack, nats, pubs, rounds))
        else:
            turns = asyncio.run(_rounds(stack, None, pubs, rounds))
        peak = replay.peak_mib(stack.node_pid)
    theirs = turns.get("JetStream")
    if theirs is not None:
        acked = _synced_ingest(pubs[:synced_count], server)
        theirs.update(
            ingest_per_second=turns["jetstream_ingest_per_second"],
            ratio=turns["ratio"],
            ratios=turns["ratios"],
            cpu_ratio=turns["cpu_ratio"],
            acked_ingest={"publications": synced_count, **acked},
        )
    return {
        "machine": machine(),
        "publications": count,
        "rounds": rounds,
        "settings": SETTINGS,
        "promises": PROMISES,
        "nats_missing": missing,
        "query_expected": expected,
        "padres": {**turns["padres"], "ingest_per_second": ingest, "node_peak_mib": peak},
        "JetStream": theirs,
    }


def _all_equal(rows: list[int], expected: int) -> str:
    return "yes" if all(r == expected for r in rows) else f"NO ({sorted(set(rows))})"


def _times(ratio: float | None) -> str:
    return "not measurable (padres used less than a tick)" if ratio is None else f"{ratio:.1f}x"


def report(r: dict[str, Any]) -> str:
    mine, theirs = r["padres"], r["JetStream"]
    lines = [
        f"the 1% query of {r['publications']:,} stored publications ({r['query_expected']:,} "
        f"results), padres and JetStream in turns, {r['rounds']} rounds, medians",
        f"  padres      replay {mine['replay_seconds'] * 1000:>8,.1f} ms; every round equal to "
        f"the store's answer: {_all_equal(mine['rows'], r['query_expected'])}",
    ]
    if theirs is None:
        lines.append(f"  JetStream   not measured: {r['nats_missing']}")
    else:
        lines += [
            f"  JetStream   read   {theirs['replay_seconds'] * 1000:>8,.1f} ms; every round "
            f"equal to the store's answer: {_all_equal(theirs['rows'], r['query_expected'])}",
            f"  JetStream / padres {theirs['ratio']:.1f}x (median of the rounds' ratios; "
            f"rounds {', '.join(f'{x:.1f}' for x in theirs['ratios'])})",
            f"  CPU per query      padres {mine['cpu_seconds'] * 1000:,.0f} ms (client, broker "
            f"and node), JetStream {theirs['cpu_seconds'] * 1000:,.0f} ms (reader and "
            f"nats-server), means of the rounds; JetStream / padres {_times(theirs['cpu_ratio'])}",
        ]
    lines.append("ingest")
    lines.append(
        f"  padres, fsync at each commit          {mine['ingest_per_second']:>9,.0f}/s "
        f"({r['publications']:,}; the node's peak memory {mine['node_peak_mib'] or 0:,.0f} MiB)"
    )
    if theirs is not None:
        acked = theirs["acked_ingest"]
        n = acked["publications"]
        lines += [
            f"  JetStream, not acknowledged          {theirs['ingest_per_second']:>9,.0f}/s "
            f"({r['publications']:,})",
            f"  JetStream acked, default sync        {acked['default_per_second']:>9,.0f}/s "
            f"({n:,}; nats-server {acked['version']})",
        ]
        if "synced_per_second" in acked:
            lines.append(
                f"  JetStream acked, sync_interval always {acked['synced_per_second']:>8,.0f}/s "
                f"({n:,})"
            )
        else:
            lines.append(
                f"  JetStream acked, each write synced: not measured: {acked['synced_missing']}"
            )
    lines.append("settings:")
    lines += [f"  {side}: {text}" for side, text in r["settings"].items()]
    lines.append("promised when a publication counts as stored:")
    lines += [f"  {side}: {text}" for side, text in r["promises"].items()]
    return "\n".join(lines)
