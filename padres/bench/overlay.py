"""``padres bench overlay``: a random cyclic overlay of broker cores, checked against an oracle.

Clients attached to random brokers advertise, subscribe, subscribe to composites, publish,
unsubscribe, unadvertise and leave, interleaved in rounds: each round's operations are issued
in random order while the overlay is still routing earlier ones (the scheduler interleaves the
messages of all links at random), and the round ends when the overlay is quiet. Then every
delivery of the round is checked against a global oracle that knows every subscription:

- a publication reaches each client at most once;
- it reaches only subscriptions it matches;
- it reaches every matching subscription whose client had its acknowledgement before the
  publication was sent, when the publisher had the acknowledgement of its advertisement
  likewise, and neither was withdrawn during the round: an acknowledged advertisement or
  subscription has settled, so there is no allowance for races;
- a composite subscription in place for a round reports exactly the matches the reference
  matcher finds among the publications that reached its broker, and every publication it
  needed reached that broker.

At the end every client leaves and every routing table of the overlay must be empty.

Two workloads: ``random`` (filters of three classes over two small integer attributes and a
short string, composite subscriptions among them) and ``stock`` (the real quotes, published at
random by publishers that advertise their ranges; subscriptions in PADRES style, as
``padres bench match`` makes them). ``compare`` runs the same seed without and with merging
(``padres.broker.merging``) and reports both: routing table sizes, and the publications sent
between brokers, of which those that matched nothing where they arrived.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from padres.bench import machine
from padres.bench.workloads import STOCK_ATTRIBUTES, stock_subscriptions
from padres.broker import Covering, Merging, routing_filter
from padres.matching.matcher import CompositeMatch, filter_bindings, matches
from padres.matching.reference import ReferenceMatcher
from padres.model.messages import (
    Advertisement,
    AllOf,
    CompositeSubscription,
    Filter,
    Predicate,
    Publication,
    Subscription,
    Unadvertise,
    Unsubscribe,
    Variable,
)
from padres.runtime.simulation import SimClient, Simulation
from rete.operators import Op

__all__ = ["RandomWorkload", "StockWorkload", "compare", "report", "report_compared", "run"]

_CLASSES = ("Order", "Quote", "Alert")
_SYMBOLS = ("ab", "ac", "ba", "bb", "ca")
_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def topology(brokers: int, extra: float, rng: random.Random) -> list[tuple[str, str]]:
    """A random connected graph: a random tree plus ``extra`` times as many other edges."""
    names = [f"B{i}" for i in range(brokers)]
    edges = {(names[rng.randrange(i)], names[i]) for i in range(1, brokers)}
    for _ in range(int(extra * brokers)):
        a, b = rng.sample(names, 2)
        if (a, b) not in edges and (b, a) not in edges:
            edges.add((a, b))
    return sorted(edges)


def _predicate(rng: random.Random, attribute: str) -> Predicate:
    if attribute == "sym":
        op = rng.choice((Op.EQ, Op.NEQ, Op.STR_PREFIX, Op.IS_PRESENT))
        value: Any = rng.choice(_SYMBOLS) if op is not Op.STR_PREFIX else rng.choice("abc")
        return Predicate(attribute, op, None if op is Op.IS_PRESENT else value)
    op = rng.choice((Op.LT, Op.LE, Op.GT, Op.GE, Op.EQ_NUM, Op.NE_NUM, Op.IS_PRESENT))
    return Predicate(attribute, op, None if op is Op.IS_PRESENT else rng.randint(0, 20))


def random_filter(rng: random.Random, cls: str | None = None, most: int = 2) -> Filter:
    preds = [Predicate("class", Op.EQ, cls or rng.choice(_CLASSES))]
    for attribute in rng.sample(("x", "y", "sym"), rng.randint(0, most)):
        preds.append(_predicate(rng, attribute))
    return Filter(tuple(preds))


def conforming(rng: random.Random, adv: Filter, ident: str) -> Publication | None:
    """A publication that conforms to ``adv`` (None if random tries find none)."""
    for _ in range(50):
        attrs: dict[str, Any] = {"class": adv.class_name}
        for attribute in sorted({p.attribute for p in adv.predicates} - {"class"}):
            attrs[attribute] = rng.choice(_SYMBOLS) if attribute == "sym" else rng.randint(0, 20)
        pub = Publication(ident, attrs, _EPOCH, "")
        if matches(adv, pub):
            return pub
    return None


class Workload(Protocol):
    """What the clients advertise, subscribe to and publish."""

    @property
    def composites(self) -> bool:
        """Whether subscribers also make composite subscriptions."""
        ...

    def advertisement(self) -> Filter: ...

    def subscription(self) -> Filter: ...

    def publication(self, adv: Filter, ident: str) -> Publication | None:
        """A publication that conforms to ``adv`` (None if none was found)."""
        ...


class RandomWorkload:
    """Random filters (``random_filter``) and publications that conform to an advertisement."""

    composites = True

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def advertisement(self) -> Filter:
        return random_filter(self.rng)

    def subscription(self) -> Filter:
        return random_filter(self.rng)

    def publication(self, adv: Filter, ident: str) -> Publication | None:
        return conforming(self.rng, adv, ident)


class StockWorkload:
    """The real quotes, each publisher advertising the ranges of all of them (every quote
    conforms); subscriptions as ``padres.bench.workloads.stock_subscriptions`` makes them;
    each publication a quote drawn at random."""

    composites = False

    def __init__(self, quotes: Sequence[Publication], rng: random.Random, seed: int) -> None:
        self.rng = rng
        self.quotes = quotes
        self._subscriptions = stock_subscriptions(1 << 62, list(quotes), seed)
        preds = [Predicate("class", Op.EQ, "STOCK"), Predicate("symbol", Op.IS_PRESENT)]
        for attribute in STOCK_ATTRIBUTES:
            values = [q.attributes[attribute] for q in quotes]
            preds.append(Predicate(attribute, Op.GE, min(values)))
            preds.append(Predicate(attribute, Op.LE, max(values)))
        preds.append(Predicate("date", Op.IS_PRESENT))
        self._advertisement = Filter(tuple(preds))

    def advertisement(self) -> Filter:
        return self._advertisement

    def subscription(self) -> Filter:
        return next(self._subscriptions).filter

    def publication(self, adv: Filter, ident: str) -> Publication | None:
        quote = self.rng.choice(self.quotes)
        return Publication(ident, quote.attributes, _EPOCH, "")


def _composite(rng: random.Random, ident: str) -> CompositeSubscription:
    x = Variable("S")
    parts = [
        Filter(
            (
                Predicate("class", Op.EQ, cls),
                Predicate("sym", Op.EQ, x),
                *random_filter(rng, cls, 1).predicates[1:],
            )
        )
        for cls in rng.sample(_CLASSES, 2)
    ]
    return CompositeSubscription(ident, AllOf(tuple(parts)))


@dataclass
class Held:
    """A subscription or advertisement the oracle knows: whose, what, since which round."""

    client: str
    filter: Filter
    since: int
    composite: CompositeSubscription | None = None


@dataclass
class Oracle:
    round: int = 0
    subs: dict[tuple[str, str], Held] = field(default_factory=dict)
    advs: dict[tuple[str, str], Held] = field(default_factory=dict)
    touched: set[tuple[str, str]] = field(default_factory=set)
    pubs: list[tuple[Publication, str, str, frozenset[tuple[str, str]]]] = field(
        default_factory=list
    )
    """This round's publications: publication, publisher, advertisement id it conforms to, and
    the advertisements and subscriptions acknowledged when it was sent."""
    acked: set[tuple[str, str]] = field(default_factory=set)
    """(client, id) of advertisements and subscriptions whose client has the acknowledgement."""
    violations: list[str] = field(default_factory=list)
    checked: int = 0
    deliveries: int = 0
    composite_matches: int = 0

    def settled(self, key: tuple[str, str], held: Held) -> bool:
        return held.since < self.round and key not in self.touched

    def owed(self, connected: Collection[str]) -> Iterator[tuple[str, str, str]]:
        """Client, publication id and subscription id of every delivery this round's
        publications owe: to each subscription (not composite) of a ``connected`` client that
        matches, when the subscription and the publisher's advertisement had been acknowledged
        before the publication was sent and neither was withdrawn since."""
        for pub, publisher, aid, acked in self.pubs:
            if (publisher, aid) not in self.advs or (publisher, aid) not in acked:
                continue
            for key, held in self.subs.items():
                if (
                    held.composite is None
                    and key[0] in connected
                    and key in acked
                    and matches(held.filter, pub)
                ):
                    yield key[0], pub.id, key[1]

    def check(
        self, fresh: Mapping[str, Sequence[tuple[str, Collection[str]]]], connected: Collection[str]
    ) -> None:
        """Check the round's deliveries against the rules (see the module docstring).
        ``fresh``: each client's deliveries since the last check, as the publication's id and
        the subscriptions it came for; ``connected``: the clients still connected."""
        by_id = {pub.id: pub for pub, _, _, _ in self.pubs}
        got: dict[str, dict[str, set[str]]] = {}
        for client, notes in fresh.items():
            mine = got.setdefault(client, {})
            for pid, sids in notes:
                if pid in mine:
                    self.violations.append(f"{client} received {pid} twice")
                mine[pid] = set(sids)
                self.deliveries += 1
                pub = by_id.get(pid)
                if pub is None:
                    continue
                for sid in sids:
                    key = (client, sid)
                    known = self.subs.get(key)
                    if known is None and key not in self.touched:
                        self.violations.append(f"{client} got {pid} for unknown {sid}")
                    elif known is not None and not matches(known.filter, pub):
                        self.violations.append(f"{client} got {pid} for {sid}, not matching")
        for client, pid, sid in self.owed(connected):
            self.checked += 1
            if sid not in got.get(client, {}).get(pid, ()):
                self.violations.append(f"{client} missed {pid} for {sid}")


class Driver:
    """Issues random operations into a simulation and checks each round against the oracle."""

    def __init__(
        self, sim: Simulation, clients: int, rng: random.Random, workload: Workload
    ) -> None:
        self.sim = sim
        self.rng = rng
        self.workload = workload
        self.published = 0
        self.oracle = Oracle()
        names = sorted(sim.brokers)
        self.clients = [sim.attach(f"c{i}", rng.choice(names)) for i in range(clients)]
        self.live = {c.name: c for c in self.clients}
        self._ids = 0
        self._offsets: dict[str, int] = {}
        self._consumed: dict[str, int] = {c.name: 0 for c in self.clients}
        self._acks_read: dict[str, int] = {c.name: 0 for c in self.clients}
        sim.run()

    def _next(self, prefix: str) -> str:
        self._ids += 1
        return f"{prefix}{self._ids}"

    def round(self, operations: int) -> None:
        o = self.oracle
        o.round += 1
        o.touched.clear()
        o.pubs.clear()
        self._offsets = {b: len(seen) for b, seen in self.sim.seen.items()}
        ops = self.rng.choices(
            ("adv", "unadv", "sub", "unsub", "cs", "pub", "pub", "pub", "leave"),
            weights=(3, 1, 4, 1, 1, 6, 6, 6, 0.2),
            k=operations,
        )
        for op in ops:
            getattr(self, f"_op_{op}")()
            self.sim.step(self.rng.randint(0, 30))
        self.sim.run()
        self._check()

    # -- operations --------------------------------------------------------------------------

    def _client(self) -> SimClient | None:
        return self.live[self.rng.choice(sorted(self.live))] if self.live else None

    def _mine(self, held: dict[tuple[str, str], Held], composite: bool = False) -> Any:
        keys = [k for k, h in held.items() if (h.composite is not None) == composite]
        return self.rng.choice(sorted(keys)) if keys else None

    def _op_adv(self) -> None:
        client = self._client()
        if client is None:
            return
        aid = self._next("a")
        flt = self.workload.advertisement()
        self.oracle.advs[(client.name, aid)] = Held(client.name, flt, self.oracle.round)
        self.oracle.touched.add((client.name, aid))
        self.sim.send(client, Advertisement(aid, flt))

    def _op_unadv(self) -> None:
        key = self._mine(self.oracle.advs)
        if key is not None:
            del self.oracle.advs[key]
            self.oracle.touched.add(key)
            self.oracle.acked.discard(key)
            self.sim.send(self.live[key[0]], Unadvertise(key[1]))

    def _op_sub(self) -> None:
        client = self._client()
        if client is None:
            return
        sid = self._next("s")
        flt = self.workload.subscription()
        self.oracle.subs[(client.name, sid)] = Held(client.name, flt, self.oracle.round)
        self.oracle.touched.add((client.name, sid))
        self.sim.send(client, Subscription(sid, flt))

    def _op_cs(self) -> None:
        if not self.workload.composites:
            self._op_sub()
            return
        client = self._client()
        if client is None:
            return
        sid = self._next("s")
        cs = _composite(self.rng, sid)
        held = Held(client.name, cs.filters[0], self.oracle.round, cs)
        self.oracle.subs[(client.name, sid)] = held
        self.oracle.touched.add((client.name, sid))
        self.sim.send(client, cs)

    def _op_unsub(self) -> None:
        key = self._mine(self.oracle.subs, composite=self.rng.random() < 0.2)
        if key is not None:
            del self.oracle.subs[key]
            self.oracle.touched.add(key)
            self.oracle.acked.discard(key)
            self.sim.send(self.live[key[0]], Unsubscribe(key[1]))

    def _op_pub(self) -> None:
        key = self._mine(self.oracle.advs)
        if key is None:
            return
        pub = self.workload.publication(self.oracle.advs[key].filter, self._next("p"))
        if pub is not None:
            self.published += 1
            self.oracle.pubs.append((pub, key[0], key[1], frozenset(self._acknowledged())))
            self.sim.send(self.live[key[0]], pub)

    def _acknowledged(self) -> set[tuple[str, str]]:
        """What the clients have had acknowledged so far (and not withdrawn since)."""
        o = self.oracle
        for client in self.live.values():
            for ref in client.acks[self._acks_read[client.name] :]:
                if (client.name, ref) in o.subs or (client.name, ref) in o.advs:
                    o.acked.add((client.name, ref))
            self._acks_read[client.name] = len(client.acks)
        return o.acked

    def _op_leave(self) -> None:
        client = self._client()
        if client is None:
            return
        self.leave(client)

    def leave(self, client: SimClient) -> None:
        o = self.oracle
        for held in (o.subs, o.advs):
            for key in [k for k in held if k[0] == client.name]:
                del held[key]
                o.touched.add(key)
                o.acked.discard(key)
        del self.live[client.name]
        self.sim.detach(client)

    # -- the oracle --------------------------------------------------------------------------

    def _check(self) -> None:
        fresh = {}
        for client in self.clients:
            notes = client.notifications[self._consumed[client.name] :]
            self._consumed[client.name] = len(client.notifications)
            fresh[client.name] = [(n.publication.id, n.subscriptions) for n in notes]
        self.oracle.check(fresh, {c.name for c in self.clients if c.connected})
        self._check_composites(
            {p.id: (p, publisher, aid) for p, publisher, aid, _ in self.oracle.pubs}
        )

    def _check_composites(self, by_id: dict[str, tuple[Publication, str, str]]) -> None:
        o = self.oracle
        for key, held in o.subs.items():
            cs = held.composite
            if cs is None or not o.settled(key, held):
                continue
            client = self.sim.clients[key[0]]
            broker = client.broker
            arrived = self.sim.seen[broker][self._offsets[broker] :]
            arrived_ids = {p.id for p in arrived}
            for pid, (pub, publisher, aid) in by_id.items():
                adv = o.advs.get((publisher, aid))
                if adv is None or not o.settled((publisher, aid), adv):
                    continue
                needed = any(matches(routing_filter(f), pub) for f in cs.filters)
                if needed and pid not in arrived_ids:
                    o.violations.append(f"{pid} never reached {broker} for composite {key[1]}")
            reference = ReferenceMatcher(self.sim.limits)
            reference.add(cs)
            expected = {m.key() for p in arrived for m in reference.match(p).composites}
            got = {
                CompositeMatch(n.subscription, n.publications, n.bindings).key()
                for n in client.composites
                if n.subscription == key[1] and all(p.id in arrived_ids for p in n.publications)
            }
            for n in client.composites:
                if n.subscription == key[1] and not _sound(cs, n.publications, n.bindings):
                    o.violations.append(f"composite {key[1]} reported an invalid match")
            o.composite_matches += len(got)
            if got != expected:
                o.violations.append(
                    f"composite {key[1]} at {broker}: {len(got - expected)} unexpected, "
                    f"{len(expected - got)} missing matches"
                )

    def finish(self) -> None:
        for client in list(self.live.values()):
            self.leave(client)
        self.sim.run()
        if not self.sim.tables_empty():
            left = [b.id for b in self.sim.brokers.values() if not b.is_empty()]
            self.oracle.violations.append(f"routing state left at {', '.join(left[:5])}")


def _sound(cs: CompositeSubscription, pubs: tuple[Publication, ...], bindings: Any) -> bool:
    if len({p.id for p in pubs}) != len(pubs):
        return False
    for pattern in cs.patterns:
        if len(pattern) != len(pubs):
            continue
        bound: dict[str, Any] | None = {}
        for leaf, pub in zip(pattern, pubs, strict=True):
            bound = filter_bindings(cs.filters[leaf], pub, bound)
            if bound is None:
                break
        if bound is not None and bound == dict(bindings):
            return True
    return False


def run(
    brokers: int = 100,
    clients: int = 1000,
    rounds: int = 10,
    operations: int = 300,
    seed: int = 1,
    covering: Covering = Covering.LAZY,
    extra_links: float = 0.5,
    progress: Callable[[str], None] | None = None,
    *,
    merging: Merging | None = None,
    quotes: Sequence[Publication] | None = None,
) -> dict[str, Any]:
    """Build the overlay, run the rounds, check them; returns figures and any violations.
    ``quotes``: the stock workload on these quotes (else the random one)."""
    rng = random.Random(seed)
    merging = merging or Merging()
    sim = Simulation(seed, covering=covering, merging=merging)
    workload: Workload = RandomWorkload(rng) if quotes is None else StockWorkload(quotes, rng, seed)
    started = time.perf_counter()
    for i in range(brokers):
        sim.add_broker(f"B{i}")
    edges = topology(brokers, extra_links, rng)
    for a, b in edges:
        sim.link(a, b)
    sim.run()
    if progress:
        progress(f"overlay of {brokers} brokers and {len(edges)} links built")
    driver = Driver(sim, clients, rng, workload)
    for i in range(rounds):
        driver.round(operations)
        if progress:
            progress(
                f"round {i + 1}/{rounds}: {sim.delivered:,} messages, "
                f"{len(driver.oracle.violations)} violations, {time.perf_counter() - started:.1f} s"
            )
    tables = _tables(sim)
    driver.finish()
    elapsed = time.perf_counter() - started
    o = driver.oracle
    return {
        "machine": machine(),
        "brokers": brokers,
        "links": len(edges),
        "clients": clients,
        "rounds": rounds,
        "operations": rounds * operations,
        "workload": "random" if quotes is None else "stock",
        "covering": covering.value,
        "merging": "off" if not merging.enabled else "on",
        "merge_imperfect": merging.imperfect,
        "seed": seed,
        "messages": sim.delivered,
        "published": driver.published,
        "publications_routed": sim.publications_routed,
        "unwanted": sum(b.routes.unwanted for b in sim.brokers.values()),
        "trusted": sum(b.routes.trusted for b in sim.brokers.values()),
        "deliveries": o.deliveries,
        "checked": o.checked,
        "composite_matches": o.composite_matches,
        **tables,
        "seconds": elapsed,
        "messages_per_second": sim.delivered / elapsed,
        "violations": o.violations,
    }


def _tables(sim: Simulation) -> dict[str, int]:
    """The routing tables' sizes over the overlay (at the end of the rounds)."""
    brokers = sim.brokers.values()
    merging = [b.routes.mergers.statistics() for b in brokers]
    return {
        "routes_at_end_of_rounds": sum(len(b.routes) for b in brokers),
        "forwarded_at_end_of_rounds": sum(b.routes.forwarded() for b in brokers),
        "forwarded_before_merging": sum(
            b.routes.forwarded() + b.routes.mergers.saved() for b in brokers
        ),
        "merged_at_end_of_rounds": sum(m.merged for m in merging),
        "inexact_at_end_of_rounds": sum(m.inexact for m in merging),
        "trees_at_end_of_rounds": sum(len(b.trees) for b in brokers),
    }


