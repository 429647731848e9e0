"""``padres bench archive``: the archive's load and query figures.

1. The real stock quotes (or the sample shipped in the package) are loaded with their trading
   dates as publication times, and a historic subscription for one symbol in 1999 is made
   through a broker, answered by an archive node; its deliveries are compared with what the
   reference matcher finds in the quotes, and the files the node read are counted.
2. ``count`` synthetic publications over 100 months are written as PADRES text and loaded.
   A query selecting about 1% of them (two months by time, half by content) is answered from
   the files the catalog keeps, and from a full scan of the same archive, both exactly (read
   here with pyarrow) and by Spark; each figure is the median of ``repeat`` runs.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from padres.language.datasets import stockquote_files
from padres.language.parser import parse_filter, parse_publication
from padres.matching.reference import ReferenceMatcher
from padres.model.messages import Filter, Publication, Subscription
from spark.archive import Archive
from spark.inputs import Reading
from spark.load import load
from spark.query import spark_query
from spark.session import DEFAULT_MASTER

__all__ = ["QUOTES_QUERY", "report", "run"]

QUOTES_QUERY: Final = (
    "[class,eq,'STOCK'],[symbol,eq,'MSFT'],[close,>,50],"
    "[time,>=,'1999-01-01'],[time,<,'2000-01-01']"
)
SYNTHETIC_START: Final = datetime(2000, 1, 1, tzinfo=UTC)
MONTHS: Final = 100
LINES_PER_FILE: Final = 250_000


def _reference_quotes(flt: Filter, files: list[Path]) -> set[str]:
    """The ids the load gives the quotes the reference matcher finds for ``flt``."""
    content = Filter(flt.predicates)
    matcher = ReferenceMatcher()
    matcher.add(Subscription("q", content))
    found = set()
    window = flt.window
    for path in files:
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
            pub = parse_publication(line, id="q", timestamp=SYNTHETIC_START)
            day = datetime.strptime(str(pub.attributes["date"]), "%d-%b-%y").replace(tzinfo=UTC)
            if (window is None or day in window) and matcher.match(pub).subscriptions:
                found.add(f"{path.name}-{i + 1}")
    return found


async def _through_a_broker(root: Path, text: str) -> tuple[list[Publication], int, float]:
    """A historic subscription through a broker and an archive node: what it delivered, the
    files the node read and the seconds to ``ReplayDone``."""
    from padres.client.connection import Client
    from padres.model.protocol import Notify
    from padres.testing.processes import BrokerProcess
    from spark.node import ArchiveNode

    broker = BrokerProcess("B1")
    url = broker.start()
    archive = Archive(root)
    try:
        node_client = await Client(url, "A1").connect()
        node = ArchiveNode("A1", node_client, archive)
        await node.start()
        manager = await Client(url, "manager").connect()
        started = time.perf_counter()
        past = await manager.subscribe(text)
        got = [note.publication async for note in past if isinstance(note, Notify)]
        seconds = time.perf_counter() - started
        await manager.close()
        await node.stop()
        await node_client.close()
        return got, node.files_read, seconds
    finally:
        archive.close()
        broker.stop()


def _synthetic(count: int, out: Path, seed: int = 11) -> list[str]:
    """``count`` trades over ``MONTHS`` months as PADRES text, in files of at most
    ``LINES_PER_FILE`` lines, in random time order."""
    rng = random.Random(seed)
    span = int((SYNTHETIC_START.replace(year=2008, month=5) - SYNTHETIC_START).total_seconds())
    paths = []
    for first in range(0, count, LINES_PER_FILE):
        path = out / f"trades-{first // LINES_PER_FILE:04d}.txt"
        lines = []
        for _ in range(min(LINES_PER_FILE, count - first)):
            at = SYNTHETIC_START + timedelta(seconds=rng.randrange(span))
            lines.append(
                f"[class,'TRADE'],[symbol,'S{rng.randrange(500):03d}'],"
                f"[price,{rng.randrange(1, 100_000) / 100}],[volume,{rng.randrange(1000)}],"
                f"[time,'{at.isoformat()}']\n"
            )
        path.write_text("".join(lines), encoding="utf-8")
        paths.append(str(path))
    return paths


def _median(repeat: int, work: Callable[[], Any]) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def _quotes(
    work: Path, master: str, data: Path | None, progress: Callable[[str], None]
) -> dict[str, Any]:
    files = stockquote_files(data)
    reading = Reading(time_attribute="date", time_format="%d-%b-%y")
    loaded = load([str(p) for p in files], work, reading, master=master, progress=progress)
    got, read, seconds = asyncio.run(_through_a_broker(work, QUOTES_QUERY))
    expected = _reference_quotes(parse_filter(QUOTES_QUERY), files)
    times = [p.timestamp for p in got]
    archive = Archive(work)
    in_1999 = sum(f.period.startswith("1999") for f in archive.files())
    archive.close()
    progress(f"quotes: {len(got)} matches through a broker, {read} files read")
    return {
        "quotes": loaded.rows,
        "quotes_load_s": loaded.seconds,
        "quotes_files": loaded.files,
        "quotes_query": QUOTES_QUERY,
        "quotes_matches": len(got),
        "quotes_expected": len(expected),
        "quotes_exact": sorted(p.id for p in got) == sorted(expected) and times == sorted(times),
        "quotes_files_read": read,
        "quotes_files_1999": in_1999,
        "quotes_replay_s": seconds,
    }


def _selection() -> Filter:
    """About 1%: two of the 100 months, volume below 500 of 1000."""
    start = SYNTHETIC_START.replace(year=2004, month=1)
    end = start.replace(month=3)
    return parse_filter(
        f"[class,eq,'TRADE'],[volume,<,500],[time,>=,'{start.isoformat()}'],"
        f"[time,<,'{end.isoformat()}']"
    )


def _synthetic_run(
    count: int, work: Path, master: str, repeat: int, progress: Callable[[str], None]
) -> dict[str, Any]:
    inputs = _synthetic(count, work)
    progress(f"wrote {count:,} synthetic publications")
    loaded = load(inputs, work / "archive", Reading(), master=master, progress=progress)
    archive = Archive(work / "archive")
    query = _selection()
    plan = archive.plan(query)
    pruned_s, pruned = _median(repeat, lambda: archive.query(query, plan))
    full_s, full = _median(repeat, lambda: archive.full_scan(query))
    spark_s, by_spark = _median(repeat, lambda: spark_query(archive, query, master=master))
    spark_full_s, by_spark_full = _median(
        repeat, lambda: spark_query(archive, query, master=master, prune=False)
    )
    archive.close()
    same = [p.id for p in by_spark.publications] == [p.id for p in by_spark_full.publications]
    return {
        "synthetic_load_s": loaded.seconds,
        "synthetic_files": loaded.files,
        "query_rows": len(pruned),
        "query_fraction": len(pruned) / count,
        "query_files_read": len(plan.read),
        "query_files": plan.of,
        "query_pruned_s": pruned_s,
        "query_full_s": full_s,
        "spark_pruned_s": spark_s,
        "spark_full_s": spark_full_s,
        "query_exact": pruned == full and same and len(by_spark.publications) == len(pruned),
    }


def run(
    count: int = 10_000_000,
    master: str = DEFAULT_MASTER,
    data: Path | None = None,
    repeat: int = 3,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    result: dict[str, Any] = {"master": master, "count": count}
    with tempfile.TemporaryDirectory(prefix="padres-archive-") as tmp:
        result.update(_quotes(Path(tmp) / "quotes", master, data, progress))
        if count:
            synthetic = Path(tmp) / "synthetic"
            synthetic.mkdir()
            result.update(_synthetic_run(count, synthetic, master, repeat, progress))
    return result


def report(r: dict[str, Any]) -> str:
    lines = [
        f"archive on {r['master']}",
        f"  real quotes: {r['quotes']:,} loaded into {r['quotes_files']} files in "
        f"{r['quotes_load_s']:.1f} s",
        f"  {r['quotes_query']}",
        f"    through a broker: {r['quotes_matches']} publications in "
        f"{r['quotes_replay_s']:.2f} s, "
        f"{'equal to' if r['quotes_exact'] else 'DIFFERENT FROM'} the reference matcher's "
        f"{r['quotes_expected']}; read {r['quotes_files_read']} files "
        f"({r['quotes_files_1999']} hold 1999) of {r['quotes_files']}",
    ]
    if r["count"]:
        lines += [
            f"  synthetic: {r['count']:,} loaded into {r['synthetic_files']} files in "
            f"{r['synthetic_load_s']:.1f} s",
            f"  a query selecting {r['query_fraction']:.2%} ({r['query_rows']:,} rows): "
            f"{r['query_files_read']} of {r['query_files']} files "
            f"({r['query_files_read'] / r['query_files']:.1%})",
            f"    pruned {r['query_pruned_s']:.2f} s, full scan {r['query_full_s']:.2f} s "
            f"({r['query_full_s'] / r['query_pruned_s']:.1f}x), exact",
            f"    by Spark: pruned {r['spark_pruned_s']:.2f} s, "
            f"full scan {r['spark_full_s']:.2f} s "
            f"({r['spark_full_s'] / r['spark_pruned_s']:.1f}x)"
            + ("" if r["query_exact"] else "  RESULTS DIFFER"),
        ]
    return "\n".join(lines)
