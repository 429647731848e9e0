"""``padres bench replay``: the historic path end to end, through a broker and a database node.

A broker and a database node (``padres db``, storing ``[class,eq,'STOCK']`` in a fresh SQLite
file, or in the empty database at ``url``) run as processes. A publisher sends ``count`` stock
publications (the real quotes, repeated with shifted times, one per second of event time) at up
to ``rate`` per second; the ingest rate is the count over the time until the database has stored
the last one. Then a client makes a historic subscription selecting about 1% (a tenth of the
span by time, the top tenth by volume), its results taken by a callback, and the time to its
``ReplayDone`` (after the last result) is measured, median of 3, against the same query run on
the store directly in this process. The node's peak resident memory is read from ``/proc`` at
the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from historic.bench.history import publications, selection
from historic.errors import StoreError
from historic.store import Store
from padres.bench import machine
from padres.bench.workloads import STOCK_ADVERTISEMENT
from padres.client.connection import Client, Delivery
from padres.model.messages import Publication
from padres.model.printer import format_filter
from padres.testing.processes import BrokerProcess, DatabaseProcess

__all__ = ["Node", "ingest", "node", "peak_mib", "query", "replayed", "report", "run"]


async def ingest(
    url: str, store: Store, pubs: list[Publication], rate: float
) -> tuple[float, float]:
    """Publish ``pubs`` through the broker at ``url``, at up to ``rate`` per second, in frames
    of 500; returns the seconds publishing took and those until ``store`` held them all."""
    count = len(pubs)
    async with Client(url, "ticker") as ticker:
        await ticker.advertise(STOCK_ADVERTISEMENT)
        started = time.perf_counter()
        for i in range(0, count, 500):
            await ticker.publish_many(pubs[i : i + 500])
            ahead = (i + 500) / rate - (time.perf_counter() - started)
            if ahead > 0:
                await asyncio.sleep(ahead)
        published = time.perf_counter() - started
        stored = 0
        while stored < count:
            await asyncio.sleep(0.2)
            stored = await asyncio.to_thread(store.count)
        return published, time.perf_counter() - started


def query(pubs: list[Publication]) -> str:
    """The historic subscription of the 1% selection of ``pubs`` (``selection``)."""
    flt, since, until = selection(pubs)
    return f"{format_filter(flt)},[time,>=,'{since.isoformat()}'],[time,<,'{until.isoformat()}']"


async def replayed(analyst: Client, text: str) -> tuple[float, int]:
    """Make the historic subscription ``text``, its results taken by a callback (as a
    JetStream push consumer's messages are): the seconds to its ``ReplayDone``, and the
    results."""
    results: list[Delivery] = []
    started = time.perf_counter()
    handle = await analyst.subscribe(text, callback=results.append)
    await handle.replayed()
    return time.perf_counter() - started, len(results)


async def _drive(
    url: str, store: Store, count: int, rate: float, data: Path | None
) -> dict[str, Any]:
    pubs = publications(count, data)
    flt, since, until = selection(pubs)
    published, ingested = await ingest(url, store, pubs, rate)
    times, rows = [], 0
    async with Client(url, "analyst") as analyst:
        for _ in range(3):
            seconds, rows = await replayed(analyst, query(pubs))
            times.append(seconds)
    direct = []
    for _ in range(3):
        t0 = time.perf_counter()
        expected = len(store.query(flt, since=since, until=until))
        direct.append(time.perf_counter() - t0)
    return {
        "machine": machine(),
        "publications": count,
        "publish_seconds": published,
        "ingest_seconds": ingested,
        "ingest_per_second": count / ingested,
        "query_rows": rows,
        "query_expected": expected,
        "replay_seconds": statistics.median(times),
        "store_query_seconds": statistics.median(direct),
    }


class Node(NamedTuple):
    """A broker and a database node behind it, as processes (``node``)."""

    url: str
    """The broker's."""
    store: Store
    """The node's store, opened in this process too."""
    broker_pid: int
    node_pid: int


@contextlib.contextmanager
def node(url: str | None = None) -> Iterator[Node]:
    """A broker and a database node storing ``[class,eq,'STOCK']`` as processes, on a fresh
    SQLite file or the empty database at ``url``."""
    with tempfile.TemporaryDirectory() as tmp:
        db_url = url or f"sqlite:///{tmp}/replay.sqlite"
        store = Store(db_url)
        if store.count():
            store.close()
            raise StoreError(f"the store at {url} is not empty: the benchmark needs an empty one")
        broker = BrokerProcess("B1")
        db = DatabaseProcess("DB1", broker.start(), db_url, stores=["[class,eq,'STOCK']"])
        try:
            db.start()
            assert broker.pid is not None and db.pid is not None
            yield Node(broker.url, store, broker.pid, db.pid)
        finally:
            store.close()
            db.stop()
            broker.stop()


def run(
    count: int = 1_000_000,
    rate: float = 100_000,
    data: Path | None = None,
    url: str | None = None,
) -> dict[str, Any]:
    with node(url) as stack:
        result = asyncio.run(_drive(stack.url, stack.store, count, rate, data))
        result["store"] = stack.store.dialect
        result["node_peak_mib"] = peak_mib(stack.node_pid)
        return result


def peak_mib(pid: int | None) -> float | None:
    """A process's peak resident memory (``VmHWM``), in MiB, where ``/proc`` tells it."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def report(r: dict[str, Any]) -> str:
    share = r["query_rows"] / r["publications"]
    return "\n".join(
        [
            f"historic path through a broker and a database node ({r['store']}), "
            f"{r['publications']:,} stock publications",
            f"  ingest        {r['ingest_per_second']:>10,.0f} publications/s stored "
            f"({r['ingest_seconds']:.1f} s; publishing took {r['publish_seconds']:.1f} s; "
            f"the node's peak memory {r['node_peak_mib'] or 0:,.0f} MiB)",
            f"  replay        {r['replay_seconds'] * 1000:>10,.1f} ms to the end of the replay of "
            f"{r['query_rows']:,} results ({share:.2%}), median of 3; "
            f"same as the store's own answer: {r['query_rows'] == r['query_expected']}",
            f"  store query   {r['store_query_seconds'] * 1000:>10,.1f} ms (in process); replay: "
            f"{r['replay_seconds'] / r['store_query_seconds']:.1f}x that",
        ]
    )
