"""``padres bench match``: the Rete engine against the naive scan, on seeded workloads.

Every figure comes from one run: the engine's time per publication (median and p99), the
naive scan's on a sample of the same publications, their ratio, and a check that both found
the same matches on that sample. Build, insert (one by one, and for the atomic workloads in one
``Network.add_many`` batch) and remove rates and memory come from the engine's own network
(resident set growth per condition). After loading, the garbage
collector is settled as a broker settles it (``padres.runtime.collector.freeze``: what exists is
frozen, young objects are collected less often).
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from padres.bench import machine
from padres.bench.workloads import (
    absence_subscriptions,
    composite_publications,
    composite_subscriptions,
    dense_condition,
    dense_events,
    jittered,
    sequence_subscriptions,
    stock_publications,
    stock_subscriptions,
)
from padres.matching.experta_matcher import ExpertaMatcher
from padres.matching.reference import ReferenceMatcher
from padres.matching.rete_matcher import ReteMatcher, to_composite, to_condition, to_conjunction
from padres.model.messages import CompositeSubscription, Publication
from padres.runtime import collector
from rete import Activation, Composite, CompositeLimits, Conjunction, Network, Result
from rete.conditions import TemporalComposite, Test

__all__ = ["WORKLOADS", "report", "run"]


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _durations(operations: Iterable[Callable[[], object]]) -> list[float]:
    """Seconds each operation took."""
    times = []
    for operation in operations:
        started = time.perf_counter()
        operation()
        times.append(time.perf_counter() - started)
    return times


def _per_pub_ms(match: Callable[[Publication], object], pubs: Sequence[Publication]) -> list[float]:
    return [t * 1000 for t in _durations(partial(match, pub) for pub in pubs)]


FRAME = 500
"""Publications matched together in the batched runs, as a broker matches a frame's."""


def _batches(network: Network, pubs: Sequence[Publication]) -> Iterator[Result]:
    """The results of matching ``pubs`` in batches of ``FRAME`` (``Network.match_batch``)."""
    for start in range(0, len(pubs), FRAME):
        yield from network.match_batch(pubs[start : start + FRAME])


def _batched(network: Network, pubs: Sequence[Publication]) -> float:
    """Seconds to match ``pubs`` in batches, each result dropped as it comes."""
    started = time.perf_counter()
    for _ in _batches(network, pubs):
        pass
    return time.perf_counter() - started


def _p99(times: list[float]) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


@dataclass
class _Built:
    network: Network
    build_s: float
    bytes_per_sub: float


def _build(
    conditions: Sequence[tuple[Hashable, Conjunction | Composite | TemporalComposite]],
    limits: CompositeLimits | None = None,
) -> _Built:
    gc.collect()
    before = _rss()
    network = Network(limits)
    started = time.perf_counter()
    for cid, condition in conditions:
        network.add(cid, condition)
    network.prepare()
    build_s = time.perf_counter() - started
    gc.collect()
    grown = _rss() - before
    # As a broker does once loaded: the collector then stops rescanning the resident
    # conditions, whose pauses would otherwise dominate the p99, and collects less often.
    collector.freeze()
    return _Built(network, build_s, grown / max(1, len(conditions)))


def _churn(
    network: Network,
    extra: Sequence[tuple[Hashable, Conjunction | Composite]],
    victims: Sequence[Hashable],
    batch: Sequence[tuple[Hashable, Conjunction]] = (),
) -> dict[str, float]:
    """Insert ``extra`` one by one, then ``batch`` in one call (``Network.add_many``, as a frame
    of subscriptions may be filed), then remove ``victims``, the network resident: rates per
    second, the median time of one operation, and the longest (a growth shows there)."""
    inserts = _durations([partial(network.add, cid, condition) for cid, condition in extra])
    batched: dict[str, float] = {}
    if batch:
        (took,) = _durations([partial(network.add_many, batch)])
        batched = {"batch_insert_per_s": len(batch) / took, "batch_size": len(batch)}
    removes = _durations([partial(network.remove, cid) for cid in victims])
    return {
        "insert_per_s": len(inserts) / sum(inserts),
        "insert_median_us": statistics.median(inserts) * 1e6,
        "insert_max_ms": max(inserts) * 1000,
        **batched,
        "remove_per_s": len(removes) / sum(removes),
        "remove_median_us": statistics.median(removes) * 1e6,
        "remove_max_ms": max(removes) * 1000,
    }


