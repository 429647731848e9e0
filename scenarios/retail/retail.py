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

The manager also follows four patterns in time (``SEQUENCES``): orders cancelled soon after,
VIP orders not returned soon after, the order strictly next after an overloaded report for its
user type, and a customer's second order within 20 orders. Each is followed three ways: live
from before the day starts, hybrid from the start of the day (made after the first half, so
that its matches straddle the switch from the past to the live stream), and historic over the
whole day (made once it is over).

Then the second half is published, and the report compares what each subscription received with
what it should have, computed from what was published, and for the patterns in time by the
reference evaluation of what the databases stored (``over_range``). Run:
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

from historic import Store
from padres import Client, Publication, ReferenceMatcher, parse_composite
from padres.client.connection import Delivery
from padres.language.parser import parse_filter
from padres.matching.matcher import matches
from padres.matching.reference_temporal import over_range
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
SEQUENCES = {
    "cancelled": "{[class,eq,'Order'],[orderID,eq,$O]} ; {[class,eq,'Cancel'],[orderID,eq,$O]}"
    " within 2s late 1s",
    "kept": "{[class,eq,'Order'],[orderID,eq,$O],[userType,eq,'VIP']}"
    " ; !{[class,eq,'Return'],[orderID,eq,$O]} within 300ms late 1s",
    "rush": "{[class,eq,'SysInfo'],[status,eq,'overloaded'],[userType,eq,$U]}"
    " ;; {[class,eq,'Order'],[userType,eq,$U]} within 1s late 1s",
    "again": "{[class,eq,'Order'],[customerID,eq,$C]} ; {[class,eq,'Order'],[customerID,eq,$C]}"
    " within 20 events consume first late 1s",
}
"""Patterns in time, each followed live, hybrid and historic (``sequences``). The lateness
covers publications taking different paths to the manager's broker."""
FOREVER = datetime(9999, 1, 1, tzinfo=UTC)
"""A time after every window has closed."""
STORED_SPECS = {
    "DB1": ("B2", ["[class,eq,'Order']", "[class,eq,'Return']", "[class,eq,'Cancel']"]),
    "DB2": ("B4", ["[class,eq,'Order']", "[class,eq,'SysInfo']"]),
}


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


def sequences(
    how: str, start: datetime | None = None, end: datetime | None = None
) -> dict[str, str]:
    """``SEQUENCES`` followed ``how`` (live, hybrid or historic), by name: live ones with no
    time predicates, the others with the range ``start`` to ``end`` (None: open) in every
    part."""
    window = ""
    if start is not None:
        window = f",[time,>=,'{start.isoformat()}']"
    if end is not None:
        window += f",[time,<,'{end.isoformat()}']"
    return {f"{name}-{how}": text.replace("}", f"{window}}}") for name, text in SEQUENCES.items()}


@dataclass
class Report:
    published: list[Publication] = field(default_factory=list)
    stored: list[Publication] = field(default_factory=list)
    """What the databases stored, each publication once."""
    subscriptions: dict[str, str] = field(default_factory=dict)
    received: dict[str, list[Delivery]] = field(default_factory=dict)
    replays: dict[str, ReplayDone] = field(default_factory=dict)
    second_half: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "published": [to_dict(p) for p in self.published],
            "stored": [to_dict(p) for p in self.stored],
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
        sub = parse_composite(text, id=name) if text.startswith("{") else None
        if sub is not None and sub.timing is not None:
            pubs = report.published if name.endswith("-live") else report.stored
            until = None if name.endswith("-historic") else FOREVER
            out[name] = sorted(
                sorted(p.id for p in m.publications) for m in over_range(sub, pubs, until)
            )
            continue
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


async def day(urls: dict[str, str], stores: list[str], per_half: int, seed: int) -> Report:
    """The retail day over the brokers at ``urls``, the databases storing into ``stores``."""
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

        async def subscribe(texts: dict[str, str]) -> dict[str, Any]:
            handles = {}
            for name, text in texts.items():
                report.subscriptions[name] = text
                got = report.received[name] = []
                if text.startswith("{"):
                    handles[name] = await manager.subscribe_composite(text, got.append, id=name)
                else:
                    handles[name] = await manager.subscribe(text, got.append, id=name)
            return handles

        await subscribe(sequences("live"))
        await asyncio.sleep(1.0)  # advertisements flood, the databases' subscriptions settle

        start = datetime.now(UTC)
        await _publish(clients, report, rng, per_half, 0)
        end = datetime.now(UTC) + timedelta(microseconds=1)
        handles = await subscribe(Subscriptions((start, end)).texts())
        handles |= await subscribe(sequences("hybrid", start))
        await asyncio.sleep(0.5)  # the future subscriptions reach the shops
        report.second_half = datetime.now(UTC)
        await _publish(clients, report, rng, per_half, per_half)
        day_end = datetime.now(UTC) + timedelta(microseconds=1)
        for name, handle in handles.items():
            if name != "future":
                report.replays[name] = await handle.replayed(timeout=30)
        await asyncio.sleep(0.1)
        for name, handle in (await subscribe(sequences("historic", start, day_end))).items():
            report.replays[name] = await handle.replayed(timeout=30)
        # The historic ones were answered once the databases had written the whole day.
        report.stored = _stored(stores)
        want = expected(report)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(
            len(report.received[n]) < len(want[n]) for n in want
        ):
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # anything extra would arrive now
    return report


def _stored(urls: list[str]) -> list[Publication]:
    """What the databases at ``urls`` stored, each publication once."""
    found: dict[tuple[str, str], Publication] = {}
    for url in urls:
        store = Store(url)
        try:
            for chunk in store.older(FOREVER):
                found.update(((p.publisher, p.id), p) for _, p in chunk)
        finally:
            store.close()
    return sorted(found.values(), key=lambda p: p.timestamp)


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
    stored = {p.id for p in report.stored}
    ok &= stored == {p.id for p in pubs}
    print(f"the databases stored {len(stored)} of them, each once")
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
            stores = []
            for db, (at, specs) in STORED_SPECS.items():
                stores.append(f"sqlite:///{Path(tmp) / db}.sqlite")
                node = DatabaseProcess(db, urls[at], stores[-1], stores=specs)
                procs.append(node)
                node.start()
            report = asyncio.run(day(urls, stores, args.per_half, args.seed))
        finally:
            for proc in reversed(procs):
                proc.stop()
    if args.json:
        args.json.write_bytes(orjson.dumps(report.to_json()))
    if not print_report(report):
        sys.exit(1)


if __name__ == "__main__":
    main()
