"""A consumer that applies orders to its database through ``historic.inbox``, and dies (SIGKILL)
at a chosen moment; the fault tests of atomic consumption run it as a process of its own.

    python -m tests.inbox_app DATABASE_URL BROKER_URL NAME TAG MODE N TOTAL

It prints ``ready`` once its subscription is made. MODE ``write``: it dies in the middle of the
transaction that applies order N (its row written, not committed); ``commit``: right after
that transaction committed, before the broker is told; ``run``: it dies only when killed from
outside, or exits once TOTAL orders are applied; ``outside``: as ``run``, taking 5 ms more
for each order, so that a kill from outside lands while orders are still coming.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from typing import Final

from sqlalchemy import Column, Connection, Integer, MetaData, String, Table, create_engine, func
from sqlalchemy import select as select_

from historic.inbox import AtomicConsumer, TransactionalInbox
from padres.client.connection import Client, Delivery
from padres.errors import AuthenticationError
from padres.model.protocol import Notify

FILTER: Final = "[class,eq,'Order'],[tag,eq,'{tag}']"

app = MetaData()
applied = Table(
    "applied",
    app,
    Column("row", Integer, primary_key=True, autoincrement=True),
    Column("tag", String(64), nullable=False),
    Column("n", Integer, nullable=False),
)


def count(conn: Connection, tag: str) -> int:
    return int(conn.execute(select_(func.count()).where(applied.c.tag == tag)).scalar_one())


def main(database: str, broker: str, name: str, tag: str, mode: str, n: str, total: str) -> None:
    die, last = int(n), int(total)
    engine = create_engine(database)
    inbox = TransactionalInbox(engine)

    def apply(conn: Connection, note: Notify) -> None:
        got = note.publication.attributes["n"]
        conn.execute(applied.insert().values(tag=tag, n=got))
        if mode == "outside":
            time.sleep(0.005)
        if mode == "write" and got == die:
            os.kill(os.getpid(), signal.SIGKILL)

    class Dying(AtomicConsumer):
        async def _consume(self, note: Delivery) -> None:
            await super()._consume(note)
            if (
                mode == "commit"
                and isinstance(note, Notify)
                and note.publication.attributes["n"] == die
            ):
                os.kill(os.getpid(), signal.SIGKILL)

    async def connected() -> Client:
        """The client, once the broker has let go of the killed process of the same name."""
        while True:
            try:
                return await Client(broker, name, reconnect=True).connect()
            except AuthenticationError:
                await asyncio.sleep(0.05)

    async def run() -> None:
        client = await connected()
        try:
            async with Dying(client, inbox, "orders", FILTER.format(tag=tag), apply):
                print("ready", flush=True)
                while True:
                    with engine.connect() as conn:
                        if count(conn, tag) >= last:
                            return
                    await asyncio.sleep(0.05)
        finally:
            await client.close()

    asyncio.run(run())


if __name__ == "__main__":
    main(*sys.argv[1:8])
