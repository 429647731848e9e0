"""``padres bench hop``: what one broker core costs a publication, in one process.

The chain of ``padres bench network`` (B1 - B2 - B3, a subscriber client at each holding a
third of the stock workload, the publisher at B1) is built in the simulation
(``padres.runtime.simulation``); then one broker's core is handed frames of 500 publications
as its node would hand them: B1's from its publisher (``publication`` messages, decoded with
every check), B2's from B1 and B3's from B2 (the ``route_publish`` messages the cores before
it sent, each with the ids its upstream neighbour found it to match, decoded as from a
neighbour; the cores before it are walked first, untimed). Per publication,
in CPU time: decoding the frame, the walk through the core (matching, routing, notifications)
and encoding what it sends, each message once. Nothing is sent: no sockets, no other
process, so the figures hold still on a busy machine far better than the chain's.

The subscribers hold their shares as ``subscribe_many`` groups (``plain``: one subscription
per filter, as before groups existed). Each repetition publishes the quotes again under new
ids; the best and the median of the repetitions are reported.
"""

from __future__ import annotations

import itertools
import statistics
import time
from pathlib import Path
from typing import Any

from msgspec.structs import replace

from padres.bench import machine
from padres.bench.workloads import STOCK_ADVERTISEMENT, stock_publications, stock_subscriptions
from padres.language.parser import parse_advertisement
from padres.model.codec import encode, encode_frame
from padres.model.messages import Publication, Subscription
from padres.model.protocol import Envelope, Subscribe, decode_frame
from padres.runtime import collector
from padres.runtime.pump import Pump
from padres.runtime.simulation import Simulation

__all__ = ["chain", "report", "run"]

FRAME = 500
"""Publications a frame."""


def chain(subs: int, every: list[Publication], plain: bool = False) -> Simulation:
    """The chain of ``padres bench network`` in the simulation, its subscriptions and the
    publisher's advertisement made: the subscriber client at B1, B2, B3 is ``sub0``, ``sub1``,
    ``sub2``, each holding its third of the workload as group ``g`` (``plain``: one
    subscription per filter)."""
    workload = list(stock_subscriptions(subs, every, seed=1))  # as padres bench network's
    sim = Simulation(seed=1)
    for name in ("B1", "B2", "B3"):
        sim.add_broker(name)
    sim.link("B1", "B2")
    sim.link("B2", "B3")
    publisher = sim.attach("publisher", "B1")
    clients = [sim.attach(f"sub{i}", f"B{i + 1}") for i in range(3)]
    sim.run()
    sim.send(publisher, parse_advertisement(STOCK_ADVERTISEMENT, id="a1"))
    sim.run()
    for i, client in enumerate(clients):
        for sub in workload[i::3]:
            group = Subscribe(Subscription(f"g.{sub.id}", sub.filter), group="g")
            sim.send(client, sub if plain else group)
        sim.run()
    return sim


def run(
    subs: int = 10_000,
    pubs: int = 20_000,
    repeat: int = 7,
    broker: str = "B2",
    plain: bool = False,
    data: Path | None = None,
) -> dict[str, Any]:
    every = stock_publications(data)
    quotes = every[:pubs]
    sim = chain(subs, every, plain)
    path = ["B1", "B2", "B3"][: int(broker[1:])]
    sources = ["publisher"] + [
        next(h for h, n in sim.brokers[b].peers.items() if n == a)
        for a, b in itertools.pairwise(path)
    ]
    pumps = [Pump(sim.brokers[b], lambda outs: None) for b in path]
    collector.freeze()
    runs: list[tuple[float, float, float]] = []
    for round_ in range(repeat):
        messages: list[Any] = [
            replace(q, id=f"r{round_}p{i}", publisher="publisher@B1") for i, q in enumerate(quotes)
        ]
        for pump, source, next_broker in zip(pumps, sources, path[1:], strict=False):
            messages = _passed(pump, source, messages, sim, next_broker)
        pump, source = pumps[-1], sources[-1]
        frames = [encode_frame(messages[i : i + FRAME]) for i in range(0, len(messages), FRAME)]
        spent = [0.0, 0.0, 0.0]
        for frame in frames:
            started = time.process_time()
            items = decode_frame(frame, checked=broker != "B1")
            decoded = time.process_time()
            _, outs, _ = pump.walk(source, items, lambda: sim.clock)
            walked = time.process_time()
            _encoded([message for _, message in outs])
            spent[0] += decoded - started
            spent[1] += walked - decoded
            spent[2] += time.process_time() - walked
        runs.append((spent[0], spent[1], spent[2]))
    per = [tuple(part / len(quotes) * 1e6 for part in r) for r in runs]
    best = min(per, key=sum)
    return {
        "machine": machine(),
        "broker": broker,
        "subscriptions": subs,
        "publications": len(quotes),
        "groups": not plain,
        "best_us": dict(zip(("decode", "walk", "encode"), best, strict=True)),
        "median_us": {
            part: statistics.median(p[i] for p in per)
            for i, part in enumerate(("decode", "walk", "encode"))
        },
        "median_total_us": statistics.median(sum(p) for p in per),
        "best_total_us": sum(best),
    }


def _passed(
    pump: Pump, source: str, messages: list[Any], sim: Simulation, next_broker: str
) -> list[Envelope]:
    """What ``pump``'s core sends ``next_broker`` when handed ``messages`` from ``source``
    (in frames, as measured), decoded as the next one reads them."""
    hop = next(h for h, n in pump.broker.peers.items() if n == next_broker)
    sent: list[Envelope] = []
    for i in range(0, len(messages), FRAME):
        items = decode_frame(encode_frame(messages[i : i + FRAME]), checked=source != "publisher")
        _, outs, _ = pump.walk(source, items, lambda: sim.clock)
        sent += [message for to, message in outs if to == hop]
    return sent


def _encoded(messages: list[Envelope]) -> int:
    """Encode each message once (one sent to several hops is one object), as a node does."""
    seen: dict[int, bytes] = {}
    for message in messages:
        if id(message) not in seen:
            seen[id(message)] = encode(message)
    return sum(map(len, seen.values()))


def report(r: dict[str, Any]) -> str:
    best, median = r["best_us"], r["median_us"]
    how = "as subscribe_many groups" if r["groups"] else "one subscription per filter"
    return "\n".join(
        [
            f"broker core {r['broker']} of the chain, {r['subscriptions']:,} subscriptions "
            f"({how}), {r['publications']:,} quotes in frames of {FRAME}, CPU per publication",
            f"  median: decode {median['decode']:.2f}, walk {median['walk']:.2f}, encode "
            f"{median['encode']:.2f}, total {r['median_total_us']:.2f} us",
            f"  best:   decode {best['decode']:.2f}, walk {best['walk']:.2f}, encode "
            f"{best['encode']:.2f}, total {r['best_total_us']:.2f} us",
        ]
    )