def run_stock(
    subs: int, pubs: int, naive_pubs: int, seed: int, data: Path | None
) -> dict[str, Any]:
    quotes = stock_publications(data)
    rng = random.Random(seed)
    subscriptions = list(stock_subscriptions(subs, quotes, seed))
    conditions = [(s.id, to_conjunction(s.filter)) for s in subscriptions]
    built = _build(conditions)
    matcher = ReteMatcher()
    matcher.network = built.network
    sample = rng.sample(quotes, min(pubs, len(quotes)))
    times = _per_pub_ms(matcher.match, sample)
    results = [matcher.match(p) for p in sample[:naive_pubs]]
    reference = ReferenceMatcher()
    for s in subscriptions:
        reference.add(s)
    naive_times = _per_pub_ms(reference.match, sample[:naive_pubs])
    expected = [reference.match(p) for p in sample[:naive_pubs]]
    checked = all(
        sorted(a.subscriptions) == sorted(b.subscriptions)
        for a, b in zip(results, expected, strict=True)
    )
    extra, batch = (
        [
            (f"{prefix}{s.id}", to_conjunction(s.filter))
            for s in stock_subscriptions(min(subs, 20_000), quotes, seed + offset)
        ]
        for prefix, offset in (("x", 1), ("y", 2))
    )
    batch_s = _batched(built.network, sample)
    checked = checked and all(
        tuple(r.conditions) == matcher.match(p).subscriptions
        for p, r in zip(sample, _batches(built.network, sample), strict=True)
    )
    victims = [cid for cid, _ in conditions[: len(extra)]]
    churn = _churn(built.network, extra, victims, batch)
    matches = statistics.mean(len(matcher.match(p).subscriptions) for p in sample[:200])
    figures = _figures("stock", subs, times, naive_times, checked, matches, built)
    batched = {"batched_ms": batch_s * 1000 / len(sample), "mean_ms": statistics.mean(times)}
    return figures | churn | batched


