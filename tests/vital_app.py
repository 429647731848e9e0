"""A consumer whose reactions a producer may name vital: it subscribes with deferred
visibility, and votes on each transaction when its commit starts; the tests of backward
dependencies run it as a process of its own, and kill it (SIGKILL).

    python -m tests.vital_app BROKER_URL NAME MODE

It prints ``ready`` once subscribed, then ``got <tx>`` for each transaction whose commit starts.
MODE ``ready``: it votes ready; ``later``: it votes ready once a line comes on its standard
input; ``hang``: it does not vote (it is killed meanwhile).
"""

from __future__ import annotations

import asyncio
import sys

from padres.client.connection import Client
from padres.model.protocol import Outcome, TxNotify


async def main(broker: str, name: str, mode: str) -> None:
    async with Client(broker, name) as client:
        orders = await client.subscribe("[class,eq,'Order']", visibility="deferred")
        print("ready", flush=True)
        async for note in orders:
            if isinstance(note, TxNotify) and note.outcome is Outcome.COMMITTING:
                print("got", note.tx, flush=True)
                if mode == "later":
                    await asyncio.to_thread(sys.stdin.readline)
                if mode in ("ready", "later"):
                    await client.vote(note.tx, "ready", "reserved")
                    print("voted", note.tx, flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
