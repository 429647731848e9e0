"""What atomic consumption costs: ``padres bench inbox``.

A broker process, and a durable subscription holding ``count`` guaranteed publications; then a
consumer applies each delivery to a table of its database, one transaction per delivery, in two
ways on the same database: as ``historic.inbox.AtomicConsumer`` does (the delivery's record in the
same transaction, its row locked and updated), and as a plain consumer does (the same handler
and retries, acknowledging after its commit, with no record: a crash between the two applies a
delivery twice). The figures are deliveries applied per second each way, from the first to the
last, and whether each way applied every publication once, in order.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from typing import Any

from sqlalchemy import Column, Connection, Integer, MetaData, String, Table, create_engine, select

from historic.inbox import AtomicConsumer, TransactionalInbox
from padres.bench import machine
from padres.client.connection import Client, Delivery
from padres.model.protocol import Notify
from padres.testing.processes import BrokerProcess

__all__ = ["report", "run"]

_FILTER = "[class,eq,'Bench'],[way,eq,'{way}']"


def run(count: int = 20_000, url: str | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess("B1", options=["--data", tmp])
        broker_url = broker.start()
        try:
            result = asyncio.run(_drive(broker_url, url or f"sqlite:///{tmp}/bench.sqlite", count))
        finally:
            broker.stop()
    return {"machine": machine(), "publications": count, **result}


async def _drive(broker: str, url: str, count: int) -> dict[str, Any]:
    engine = create_engine(url)
    applied = Table(
        "padres_bench_applied",
        MetaData(),
        Column("row", Integer, primary_key=True, autoincrement=True),
        Column("way", String(16), nullable=False),
        Column("n", Integer, nullable=False),
    )
    applied.drop(engine, checkfirst=True)
    applied.create(engine)
    inbox = TransactionalInbox(engine, table="padres_bench_inbox")
    inbox.table.drop(engine, checkfirst=True)
    inbox.create()
    result: dict[str, Any] = {"database": engine.dialect.name}
    try:
        for way in ("plain", "atomic"):

            def write(conn: Connection, note: Notify, way: str = way) -> None:
                n = note.publication.attributes["n"]
                conn.execute(applied.insert().values(way=way, n=n))

            flt = _FILTER.format(way=way)
            async with Client(broker, f"bench-{way}") as client:  # the queue fills meanwhile
                await client.subscribe(flt, durable="d", auto_ack=False)
                await _publish(broker, way, count)
            async with Client(broker, f"bench-{way}", reconnect=True) as client:
                started = time.perf_counter()
                if way == "atomic":
                    consumer = AtomicConsumer(client, inbox, "d", flt, write)
                    await consumer.start()
                else:

                    async def plain(note: Delivery, way: str = way) -> None:
                        assert isinstance(note, Notify)

                        def transaction() -> None:
                            with engine.begin() as conn:
                                write(conn, note, way)

                        await asyncio.to_thread(transaction)

                    await client.subscribe(flt, plain, durable="d", retries=3)
                await _applied(engine, applied, way, count)
                seconds = time.perf_counter() - started
            query = select(applied.c.n).where(applied.c.way == way).order_by(applied.c.row)
            with engine.connect() as conn:
                got = [n for (n,) in conn.execute(query)]
            result[f"{way}_per_second"] = count / seconds
            result[f"{way}_once_in_order"] = got == list(range(1, count + 1))
    finally:
        applied.drop(engine, checkfirst=True)
        inbox.table.drop(engine, checkfirst=True)
        engine.dispose()
    return result


async def _publish(broker: str, way: str, count: int) -> None:
    async with Client(broker, f"bench-shop-{way}") as shop:
        await shop.advertise("[class,eq,'Bench'],[way,isPresent,''],[n,isPresent,0]")
        for n in range(1, count + 1):
            await shop.publish({"class": "Bench", "way": way, "n": n}, guaranteed=True)
        await shop.flush(600)


async def _applied(engine: Any, applied: Table, way: str, count: int) -> None:
    """Return once ``count`` rows of ``way`` are applied."""
    query = select(applied.c.n).where(applied.c.way == way).order_by(applied.c.row.desc())
    while True:
        with engine.connect() as conn:
            last = conn.execute(query.limit(1)).scalar()
        if last is not None and last >= count:
            return
        await asyncio.sleep(0.05)


def report(r: dict[str, Any]) -> str:
    cost = r["plain_per_second"] / r["atomic_per_second"]
    return "\n".join(
        [
            f"consuming {r['publications']:,} guaranteed publications into {r['database']}, "
            "one transaction per delivery",
            f"  plain (ack after commit)  {r['plain_per_second']:>8,.0f} deliveries/s; "
            f"once, in order: {r['plain_once_in_order']}",
            f"  atomic (historic.inbox)   {r['atomic_per_second']:>8,.0f} deliveries/s; "
            f"once, in order: {r['atomic_once_in_order']}; {cost:.2f}x the plain time",
        ]
    )
