"""A NATS subscriber set up as strongly as its users would: the other end of ``padres bench
peers``'s "NATS strong" setups, run in a process of its own (``padres.bench.apart``).

It holds one subscription, on subjects that bring each quote once; what arrives waits in a
list, and whenever the event loop comes round, everything received since the last time is
decoded with msgspec straight into ``Quote`` (the fields a quote has, no checks of the
language's rules) and matched in one batch by this project's Rete network holding the client's
share of the subscriptions. A quote that matches at least one of them is a delivery, counted
once, as on the padres side. Once loaded, the process settles its garbage collector as a
broker does (``padres.runtime.collector.freeze``): without it, collections walking the Rete
network's objects took about 40% of the subscriber's time. ``framed``: each NATS message is
a JSON array of quotes (the frames a padres publisher sends with ``publish_many``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from datetime import datetime

import msgspec
import nats
from nats.aio.msg import Msg

from padres.bench.apart import Link, serve
from padres.matching.rete_matcher import to_conjunction
from padres.model.codec import decode
from padres.model.messages import Subscription
from padres.runtime import collector
from rete import Network

__all__ = ["FRAMES", "Quote", "subjects", "subscriber"]

FRAMES = "STOCKS"
"""The subject frames of quotes are published on."""


class Quote(msgspec.Struct):
    """A quote as the JSON of a publication carries it (other fields are skipped)."""

    id: str
    attributes: dict[str, bool | int | float | str]
    timestamp: datetime


def subjects(share: Sequence[Subscription]) -> list[str]:
    """Where a client holding ``share`` listens, quotes going to ``STOCK.<symbol>``: the one
    wildcard subject if a subscription may match any symbol, else each symbol named. The
    subjects never overlap, so no quote comes twice."""
    symbols: set[str] = set()
    for sub in share:
        named = [
            p.value
            for p in sub.filter.predicates
            if p.attribute == "symbol" and p.op.value == "eq" and p.variable is None
        ]
        if not named:
            return ["STOCK.*"]
        symbols.add(str(named[0]))
    return sorted(f"STOCK.{s}" for s in symbols)


class _Tally:
    """Deliveries counted, and the latencies of those that carried their send time."""

    def __init__(self) -> None:
        self.count = 0
        self.latencies: list[float] = []

    def reset(self) -> None:
        self.count = 0
        self.latencies = []


def subscriber(link: Link, url: str, name: str, share: list[bytes], framed: bool) -> None:
    """The process's main: ``share`` are the client's subscriptions, encoded."""
    asyncio.run(_serve(link, url, name, share, framed))


async def _serve(link: Link, url: str, name: str, share: list[bytes], framed: bool) -> None:
    subs = []
    for data in share:
        sub = decode(data)
        if not isinstance(sub, Subscription):
            raise TypeError(f"a subscriber was given a {type(sub).__name__}")
        subs.append(sub)
    network = Network()
    for sub in subs:
        network.add(sub.id, to_conjunction(sub.filter))
    collector.freeze()  # loaded: collections skip the network from now on, as a broker's do
    tally = _Tally()
    received: list[bytes] = []
    arrived = asyncio.Event()

    async def on_message(msg: Msg) -> None:
        received.append(msg.data)
        arrived.set()

    async def match() -> None:
        one = msgspec.json.Decoder(Quote)
        frame = msgspec.json.Decoder(list[Quote])
        while True:
            await arrived.wait()
            arrived.clear()
            batch = received[:]
            received.clear()
            if framed:
                quotes = [q for data in batch for q in frame.decode(data)]
            else:
                quotes = [one.decode(data) for data in batch]
            results = network.match_batch(quotes)
            now = time.time()
            for quote, result in zip(quotes, results, strict=True):
                if result.conditions:
                    tally.count += 1
                    sent = quote.attributes.get("sent")
                    if isinstance(sent, float):
                        tally.latencies.append(now - sent)
            link.count[0] = tally.count  # read by the benchmark process as it changes

    nc = await nats.connect(url, name=name)
    matching = asyncio.get_running_loop().create_task(match())
    try:
        for subject in [FRAMES] if framed else subjects(subs):
            await nc.subscribe(
                subject, cb=on_message, pending_msgs_limit=-1, pending_bytes_limit=-1
            )
        await nc.flush()
        serving = asyncio.get_running_loop().create_task(serve(link, tally))
        done, _ = await asyncio.wait([serving, matching], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()  # the matcher ends only by failing: its error ends the process
    finally:
        matching.cancel()
        await nc.close()