def compare(merging: Merging, **kwargs: Any) -> dict[str, Any]:
    """``run`` twice on the same seed, without merging and with ``merging``."""
    return {"unmerged": run(**kwargs), "merged": run(merging=merging, **kwargs)}


def report(result: dict[str, Any]) -> str:
    merging = "off" if result["merging"] == "off" else _merging(result)
    lines = [
        f"{result['brokers']} brokers, {result['links']} links ({_shape(result)}), "
        f"{result['clients']} "
        f"clients, {result['operations']:,} operations in {result['rounds']} rounds, "
        f"{result['workload']} workload, covering {result['covering']}, merging {merging}, "
        f"seed {result['seed']}",
        f"  {result['messages']:,} messages routed in {result['seconds']:.1f} s "
        f"({result['messages_per_second']:,.0f} per second, one process)",
        f"  {result['deliveries']:,} deliveries; {result['checked']:,} required deliveries "
        f"checked; {result['composite_matches']:,} composite matches checked",
        f"  routing entries at the end of the rounds: {result['routes_at_end_of_rounds']:,} "
        f"subscriptions ({result['forwarded_at_end_of_rounds']:,} forwarded, "
        f"{result['merged_at_end_of_rounds']:,} of them merged), "
        f"{result['trees_at_end_of_rounds']:,} advertisements",
        f"  {result['published']:,} publications sent {result['publications_routed']:,} times "
        f"from broker to broker, {result['unwanted']:,} of them to no use",
        f"  oracle: {len(result['violations'])} violations"
        + "".join(f"\n    {v}" for v in result["violations"][:20]),
        "  after every client left: every routing table empty"
        if not any("routing state left" in v for v in result["violations"])
        else "",
    ]
    return "\n".join(line for line in lines if line)


