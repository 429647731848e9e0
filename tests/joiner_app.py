"""A consumer whose reaction to an order joins the order's transaction (a shared context): it
sees orders at once (``immediate``), and ships each in a part of the order's transaction. The
tests of shared context run it as a process of its own, and kill it (SIGKILL).

    python -m tests.joiner_app BROKER_URL NAME MODE

It prints ``ready`` once subscribed, then for each order's transaction ``joined <tx>`` when its
part is taken and ``shipped <tx>`` once it published two shipments in it (``n`` the order's,
``item`` 0 and 1). MODE ``done``: it is done with the part (``done <tx>`` once its broker
holds it) and prints ``outcome <tx> <outcome>`` when the transaction ends; ``hang``: it never
is (it is killed meanwhile).
"""

from __future__ import annotations

import asyncio
import sys

from padres.client.connection import Client
from padres.model.protocol import Outcome, TxNotify


async def ship(client: Client, note: TxNotify, mode: str) -> None:
    part = await client.transaction(join=note.tx, wait=30).begin()
    print("joined", note.tx, flush=True)
    n = note.publication.attributes["n"]
    for item in (0, 1):
        await part.publish({"class": "Shipment", "n": n, "item": item})
    print("shipped", note.tx, flush=True)
    if mode == "hang":
        await asyncio.Event().wait()
    await part.commit()
    print("done", note.tx, flush=True)
    print("outcome", note.tx, (await part.outcome()).value, flush=True)


async def main(broker: str, name: str, mode: str) -> None:
    async with Client(broker, name, reconnect=True) as client:
        await client.advertise("[class,eq,'Shipment'],[n,isPresent,0],[item,isPresent,0]")
        orders = await client.subscribe("[class,eq,'Order']", visibility="immediate")
        print("ready", flush=True)
        reactions = set()
        async for note in orders:
            if isinstance(note, TxNotify) and note.outcome is Outcome.PENDING:
                reaction = asyncio.create_task(ship(client, note, mode))
                reactions.add(reaction)
                reaction.add_done_callback(reactions.discard)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
