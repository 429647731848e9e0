"""``padres bench history``: ingest rate of a historic store and a historic query's latency.

The real stock quotes, repeated with shifted times until there are ``count`` publications (one
per second of event time), are written to a fresh store in commits of ``batch`` publications
(a database node's commits grow from 500 to 10,000 as publications come faster). Then a
historic query that selects about 1% of them, by time (a tenth of the span) and by content
(volume in the top tenth), runs three times; the median time to the last result is compared
with scanning the same publications in memory with the reference semantics.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from msgspec.structs import replace

from historic.errors import StoreError
from historic.store import Store
from padres.bench import machine
from padres.bench.workloads import START, stock_publications
from padres.matching.matcher import matches
from padres.model.messages import Filter, Predicate, Publication
from rete.operators import Op

__all__ = ["publications", "report", "run", "selection"]


def publications(count: int, data: Path | None) -> list[Publication]:
    """``count`` stock quotes, repeated as needed, one per second of event time from START."""
    quotes = stock_publications(data)
    out = []
    for i in range(count):
        q = quotes[i % len(quotes)]
        out.append(replace(q, id=f"h{i}", timestamp=START + timedelta(seconds=i)))
    return out


def selection(pubs: list[Publication]) -> tuple[Filter, datetime, datetime]:
    """About 1% of ``pubs``: a tenth of the span by time, the top tenth by volume."""
    count = len(pubs)
    volumes = sorted(int(p.attributes["volume"]) for p in pubs[: min(count, 100_000)])
    threshold = volumes[int(0.9 * (len(volumes) - 1))]
    flt = Filter((Predicate("class", Op.EQ, "STOCK"), Predicate("volume", Op.GT, threshold)))
    since = START + timedelta(seconds=int(count * 0.45))
    return flt, since, since + timedelta(seconds=count // 10)


def run(
    count: int = 1_000_000,
    url: str | None = None,
    data: Path | None = None,
    batch: int = 10_000,
) -> dict[str, Any]:
    pubs = publications(count, data)
    flt, since, until = selection(pubs)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(url or f"sqlite:///{tmp}/history.sqlite")
        if store.count():
            store.close()
            raise StoreError(f"the store at {url} is not empty: the benchmark needs an empty one")
        started = time.perf_counter()
        for i in range(0, count, batch):
            store.add(pubs[i : i + batch])
        ingest = time.perf_counter() - started
        times, rows = [], 0
        for _ in range(3):
            started = time.perf_counter()
            rows = len(store.query(flt, since=since, until=until))
            times.append(time.perf_counter() - started)
        dialect = store.dialect
        store.close()
    started = time.perf_counter()
    expected = sum(1 for p in pubs if since <= p.timestamp < until and matches(flt, p))
    scan = time.perf_counter() - started
    return {
        "machine": machine(),
        "store": dialect,
        "publications": count,
        "batch": batch,
        "ingest_seconds": ingest,
        "ingest_per_second": count / ingest,
        "query_rows": rows,
        "query_expected": expected,
        "query_seconds": statistics.median(times),
        "scan_seconds": scan,
    }


def report(r: dict[str, Any]) -> str:
    share = r["query_rows"] / r["publications"]
    return "\n".join(
        [
            f"historic store ({r['store']}), {r['publications']:,} stock publications",
            f"  ingest        {r['ingest_per_second']:>10,.0f} publications/s "
            f"({r['ingest_seconds']:.1f} s, commits of {r['batch']:,})",
            f"  query         {r['query_seconds'] * 1000:>10,.1f} ms to the last of "
            f"{r['query_rows']:,} results ({share:.2%}), median of 3; "
            f"same as the reference: {r['query_rows'] == r['query_expected']}",
            f"  in-memory scan {r['scan_seconds'] * 1000:>9,.1f} ms (reference semantics), "
            f"{r['scan_seconds'] / r['query_seconds']:.1f}x the query",
        ]
    )
