"""``padres bench replay``: the historic path end to end, through a broker and a database node.

A broker and a database node (``padres db``, storing ``[class,eq,'STOCK']`` in a fresh SQLite
file, or in the empty database at ``url``) run as processes. A publisher sends ``count`` stock
publications (the real quotes, repeated with shifted times, one per second of event time) at up
to ``rate`` per second; the ingest rate is the count over the time until the database has stored
the last one. Then a client makes a historic subscription selecting about 1% (a tenth of the
span by time, the top tenth by volume) and the time to its ``ReplayDone`` (the last result) is
measured, median of 3, against the same query run on the store directly in this process. The
node's peak resident memory is read from ``/proc`` at the end.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from historic.bench.history import publications, selection
from historic.errors import StoreError
from historic.store import Store
from padres.bench import machine
from padres.bench.workloads import STOCK_ADVERTISEMENT
from padres.client.connection import Client
from padres.model.printer import format_filter
from padres.testing.processes import BrokerProcess, DatabaseProcess

__all__ = ["report", "run"]


async def _drive(
    url: str, store: Store, count: int, rate: float, data: Path | None
) -> dict[str, Any]:
    pubs = publications(count, data)
    flt, since, until = selection(pubs)
    async with Client(url, "ticker") as ticker, Client(url, "analyst") as analyst:
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
        ingest = time.perf_counter() - started
        text = (
            f"{format_filter(flt)},[time,>=,'{since.isoformat()}'],[time,<,'{until.isoformat()}']"
        )
        times, rows = [], 0
        for _ in range(3):
            t0 = time.perf_counter()
            handle = await analyst.subscribe(text)
            rows = len([d async for d in handle])
            times.append(time.perf_counter() - t0)
    direct = []
    for _ in range(3):
        t0 = time.perf_counter()
        expected = len(store.query(flt, since=since, until=until))
        direct.append(time.perf_counter() - t0)
    return {
        "machine": machine(),
        "publications": count,
        "publish_seconds": published,
        "ingest_seconds": ingest,
        "ingest_per_second": count / ingest,
        "query_rows": rows,
        "query_expected": expected,
        "replay_seconds": statistics.median(times),
        "store_query_seconds": statistics.median(direct),
    }


def run(
    count: int = 1_000_000,
    rate: float = 100_000,
    data: Path | None = None,
    url: str | None = None,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        db_url = url or f"sqlite:///{tmp}/replay.sqlite"
        store = Store(db_url)
        if store.count():
            store.close()
            raise StoreError(f"the store at {url} is not empty: the benchmark needs an empty one")
        broker = BrokerProcess("B1")
        broker_url = broker.start()
        db = DatabaseProcess("DB1", broker_url, db_url, stores=["[class,eq,'STOCK']"])
        try:
            db.start()
            result = asyncio.run(_drive(broker_url, store, count, rate, data))
            result["store"] = store.dialect
            result["node_peak_mib"] = _peak_mib(db.pid)
            return result
        finally:
            store.close()
            db.stop()
            broker.stop()


def _peak_mib(pid: int | None) -> float | None:
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