def _shape(result: dict[str, Any]) -> str:
    return "cyclic" if result["links"] >= result["brokers"] else "a tree"


def _merging(result: dict[str, Any]) -> str:
    rate = result["merge_imperfect"]
    return f"on (imperfect up to {rate:g})" if rate else "on (perfect only)"


_COMPARED = (
    ("subscriptions in routing tables (all brokers)", "routes_at_end_of_rounds"),
    ("  filters forwarded to neighbours (per tree)", "forwarded_at_end_of_rounds"),
    ("    before each broker merged what it sends", "forwarded_before_merging"),
    ("    merged ones", "merged_at_end_of_rounds"),
    ("    of which imperfect", "inexact_at_end_of_rounds"),
    ("messages (all links)", "messages"),
    ("publications sent broker to broker", "publications_routed"),
    ("  that nothing there wanted", "unwanted"),
    ("deliveries", "deliveries"),
    ("required deliveries checked", "checked"),
    ("oracle violations", "violations"),
    ("seconds", "seconds"),
)


def report_compared(result: dict[str, Any]) -> str:
    """``compare``'s runs side by side."""
    off, on = result["unmerged"], result["merged"]
    lines = [
        f"{off['brokers']} brokers, {off['links']} links ({_shape(off)}), "
        f"{off['clients']} clients, {off['operations']:,} operations in {off['rounds']} rounds, "
        f"{off['workload']} workload, covering {off['covering']}, seed {off['seed']}; "
        f"{off['published']:,} publications; merging {_merging(on)}",
        f"  {'':46} {'unmerged':>11} {'merged':>11}",
    ]
    for label, key in _COMPARED:
        a, b = off[key], on[key]
        if isinstance(a, list):
            a, b = len(a), len(b)
        cells = [f"{v:11.1f}" if isinstance(v, float) else f"{v:11,}" for v in (a, b)]
        lines.append(f"  {label:46} {cells[0]} {cells[1]}")
    for name, run_ in (("unmerged", off), ("merged", on)):
        lines += [f"  {name}: {v}" for v in run_["violations"][:10]]
    return "\n".join(lines)
