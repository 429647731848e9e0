"""An application that writes orders and publishes them through its outbox, then dies (SIGKILL)
at a chosen moment; the tests of ``historic.outbox`` run it as a process of its own.

    python -m tests.outbox_app DATABASE_URL BROKER_URL RELAY_NAME TAG MODE

MODE ``commit``: commit one transaction (two orders and their publications) and die before
anything is relayed. MODE ``publish``: commit, relay (the broker acknowledges the publications)
and die before the relay deletes the rows.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Final

from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine

from historic.outbox import OutboxRelay, TransactionalOutbox

ADVERTISEMENT: Final = "[class,eq,'Order'],[tag,isPresent,''],[n,isPresent,0]"

app = MetaData()
orders = Table(
    "orders",
    app,
    Column("n", Integer, primary_key=True),
    Column("tag", String(64), nullable=False),
)


class _DyingOutbox(TransactionalOutbox):
    """Dies when the relay comes to delete the rows it published."""

    def mark(self, published: Sequence[int], refused: Mapping[int, str]) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


def main(database: str, broker: str, name: str, tag: str, mode: str) -> None:
    engine = create_engine(database)
    outbox = (_DyingOutbox if mode == "publish" else TransactionalOutbox)(engine)
    with engine.begin() as conn:
        for n in (1, 2):
            conn.execute(orders.insert().values(n=n, tag=tag))
            outbox.add(conn, {"class": "Order", "tag": tag, "n": n}, id=f"{tag}-{n}")
    if mode == "commit":
        os.kill(os.getpid(), signal.SIGKILL)

    async def relay() -> None:
        async with OutboxRelay(outbox, broker, name, advertisements=[ADVERTISEMENT]) as relay:
            await relay.relay()

    asyncio.run(relay())


if __name__ == "__main__":
    main(*sys.argv[1:6])
