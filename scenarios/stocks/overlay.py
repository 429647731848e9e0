"""PADRES' demo star on loopback: brokers A, C, D, E each linked to B, real processes.

A publisher at A sends stock quotes; subscribers at C, D and E subscribe with the demo
subscriptions; each prints how many quotes it received, against what the Rete matcher says it
should have received. Run: ``python scenarios/stocks/overlay.py [QUOTES]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from pathlib import Path

from padres import Client, ReteMatcher, parse_subscription
from padres.bench.workloads import STOCK_ADVERTISEMENT, stock_publications
from padres.model.protocol import Notify
from padres.testing.processes import BrokerProcess

SUBSCRIPTIONS = {
    "C": "[class,eq,'STOCK'],[symbol,eq,'AAPL']",
    "D": "[class,eq,'STOCK'],[volume,>,50000000]",
    "E": "[class,eq,'STOCK'],[symbol,str-prefix,'MS'],[close,<,25]",
}


async def demo(urls: dict[str, str], quotes_path: Path | None) -> None:
    quotes = stock_publications(quotes_path)
    async with contextlib.AsyncExitStack() as stack:
        received: dict[str, int] = {}
        for at, text in SUBSCRIPTIONS.items():
            client = await stack.enter_async_context(Client(urls[at], f"analyst-{at}"))
            received[at] = 0

            def count(note: object, at: str = at) -> None:
                received[at] += isinstance(note, Notify)

            await client.subscribe(text, count)
        publisher = await stack.enter_async_context(Client(urls["A"], "ticker"))
        await publisher.advertise(STOCK_ADVERTISEMENT)
        await asyncio.sleep(1.0)  # subscriptions find their way back to A
        expected = {}
        for at, text in SUBSCRIPTIONS.items():
            matcher = ReteMatcher()
            matcher.add(parse_subscription(text, id="s"))
            expected[at] = sum(1 for q in quotes if matcher.match(q).subscriptions)
        started = time.perf_counter()
        for i in range(0, len(quotes), 500):
            await publisher.publish_many(quotes[i : i + 500])
        while received != expected and time.perf_counter() - started < 120:
            await asyncio.sleep(0.05)
        elapsed = time.perf_counter() - started
    print(f"{len(quotes):,} quotes published at A in {elapsed:.1f} s, through B:")
    for at, text in SUBSCRIPTIONS.items():
        mark = "ok" if received[at] == expected[at] else "MISMATCH"
        print(f"  {at}: {received[at]:>6,} received, {expected[at]:>6,} expected  {mark}  {text}")
    if received != expected:
        raise SystemExit(1)


def main() -> None:
    quotes_path = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    procs = {"B": BrokerProcess("B")}
    procs["B"].start()
    try:
        for name in "ACDE":
            procs[name] = BrokerProcess(name, neighbours=[procs["B"].url])
            procs[name].start()
        asyncio.run(demo({n: p.url for n, p in procs.items()}, quotes_path))
    finally:
        for proc in procs.values():
            proc.stop()


if __name__ == "__main__":
    main()
