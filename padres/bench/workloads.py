"""Seeded workloads for the matching benchmark.

* ``stock``: the real quotes as publications; subscriptions in PADRES style, each with
  ``[class,eq,'STOCK']``, 90% with ``[symbol,eq,S]``, and 1 to 3 range predicates on
  open / high / low / close / volume whose thresholds are real values of that symbol (of any
  symbol for the other 10%), taken from the selective tail so a quote matches well under 1%.
* ``dense``: the workload of the matching literature (REIN, TAMA, HEM): 20 attributes with values
  in [1, 1,000,000]; each subscription has 10 ranges of width 300,000 on distinct attributes;
  each event gives all 20 values.
* ``composite``: a stream of orders, returns and server reports at 1,000 per second of event
  time; composite subscriptions of two parts (a customer's orders while the server handling
  them is overloaded) or three (an item ordered and returned by one customer while the server
  was overloaded), joined on variables, over a 10-second window.
* ``sequence``: the same stream, each publication stamped up to 50 ms early (so that some come
  out of order; the composites allow 100 ms of lateness); sequences of two parts (a customer's
  order, then the server handling it overloaded, within 10 s) or an item ordered and then
  returned by one customer within 10 s, one in five strictly next (``;;``).
* ``absence``: the same stream; a customer's order not returned within 2 s, or a server
  reported overloaded and not healthy within 1 s.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from padres.language.datasets import stockquote_files
from padres.language.parser import parse_composite, parse_publication, parse_subscription
from padres.model.messages import CompositeSubscription, Publication, Subscription
from rete import Op, Test, Value

__all__ = [
    "STOCK_ATTRIBUTES",
    "absence_subscriptions",
    "composite_publications",
    "composite_subscriptions",
    "dense_condition",
    "dense_events",
    "jittered",
    "sequence_subscriptions",
    "stock_publications",
    "stock_subscriptions",
]

STOCK_ATTRIBUTES = ("open", "high", "low", "close", "volume")
STOCK_ADVERTISEMENT = (
    "[class,eq,'STOCK'],[symbol,isPresent,''],[open,isPresent,0],[high,isPresent,0],"
    "[low,isPresent,0],[close,isPresent,0],[volume,isPresent,0],[date,isPresent,'']"
)
"""What a publisher of the real quotes advertises."""
START = datetime(2026, 11, 1, tzinfo=UTC)


def stock_publications(data: Path | None) -> list[Publication]:
    pubs: list[Publication] = []
    for path in stockquote_files(data):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                pubs.append(parse_publication(line, id=f"q{len(pubs)}", timestamp=START))
    return pubs


def stock_subscriptions(count: int, quotes: list[Publication], seed: int) -> Iterator[Subscription]:
    rng = random.Random(seed)
    values: dict[str | None, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for q in quotes:
        for a in STOCK_ATTRIBUTES:
            value = float(q.attributes[a])
            values[q.attributes["symbol"]][a].append(value)  # type: ignore[index]
            values[None][a].append(value)
    for pool in values.values():
        for a in STOCK_ATTRIBUTES:
            pool[a].sort()
    symbols = sorted(s for s in values if s is not None)
    for i in range(count):
        preds = ["[class,eq,'STOCK']"]
        symbol = rng.choice(symbols) if rng.random() < 0.9 else None
        if symbol is not None:
            preds.append(f"[symbol,eq,'{symbol}']")
        pool = values[symbol]
        tail = 0.5 if symbol is not None else 0.1  # the rarer side of the distribution
        for _ in range(rng.randint(1, 3)):
            a = rng.choice(STOCK_ATTRIBUTES)
            sorted_values = pool[a]
            if rng.random() < 0.5:
                rank, op = 1 - rng.random() * tail, rng.choice([">", ">="])
            else:
                rank, op = rng.random() * tail, rng.choice(["<", "<="])
            threshold = sorted_values[int(rank * (len(sorted_values) - 1))]
            preds.append(f"[{a},{op},{threshold!r}]")
        yield parse_subscription(",".join(preds), id=f"s{i}")


def dense_condition(rng: np.random.Generator) -> tuple[Test, ...]:
    """One dense-workload subscription as rete tests (``[class,eq,'E']`` and 10 ranges)."""
    attrs = rng.choice(20, size=10, replace=False)
    lows = rng.integers(1, 700_001, size=10)
    tests = [Test("class", Op.EQ, "E")]
    for a, lo in zip(attrs.tolist(), lows.tolist(), strict=True):
        tests.append(Test(f"a{a}", Op.GE, lo))
        tests.append(Test(f"a{a}", Op.LE, lo + 300_000))
    return tuple(tests)


def dense_events(count: int, seed: int) -> list[Publication]:
    rng = np.random.default_rng(seed)
    values = rng.integers(1, 1_000_001, size=(count, 20)).tolist()
    return [
        Publication(f"e{i}", {"class": "E", **{f"a{j}": v for j, v in enumerate(row)}}, START)
        for i, row in enumerate(values)
    ]


CUSTOMERS, ITEMS, SERVERS = 20_000, 500, 100


def composite_subscriptions(count: int, seed: int) -> Iterator[CompositeSubscription]:
    rng = random.Random(seed)
    overloaded = "{[class,eq,'SysInfo'],[status,eq,'overloaded'],[server,eq,$S$V]}"
    for i in range(count):
        if rng.random() < 0.7:
            customer = rng.randrange(CUSTOMERS)
            order = f"{{[class,eq,'Order'],[customer,eq,'c{customer}'],[server,eq,$S$V]}}"
            text = f"{order} & {overloaded}"
        else:
            item = rng.randrange(ITEMS)
            text = (
                f"{{[class,eq,'Order'],[item,eq,'i{item}'],[customer,eq,$S$C],[server,eq,$S$V]}}"
                f" & {{[class,eq,'Return'],[item,eq,'i{item}'],[customer,eq,$S$C]}} & {overloaded}"
            )
        yield parse_composite(text, id=f"c{i}")


def sequence_subscriptions(count: int, seed: int) -> Iterator[CompositeSubscription]:
    rng = random.Random(seed)
    overloaded = "{[class,eq,'SysInfo'],[status,eq,'overloaded'],[server,eq,$S$V]}"
    for i in range(count):
        then = ";;" if rng.random() < 0.2 else ";"
        if rng.random() < 0.7:
            customer = rng.randrange(CUSTOMERS)
            order = f"{{[class,eq,'Order'],[customer,eq,'c{customer}'],[server,eq,$S$V]}}"
            text = f"{order} {then} {overloaded} within 10s late 100ms"
        else:
            item = rng.randrange(ITEMS)
            text = (
                f"{{[class,eq,'Order'],[item,eq,'i{item}'],[customer,eq,$S$C]}} {then} "
                f"{{[class,eq,'Return'],[item,eq,'i{item}'],[customer,eq,$S$C]}}"
                " within 10s late 100ms"
            )
        yield parse_composite(text, id=f"q{i}")


def absence_subscriptions(count: int, seed: int) -> Iterator[CompositeSubscription]:
    rng = random.Random(seed)
    for i in range(count):
        if rng.random() < 0.7:
            customer = rng.randrange(CUSTOMERS)
            text = (
                f"{{[class,eq,'Order'],[customer,eq,'c{customer}'],[item,eq,$S$I]}} ; "
                f"!{{[class,eq,'Return'],[customer,eq,'c{customer}'],[item,eq,$S$I]}}"
                " within 2s late 100ms"
            )
        else:
            server = rng.randrange(SERVERS)
            text = (
                f"{{[class,eq,'SysInfo'],[server,eq,'v{server}'],[status,eq,'overloaded']}} ; "
                f"!{{[class,eq,'SysInfo'],[server,eq,'v{server}'],[status,eq,'healthy']}}"
                " within 1s late 100ms"
            )
        yield parse_composite(text, id=f"n{i}")


def jittered(pubs: list[Publication], seed: int, most: timedelta) -> list[Publication]:
    """``pubs`` in the same order, each stamped up to ``most`` earlier: some out of order."""
    rng = random.Random(seed)
    return [
        Publication(p.id, p.attributes, p.timestamp - most * rng.random(), p.publisher)
        for p in pubs
    ]


def composite_publications(count: int, seed: int) -> list[Publication]:
    rng = random.Random(seed)
    pubs = []
    for i in range(count):
        ts = START + timedelta(milliseconds=i)
        server = f"v{rng.randrange(SERVERS)}"
        r = rng.random()
        attrs: dict[str, Value]
        if r < 0.70:
            attrs = {
                "class": "Order",
                "customer": f"c{rng.randrange(CUSTOMERS)}",
                "item": f"i{rng.randrange(ITEMS)}",
                "price": rng.randint(1, 500),
                "server": server,
            }
        elif r < 0.75:
            attrs = {
                "class": "Return",
                "customer": f"c{rng.randrange(CUSTOMERS)}",
                "item": f"i{rng.randrange(ITEMS)}",
                "server": server,
            }
        else:
            status = "overloaded" if rng.random() < 0.05 else "healthy"
            attrs = {"class": "SysInfo", "server": server, "status": status}
        pubs.append(Publication(f"m{i}", attrs, ts))
    return pubs