def run_dense(subs: int, pubs: int, naive_pubs: int, seed: int, naive_subs: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    conditions = [(i, dense_condition(rng)) for i in range(subs)]
    built = _build(conditions)
    events = dense_events(pubs, seed + 1)
    network = built.network
    times = _per_pub_ms(network.match, events)
    # The naive scan over every condition would take seconds per event: it is timed over the
    # first ``naive_subs`` conditions and scaled (a scan is linear); the match check uses a
    # vectorized scan of all of them.
    subset = [c for _, c in conditions[:naive_subs]]

    def naive(event: Publication) -> list[int]:
        attrs = event.attributes
        return [i for i, tests in enumerate(subset) if all(t.passes(attrs) for t in tests)]

    naive_times = [t * subs / len(subset) for t in _per_pub_ms(naive, events[:naive_pubs])]
    checked = _dense_check(conditions, network, events[:naive_pubs])
    matches = statistics.mean(len(network.match(e).conditions) for e in events[:200])
    more = min(subs, 50_000)
    extra = [(subs + i, dense_condition(rng)) for i in range(more)]
    batch = [(subs + more + i, dense_condition(rng)) for i in range(more)]
    del conditions
    churn = _churn(network, extra, list(range(len(extra))), batch)
    return (
        _figures("dense", subs, times, naive_times, checked, matches, built)
        | churn
        | {"naive_scaled_from": len(subset)}
    )


def _dense_check(
    conditions: list[tuple[int, tuple[Test, ...]]], network: Network, events: Sequence[Publication]
) -> bool:
    columns = np.array(
        [[t.operand for t in tests[1::2]] for _, tests in conditions], dtype=np.int64
    )
    attrs = np.array([[int(t.attribute[1:]) for t in tests[1::2]] for _, tests in conditions])
    for event in events:
        x = np.array([event.attributes[f"a{j}"] for j in range(20)], dtype=np.int64)[attrs]
        expected = np.flatnonzero(((columns <= x) & (x <= columns + 300_000)).all(axis=1)).tolist()
        if sorted(network.match(event).conditions) != expected:
            return False
    return True


def run_composite(
    subs: int, pubs: int, seed: int, experta_subs: int, experta_pubs: int
) -> dict[str, Any]:
    limits = CompositeLimits(window=timedelta(seconds=10))
    subscriptions = list(composite_subscriptions(subs, seed))
    stream = composite_publications(pubs, seed + 1)
    built = _build([(s.id, to_composite(s)) for s in subscriptions], limits)
    matcher = ReteMatcher(limits)
    matcher.network = built.network
    times = _per_pub_ms(matcher.match, stream)
    completed = sum(len(matcher.match(p).composites) for p in stream[:2000])
    state = built.network.stats()
    # Batched, as a broker matches a frame: on a fresh network, checked against another
    # fresh one matching one by one.
    conditions = [(s.id, to_composite(s)) for s in subscriptions]
    batch_s = _batched(_build(conditions, limits).network, stream)
    batched, single = _build(conditions, limits).network, _build(conditions, limits).network
    same_batched = all(
        _keys(r.activations) == _keys(single.match(p).activations)
        for p, r in zip(stream, _batches(batched, stream), strict=True)
    )
    extra = [
        (f"x{s.id}", to_composite(s)) for s in composite_subscriptions(min(subs, 5000), seed + 2)
    ]
    churn = _churn(built.network, extra, [s.id for s in subscriptions[: len(extra)]])
    # The reference matcher and experta keep every fact: a smaller set, a shorter stream.
    few = subscriptions[:experta_subs]
    prefix = stream[:experta_pubs]
    rete_s = _timed_matches(ReteMatcher(), few, prefix)
    naive_s = _timed_matches(ReferenceMatcher(), few, prefix)
    experta_s = _timed_matches(ExpertaMatcher(), few, prefix)
    median = statistics.median(times)
    return {
        "workload": "composite",
        "subs": subs,
        "pubs": len(stream),
        "pubs_per_s": len(stream) / (sum(times) / 1000),
        "batched_pubs_per_s": len(stream) / batch_s,
        "batched_same": same_batched,
        "median_ms": median,
        "p99_ms": _p99(times),
        "matches_per_pub": completed / min(len(stream), 2000),
        "build_s": built.build_s,
        "bytes_per_sub": built.bytes_per_sub,
        **churn,
        "composite_facts_at_end": state["composite_facts"],
        "join_nodes": state["join_nodes"],
        "small_subs": len(few),
        "small_pubs": len(prefix),
        "rete_small_pubs_per_s": len(prefix) / rete_s,
        "naive_pubs_per_s": len(prefix) / naive_s,
        "experta_pubs_per_s": len(prefix) / experta_s,
        "naive_ratio": naive_s / rete_s,
        "experta_ratio": experta_s / rete_s,
        "checked": _composite_check(few, prefix),
        "machine": machine(),
    }


def _keys(activations: list[Activation]) -> list[tuple[str, tuple[str, ...]]]:
    """Activations by composite and publications, in an order independent of the network's
    (separately built networks may list one fact's activations in different orders)."""
    return sorted((a.id, tuple(p.id for p in a.facts)) for a in activations)


def _timed_matches(
    matcher: ReteMatcher | ReferenceMatcher | ExpertaMatcher,
    subs: list[CompositeSubscription],
    stream: list[Publication],
) -> float:
    for sub in subs:
        matcher.add(sub)
    return sum(_durations([lambda: [matcher.match(p) for p in stream]]))


def _composite_check(subs: list[CompositeSubscription], stream: list[Publication]) -> bool:
    rete, experta = ReteMatcher(), ExpertaMatcher()
    for s in subs:
        rete.add(s)
        experta.add(s)
    for pub in stream:
        if {m.key() for m in rete.match(pub).composites} != {
            m.key() for m in experta.match(pub).composites
        }:
            return False
    return True


def _figures(
    workload: str,
    subs: int,
    times: list[float],
    naive_times: list[float],
    checked: bool,
    matches: float,
    built: _Built,
) -> dict[str, Any]:
    median = statistics.median(times)
    naive = statistics.median(naive_times)
    return {
        "workload": workload,
        "subs": subs,
        "pubs": len(times),
        "median_ms": median,
        "p99_ms": _p99(times),
        "naive_ms": naive,
        "naive_pubs": len(naive_times),
        "naive_ratio": naive / median,
        "matches_per_pub": matches,
        "match_fraction": matches / subs,
        "checked": checked,
        "build_s": built.build_s,
        "bytes_per_sub": built.bytes_per_sub,
        "machine": machine(),
    }


def run_temporal(
    workload: str, subs: int, pubs: int, seed: int, reference_subs: int, reference_pubs: int
) -> dict[str, Any]:
    """Sequences or absences (``workload``): the Rete network's throughput (with a broker's
    tick every second of event time) and the facts it holds as the stream goes on, and, on a
    smaller set, the reference matcher's throughput and a check that both report the same
    matches (time advanced past the end, too)."""
    make = sequence_subscriptions if workload == "sequence" else absence_subscriptions
    subscriptions = list(make(subs, seed))
    stream = jittered(composite_publications(pubs, seed + 1), seed + 2, timedelta(milliseconds=50))
    built = _build([(s.id, to_condition(s)) for s in subscriptions])
    network = built.network
    matcher = ReteMatcher()
    matcher.network = network
    held: list[int] = []
    found = [0]

    def match(pub: Publication) -> None:
        found[0] += len(matcher.match(pub).composites)

    def tick(pub: Publication) -> None:
        """Matched, then a broker's tick (every second of event time): the clock, a second
        behind, closes the windows no publication came to close."""
        match(pub)
        found[0] += len(matcher.advance(pub.timestamp - timedelta(seconds=1)))

    times: list[float] = []
    step = max(1, len(stream) // 10)
    for start in range(0, len(stream), step):
        chunk = stream[start : start + step]
        for at in range(0, len(chunk), TICK_EVERY):
            times += _per_pub_ms(match, chunk[at : at + TICK_EVERY - 1])
            times += _per_pub_ms(tick, chunk[at + TICK_EVERY - 1 : at + TICK_EVERY])
        held.append(network.stats()["temporal_facts"])
    matches = found[0]
    end = max(p.timestamp for p in stream) + timedelta(minutes=1)
    closed = len(matcher.advance(end))
    few = subscriptions[:reference_subs]
    prefix = stream[:reference_pubs]
    rete_s, rete_keys = _temporal_run(ReteMatcher(), few, prefix, end)
    naive_s, naive_keys = _temporal_run(ReferenceMatcher(), few, prefix, end)
    return {
        "workload": workload,
        "subs": subs,
        "pubs": len(stream),
        "pubs_per_s": len(times) / (sum(times) / 1000),
        "median_ms": statistics.median(times),
        "p99_ms": _p99(times),
        "matches_per_pub": matches / len(stream),
        "closed_at_end": closed,
        "late": matcher.late,
        "held": held,
        "build_s": built.build_s,
        "bytes_per_sub": built.bytes_per_sub,
        "small_subs": len(few),
        "small_pubs": len(prefix),
        "small_matches": len(rete_keys),
        "rete_small_pubs_per_s": len(prefix) / rete_s,
        "naive_pubs_per_s": len(prefix) / naive_s,
        "naive_ratio": naive_s / rete_s,
        "checked": rete_keys == naive_keys,
        "machine": machine(),
    }


TICK_EVERY = 1000
"""Publications between two ticks in the temporal workloads: a second of event time."""


def _temporal_run(
    matcher: ReteMatcher | ReferenceMatcher,
    subs: list[CompositeSubscription],
    stream: list[Publication],
    end: datetime,
) -> tuple[float, list[list[str]]]:
    """Seconds to match ``stream``, and every match reported (as each publication's and
    the end's lists of match keys, sorted)."""
    for sub in subs:
        matcher.add(sub)
    found: list[list[str]] = []
    started = time.perf_counter()
    for pub in stream:
        found.append(sorted(str(m.key()) for m in matcher.match(pub).composites))
    found.append(sorted(str(m.key()) for m in matcher.advance(end)))
    return time.perf_counter() - started, [keys for keys in found if keys]


WORKLOADS = ("stock", "dense", "composite", "sequence", "absence")


def run(
    workload: str, subs: int | None, pubs: int | None, seed: int, data: Path | None
) -> dict[str, Any]:
    if workload == "stock":
        return run_stock(subs or 200_000, pubs or 2_000, 20, seed, data)
    if workload == "dense":
        return run_dense(subs or 1_000_000, pubs or 500, 5, seed, naive_subs=100_000)
    if workload in ("sequence", "absence"):
        return run_temporal(workload, subs or 10_000, pubs or 100_000, seed, 200, 5_000)
    return run_composite(
        subs or 10_000, pubs or 100_000, seed, experta_subs=1_000, experta_pubs=2_000
    )


def report(r: dict[str, Any]) -> str:
    if r["workload"] in ("sequence", "absence"):
        held = ", ".join(f"{n:,}" for n in r["held"])
        lines = [
            f"{r['workload']}: {r['subs']:,} composite subscriptions, {r['pubs']:,} publications"
            " (stamped up to 50 ms early)",
            f"  throughput          {r['pubs_per_s']:>12,.0f} publications/s one by one",
            f"  median / p99        {r['median_ms']:>12.3f} / {r['p99_ms']:.3f} ms per publication",
            f"  matches per pub     {r['matches_per_pub']:>12.3f}"
            f"  ({r['closed_at_end']:,} more when time passed the end; {r['late']:,} late)",
            f"  facts held          {held}  (every tenth of the stream)",
            "  (a tick every 1,000 publications, a second of event time, as a broker's)",
            f"  build               {r['build_s']:>12.2f} s,"
            f" {r['bytes_per_sub']:,.0f} bytes/subscription",
            f"  {r['small_subs']:,} subscriptions, {r['small_pubs']:,} publications"
            f" ({r['small_matches']:,} times a match was reported):",
            f"    rete              {r['rete_small_pubs_per_s']:>12,.0f} publications/s",
            f"    reference         {r['naive_pubs_per_s']:>12,.0f} publications/s"
            f"  (rete {r['naive_ratio']:,.0f}x)   same matches: {r['checked']}",
        ]
        return "\n".join(lines)
    if r["workload"] == "composite":
        lines = [
            f"composite: {r['subs']:,} composite subscriptions, {r['pubs']:,} publications",
            f"  throughput          {r['pubs_per_s']:>12,.0f} publications/s one by one",
            f"  batched ({FRAME} a batch) {r['batched_pubs_per_s']:>8,.0f} publications/s"
            f"  ({r['batched_pubs_per_s'] / r['pubs_per_s']:.2f}x; same matches:"
            f" {r['batched_same']})",
            f"  median / p99        {r['median_ms']:>12.3f} / {r['p99_ms']:.3f} ms per publication",
            f"  matches per pub     {r['matches_per_pub']:>12.3f}",
            f"  facts held at end   {r['composite_facts_at_end']:>12,}"
            f"  ({r['join_nodes']:,} join nodes)",
            f"  build               {r['build_s']:>12.2f} s,"
            f" {r['bytes_per_sub']:,.0f} bytes/subscription",
            f"  insert / remove     {r['insert_per_s']:>12,.0f}"
            f" / {r['remove_per_s']:,.0f} per second",
            f"  {r['small_subs']:,} subscriptions, {r['small_pubs']:,} publications,"
            " every fact kept:",
            f"    rete              {r['rete_small_pubs_per_s']:>12,.0f} publications/s",
            f"    naive scan        {r['naive_pubs_per_s']:>12,.0f} publications/s"
            f"  (rete {r['naive_ratio']:,.0f}x)",
            f"    experta           {r['experta_pubs_per_s']:>12,.0f} publications/s"
            f"  (rete {r['experta_ratio']:,.0f}x)   same matches: {r['checked']}",
        ]
        return "\n".join(lines)
    lines = [
        f"{r['workload']}: {r['subs']:,} subscriptions, {r['pubs']:,} publications timed",
        f"  median / p99        {r['median_ms']:>10.3f} / {r['p99_ms']:.3f} ms per publication",
        f"  naive scan          {r['naive_ms']:>10.1f} ms per publication"
        f" (median of {r['naive_pubs']})",
        f"  ratio to naive      {r['naive_ratio']:>10,.0f}x  same matches: {r['checked']}",
        *(
            [
                f"  batched ({FRAME} a batch) {r['batched_ms']:>6.3f} ms per publication"
                f"  (one by one: {r['mean_ms']:.3f} ms; both means)"
            ]
            if "batched_ms" in r
            else []
        ),
        f"  matches per pub     {r['matches_per_pub']:>10.1f}"
        f"  ({r['match_fraction']:.3%} of subscriptions)",
        f"  build               {r['build_s']:>10.2f} s,"
        f" {r['bytes_per_sub']:,.0f} bytes/subscription",
        f"  insert / remove     {r['insert_per_s']:>10,.0f} / {r['remove_per_s']:,.0f} per second"
        f" (one takes {r['insert_median_us']:.0f} / {r['remove_median_us']:.0f} us,"
        f" longest {r['insert_max_ms']:.0f} / {r['remove_max_ms']:.0f} ms)",
        *(
            [
                f"  batch insert        {r['batch_insert_per_s']:>10,.0f} per second"
                f" ({r['batch_size']:,} in one Network.add_many)"
            ]
            if "batch_insert_per_s" in r
            else []
        ),
    ]
    if "naive_scaled_from" in r:
        lines.append(f"  (naive timed on {r['naive_scaled_from']:,} subscriptions and scaled)")
    return "\n".join(lines)
