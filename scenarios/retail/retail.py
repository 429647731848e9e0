"""The PADRES retail demonstration, end to end on loopback.

Four brokers in a cycle (B1-B2-B3-B4-B1, and B1-B3); two database nodes on SQLite files, DB1 at
B2 storing orders, returns and cancellations and DB2 at B4 storing orders and server status (so
orders are stored twice). Customers at B1 and B3 publish Order / Return / Cancel; server agents at
B2 and B4 publish SysInfo with their status for each user type they serve.

The day has two halves. After the first, a sales manager at B3 subscribes:

- future: orders of shoes, from now on;
- historic: orders over 100 in the first half;
- hybrid: every order of customer C7, the first half and everything after;
- composite: orders of user types served by an overloaded server, both in the first half.

Then the second half is published, and the report compares what each subscription received with
what it should have, computed from what was published. Run:
``python scenarios/retail/retail.py [--json REPORT]``; exits 1 on a mismatch.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from padres import Client, Publication, ReferenceMatcher, parse_composite
from padres.client.connection import Delivery
from padres.language.parser import parse_filter
from padres.matching.matcher import matches
from padres.model.codec import to_dict
from padres.model.protocol import Notify, ReplayDone
from padres.testing.processes import BrokerProcess, DatabaseProcess

ITEMS = ["shoes", "shirt", "hat", "bag", "watch"]
USER_TYPES = ["general", "silver", "gold", "VIP"]
SERVERS = {"S1": ("B2", ["general", "silver"]), "S2": ("B4", ["gold", "VIP"])}
CUSTOMERS = {"B1": [f"C{i}" for i in range(0, 10, 2)], "B3": [f"C{i}" for i in range(1, 10, 2)]}
SHOP_ADVERTISEMENTS = [
    "[class,eq,'Order'],[orderID,isPresent],[customerID,isPresent],[item,isPresent],"
    "[price,isPresent],[userType,isPresent]",
    "[class,eq,'Return'],[orderID,isPresent],[customerID,isPresent]",
    "[class,eq,'Cancel'],[orderID,isPresent],[customerID,isPresent]",
]
SYSINFO_ADVERTISEMENT = "[class,eq,'SysInfo'],[server,isPresent],[status,isPresent]"


@dataclass
class Subscriptions:
    """The sales manager's subscriptions, written once the first half is over."""

    first_half: tuple[datetime, datetime]

    def texts(self) -> dict[str, str]:
        start, end = (t.isoformat() for t in self.first_half)
        half = f"[time,>=,'{start}'],[time,<,'{end}']"
        return {
            "future": "[class,eq,'Order'],[item,eq,'shoes']",
            "historic": f"[class,eq,'Order'],[price,>,100],{half}",
            "hybrid": f"[class,eq,'Order'],[customerID,eq,'C7'],[time,>=,'{start}']",
            "composite": (
                f"{{[class,eq,'SysInfo'],[status,eq,'overloaded'],[userType,eq,$U],{half}}}"
                f" & {{[class,eq,'Order'],[userType,eq,$U],{half}}}"
            ),
        }


@dataclass
class Report:
    published: list[Publication] = field(default_factory=list)
    subscriptions: dict[str, str] = field(default_factory=dict)
    received: dict[str, list[Delivery]] = field(default_factory=dict)
    replays: dict[str, ReplayDone] = field(default_factory=dict)
    second_half: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "published": [to_dict(p) for p in self.published],
            "subscriptions": self.subscriptions,
            "second_half": self.second_half.isoformat() if self.second_half else None,
            "received": {
                name: [_delivery_ids(d) for d in got] for name, got in self.received.items()
            },
            "replays": {
                name: {"count": d.count, "databases": d.databases, "failed": d.failed}
                for name, d in self.replays.items()
            },
        }


def _delivery_ids(delivery: Delivery) -> list[str]:
    if isinstance(delivery, Notify):
        return [delivery.publication.id]
    return sorted(p.id for p in delivery.publications)


def expected(report: Report) -> dict[str, list[list[str]]]:
    """What each subscription should have received, from what was published."""
    second = report.second_half
    assert second is not None
    out: dict[str, list[list[str]]] = {}
    for name, text in report.subscriptions.items():
        if name == "composite":
            matcher = ReferenceMatcher()
            matcher.add(parse_composite(text, id=name))
            window = parse_composite(text, id=name).filters[0].window
            assert window is not None
            found = []
            for pub in report.published:
                if pub.timestamp in window:
                    for match in matcher.match(pub).composites:
                        found.append(sorted(p.id for p in match.publications))
            out[name] = sorted(found)
            continue
        flt = parse_filter(text)
        out[name] = [
            [p.id]
            for p in report.published
            if matches(flt, p)
            and (flt.window is None or p.timestamp in flt.window)
            and (name != "future" or p.timestamp >= second)
        ]
    return out


