"""An outbox relay run as a process of its own until it is killed; the tests of
``historic.rules`` kill it with SIGKILL in the middle of a stream and start it again.

    python -m tests.rules_relay_app DATABASE_URL BROKER_URL RELAY_NAME BATCH ADVERTISEMENT...

It publishes ``BATCH`` rows at a time, so that a stream takes many rounds of publishing and
deleting, and waits a moment before deleting what the broker acknowledged: a kill falls between
any two steps, often between the publishing and the deleting.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Mapping, Sequence

from historic.outbox import OutboxRelay, TransactionalOutbox
from padres.errors import RequestFailed


class _SlowOutbox(TransactionalOutbox):
    def mark(self, published: Sequence[int], refused: Mapping[int, str]) -> None:
        time.sleep(0.02)  # in a worker thread
        super().mark(published, refused)


async def main(database: str, broker: str, name: str, batch: int, ads: list[str]) -> None:
    relay = OutboxRelay(
        _SlowOutbox(database), broker, name, advertisements=ads, batch=batch, interval=0.05
    )
    while True:
        try:
            await relay.start()
            break
        except RequestFailed:  # the broker still holds the session of the relay killed before
            await asyncio.sleep(0.1)
    print("relaying", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:]))