def _timeline(rng: random.Random, n: int, first: int) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(broker, client, attributes) of the next ``n`` publications of the day."""
    orders: list[tuple[str, str]] = []
    for k in range(first, first + n):
        roll = rng.random()
        if roll < 0.02:
            server = rng.choice(sorted(SERVERS))
            at, served = SERVERS[server]
            status = "overloaded" if rng.random() < 0.5 else "healthy"
            for user in served:
                yield (
                    at,
                    f"agent-{server}",
                    {
                        "class": "SysInfo",
                        "server": server,
                        "status": status,
                        "userType": user,
                    },
                )
        elif roll < 0.08 and orders:
            order, customer = rng.choice(orders)
            at = next(b for b, cs in CUSTOMERS.items() if customer in cs)
            kind = "Return" if roll < 0.05 else "Cancel"
            yield at, f"shop-{at}", {"class": kind, "orderID": order, "customerID": customer}
        else:
            at = rng.choice(sorted(CUSTOMERS))
            customer = rng.choice(CUSTOMERS[at])
            order = f"O{k}"
            orders.append((order, customer))
            yield (
                at,
                f"shop-{at}",
                {
                    "class": "Order",
                    "orderID": order,
                    "customerID": customer,
                    "item": rng.choice(ITEMS),
                    "price": rng.randrange(5, 300),
                    "userType": USER_TYPES[int(customer[1:]) % 4],
                },
            )


async def _publish(
    clients: dict[str, Client], report: Report, rng: random.Random, n: int, first: int
) -> None:
    for _, client, attrs in _timeline(rng, n, first):
        pub = Publication(f"{client}-{len(report.published)}", attrs, datetime.now(UTC))
        await clients[client].publish(pub)
        report.published.append(
            Publication(pub.id, attrs, pub.timestamp, f"{client}@{clients[client].broker}")
        )
        await asyncio.sleep(0.002)


async def day(urls: dict[str, str], per_half: int, seed: int) -> Report:
    rng = random.Random(seed)
    report = Report()
    async with contextlib.AsyncExitStack() as stack:
        clients: dict[str, Client] = {}
        for at in CUSTOMERS:
            shop = clients[f"shop-{at}"] = await stack.enter_async_context(
                Client(urls[at], f"shop-{at}")
            )
            for adv in SHOP_ADVERTISEMENTS:
                await shop.advertise(adv)
        for server, (at, _) in SERVERS.items():
            agent = clients[f"agent-{server}"] = await stack.enter_async_context(
                Client(urls[at], f"agent-{server}")
            )
            await agent.advertise(SYSINFO_ADVERTISEMENT)
        manager = await stack.enter_async_context(Client(urls["B3"], "sales-manager"))
        await asyncio.sleep(1.0)  # advertisements flood, the databases' subscriptions settle

        start = datetime.now(UTC)
        await _publish(clients, report, rng, per_half, 0)
        end = datetime.now(UTC) + timedelta(microseconds=1)
        report.subscriptions = Subscriptions((start, end)).texts()

        handles = {}
        for name, text in report.subscriptions.items():
            got = report.received[name] = []
            if name == "composite":
                handles[name] = await manager.subscribe_composite(text, got.append, id=name)
            else:
                handles[name] = await manager.subscribe(text, got.append, id=name)
        await asyncio.sleep(0.5)  # the future subscriptions reach the shops
        report.second_half = datetime.now(UTC)
        await _publish(clients, report, rng, per_half, per_half)
        for name in ("historic", "hybrid", "composite"):
            report.replays[name] = await handles[name].replayed(timeout=30)
        want = expected(report)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(
            len(report.received[n]) < len(want[n]) for n in want
        ):
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # anything extra would arrive now
    return report


def print_report(report: Report) -> bool:
    want = expected(report)
    ok = True
    pubs = report.published
    kinds = {k: sum(p.class_name == k for p in pubs) for k in ("Order", "Return", "Cancel")}
    sysinfo = sum(p.class_name == "SysInfo" for p in pubs)
    print(
        f"published {len(pubs)}: {kinds['Order']} orders, {kinds['Return']} returns, "
        f"{kinds['Cancel']} cancellations, {sysinfo} server status reports"
    )
    print("the sales manager received:")
    for name, text in report.subscriptions.items():
        got = sorted(_delivery_ids(d) for d in report.received[name])
        good = got == sorted(want[name])
        ok &= good
        done = report.replays.get(name)
        past = ""
        if done is not None:
            past = f"; replay of {done.count} from {', '.join(done.databases) or 'none'}"
            past += f", failed: {', '.join(done.failed)}" if done.failed else ""
        verdict = "ok" if good else "MISMATCH"
        print(f"  {name:<9} {len(got):>4} (expected {len(want[name]):>4}) {verdict}{past}")
        print(f"            {text}")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--per-half", type=int, default=300, help="publications in each half")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="padres-retail-") as tmp:
        procs: list[BrokerProcess | DatabaseProcess] = []
        try:
            urls: dict[str, str] = {}
            for name, neighbours in (
                ("B1", []),
                ("B2", ["B1"]),
                ("B3", ["B1", "B2"]),
                ("B4", ["B3", "B1"]),
            ):
                broker = BrokerProcess(name, neighbours=[urls[n] for n in neighbours])
                procs.append(broker)
                urls[name] = broker.start()
            stores = {
                "DB1": ("B2", ["[class,eq,'Order']", "[class,eq,'Return']", "[class,eq,'Cancel']"]),
                "DB2": ("B4", ["[class,eq,'Order']", "[class,eq,'SysInfo']"]),
            }
            for db, (at, specs) in stores.items():
                node = DatabaseProcess(
                    db, urls[at], f"sqlite:///{Path(tmp) / db}.sqlite", stores=specs
                )
                procs.append(node)
                node.start()
            report = asyncio.run(day(urls, args.per_half, args.seed))
        finally:
            for proc in reversed(procs):
                proc.stop()
    if args.json:
        args.json.write_bytes(orjson.dumps(report.to_json()))
    if not print_report(report):
        sys.exit(1)


if __name__ == "__main__":
    main()
