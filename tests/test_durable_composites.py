"""Durable composite subscriptions: their partial matches written down and taken up again, and
broker cores (in the simulation) killed in the middle of a window.

The reference for what a durable composite must deliver is the same composite in a network
that is never interrupted: a snapshot taken at any moment and restored into a new network (as
a restarted broker does) gives the same matches from there on, in the same order.
"""

from __future__ import annotations

import random
import sqlite3
from contextlib import closing
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec import UNSET

from padres.broker import Broker, durable
from padres.broker.durable_composites import DurableComposite
from padres.broker.sqlite_journal import SqliteJournal
from padres.errors import JournalError
from padres.language.parser import parse_advertisement, parse_composite
from padres.model.messages import CompositeSubscription, Expression, Publication, Temporal
from padres.model.protocol import Ack, CompositeNotify, Durable, Guaranteed, Hello, Roam, Role
from padres.runtime.simulation import SimClient, Simulation
from rete.limits import CompositeLimits, Policy
from rete.operators import Value
from tests.strategies import NOW, scaled
from tests.test_temporal import CLASSES, KEYS, _group, leaf, sequences, temporals

AHEAD = timedelta(minutes=1)

Step = tuple[Publication | None, float]
"""A publication to match, or (None) time passing: the clock, that many seconds after
``NOW``."""


@st.composite
def steps(draw: st.DrawFn) -> list[Step]:
    """Publications whose timestamps move forward, some shifted back (out of order within a
    lateness of 5 s, or beyond), with the clock advancing now and then between them."""
    out: list[Step] = []
    at = 0.0
    for n in range(draw(st.integers(6, 30))):
        if draw(st.integers(0, 3)) == 0:  # about where the publications are, or a bit ahead
            out.append((None, at + draw(st.sampled_from([-3.0, 0.5, 2.0, 6.0]))))
        at += draw(st.sampled_from([0.0, 0.5, 1.0, 2.0, 4.0]))
        back = draw(st.sampled_from([0.0, 0.0, 0.0, 1.0, 3.0, 7.0]))
        attrs: dict[str, Value] = {"class": draw(st.sampled_from(CLASSES))}
        if draw(st.integers(0, 3)):
            attrs["k"] = draw(st.sampled_from(KEYS))
        attrs["n"] = draw(st.sampled_from([0, 1, 2]))
        out.append((Publication(f"p{n}", attrs, NOW + timedelta(seconds=at - back)), 0.0))
    out.append((None, at + 3600.0))
    return out


def _keys(notes: list[CompositeNotify]) -> list[tuple[tuple[str, ...], str]]:
    return [(tuple(p.id for p in n.publications), str(sorted(n.bindings.items()))) for n in notes]


def _run(
    sub: CompositeSubscription, limits: CompositeLimits, events: list[Step], cuts: set[int]
) -> list[CompositeNotify]:
    """The matches of ``sub`` over ``events``, its state written and taken up by a new
    network (a restarted broker's) before each event whose index is in ``cuts``."""
    composite = DurableComposite(sub, limits)
    out: list[CompositeNotify] = []
    for i, (pub, passed) in enumerate(events):
        if i in cuts:
            kept = composite.dump()
            composite = DurableComposite(sub, limits)
            composite.load(kept)
        if pub is None:
            out += composite.advance(NOW + timedelta(seconds=passed), AHEAD)
        else:
            out += composite.match(pub)
    return out


@settings(max_examples=scaled(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(sequences(), sequences(), _group(leaf()), _group(_group(leaf()))),
    st.one_of(temporals(), temporals(), st.none()),
    steps(),
    st.data(),
    st.sampled_from([10_000, 2]),
    st.sampled_from(list(Policy)),
    st.sampled_from([None, timedelta(seconds=3)]),
)
def test_a_composite_taken_up_from_its_snapshot_goes_on_as_if_never_stopped(
    expression: Expression,
    temporal: Temporal | None,
    events: list[Step],
    data: st.DataObject,
    max_facts: int,
    policy: Policy,
    window: timedelta | None,
) -> None:
    limits = CompositeLimits(policy, max_facts, window)
    try:
        sub = CompositeSubscription("d", expression, UNSET if temporal is None else temporal)
    except ValueError:
        return  # a sequence without its clauses, or an absence at the end without a window
    cuts = data.draw(st.sets(st.integers(0, len(events) - 1), min_size=1))
    assert _keys(_run(sub, limits, events, cuts)) == _keys(_run(sub, limits, events, set()))


A = "{[class,eq,'A'],[k,eq,$K]}"
B = "{[class,eq,'B'],[k,eq,$K]}"
C = "{[class,eq,'C']}"
WRITTEN = [
    f"{A} ; !{B} within 3s",
    f"{A} ; !{B} within 4 events late 2s",
    f"{A} ; !{B} ; {A} within 10s",
    f"{A} ;; {B} within 10s",
    f"{A} ; {B} within 5s consume first",
    f"{A} ; {B} within 5s late 5s consume last",
    f"{A} & {B} & {C} within 3s",
    f"({A} || {C}) ; {B} within 3 events",
    f"{A} & {B}",
    f"{A} & ({B} || {C})",
]
"""Composites that hold publications and matches waiting for a window, of every kind."""


@settings(max_examples=scaled(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(WRITTEN),
    steps(),
    st.data(),
    st.sampled_from(list(Policy)),
    st.sampled_from([None, timedelta(seconds=3)]),
)
def test_written_composites_taken_up_from_their_snapshots_go_on_as_if_never_stopped(
    text: str, events: list[Step], data: st.DataObject, policy: Policy, window: timedelta | None
) -> None:
    limits = CompositeLimits(policy, window=window)
    sub = parse_composite(text, id="d")
    cuts = data.draw(st.sets(st.integers(0, len(events) - 1), min_size=1))
    assert _keys(_run(sub, limits, events, cuts)) == _keys(_run(sub, limits, events, set()))


def test_a_snapshot_holds_what_the_window_holds() -> None:
    """The state written is bounded by the window: publications older than it are not kept."""
    sub = parse_composite(
        "{[class,eq,'A'],[k,eq,$K]} ; {[class,eq,'B'],[k,eq,$K]} within 5s", id="d"
    )
    composite = DurableComposite(sub, CompositeLimits())
    sizes = []
    for n in range(2_000):
        at = NOW + timedelta(seconds=n / 10)  # ten a second: 50 in a window
        composite.match(Publication(f"a{n}", {"class": "A", "k": f"k{n % 7}"}, at))
        sizes.append(composite.held())
    assert max(sizes) <= 52  # the window's, and the one waiting in the reorder buffer
    assert len(composite.dump()) < 60 * 200


def test_a_snapshot_of_another_composite_or_garbage_is_refused() -> None:
    one = DurableComposite(
        parse_composite("{[class,eq,'A']} ; {[class,eq,'B']} within 5s", id="d"), CompositeLimits()
    )
    one.match(Publication("a", {"class": "A"}, NOW))
    other = DurableComposite(
        parse_composite("{[class,eq,'A']} & {[class,eq,'B']}", id="d"), CompositeLimits()
    )
    with pytest.raises(JournalError, match="partial matches of durable subscription 'd'"):
        other.load(one.dump())
    with pytest.raises(JournalError, match="cannot read"):
        one.load(b"[1,2")


# -- broker cores in the simulation, the edge broker crashing ----------------------------------

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SEQUENCE = f"{A} ; {B} within 10s"
ABSENCE = f"{A} ; !{B} within 3s"


@dataclass
class Watcher:
    """A durable composite subscription's client: takes each match once, in order, and
    acknowledges as it goes."""

    sim: Simulation
    client: SimClient
    text: str
    got: list[CompositeNotify] = field(default_factory=list)
    last: int = 0
    read: int = 0

    def connect(self) -> None:
        self.sim.send(self.client, Durable(parse_composite(self.text, id="w"), self.last))

    def collect(self) -> None:
        fresh = self.client.composites[self.read :]
        self.read = len(self.client.composites)
        for note in fresh:
            assert note.subscription == "w"
            if note.seq <= self.last:
                continue  # sent again after a reconnect
            assert note.seq == self.last + 1, "numbered without gaps"
            self.last = note.seq
            self.got.append(note)
        if fresh and self.client.connected:
            self.sim.send(self.client, Ack("w", self.last))


def _overlay(text: str, seed: int = 0) -> tuple[Simulation, SimClient, Watcher]:
    """A publisher's broker P and the edge broker E, the publisher advertising A and B at P,
    a durable composite subscription of ``text`` at E."""
    sim = Simulation(seed, clock=T0.timestamp())
    sim.add_broker("P")
    sim.add_broker("E")
    sim.link("E", "P")
    shop = sim.attach("shop", "P")
    for cls in "AB":
        sim.send(shop, parse_advertisement(f"[class,eq,'{cls}'],[k,isPresent]", id=cls))
    sim.run()
    watcher = Watcher(sim, sim.attach("watch", "E"), text)
    watcher.connect()
    sim.run()
    assert "w" in watcher.client.acks
    return sim, shop, watcher


def _publish(sim: Simulation, shop: SimClient, cls: str, key: str, guaranteed: bool = True) -> str:
    pub = Publication(
        f"{cls}-{key}", {"class": cls, "k": key}, datetime.fromtimestamp(sim.clock, UTC)
    )
    sim.send(shop, Guaranteed(pub) if guaranteed else pub)
    sim.run()
    return pub.id


def _restart(sim: Simulation, watcher: Watcher) -> None:
    sim.add_broker("E")
    sim.link("E", "P")
    sim.reattach(watcher.client)
    watcher.collect()
    watcher.connect()
    sim.run()


def _wait(sim: Simulation, watcher: Watcher, seconds: int) -> None:
    for _ in range(seconds):
        sim.tick(1.0)
        sim.run()
        watcher.collect()


def _ids(watcher: Watcher) -> list[list[str]]:
    return [[p.id for p in note.publications] for note in watcher.got]


@pytest.mark.parametrize("while_down", [False, True])
def test_a_sequence_half_matched_when_its_broker_dies_is_matched_once_after(
    while_down: bool,
) -> None:
    """A came; the edge broker is killed; B comes after its restart (or while it is down, a
    guaranteed publication its recovery brings): the match comes once."""
    sim, shop, watcher = _overlay(SEQUENCE)
    a = _publish(sim, shop, "A", "x")
    sim.tick(1.0)
    sim.run()
    sim.crash("E")
    if while_down:
        b = _publish(sim, shop, "B", "x")
        _restart(sim, watcher)
    else:
        _restart(sim, watcher)
        b = _publish(sim, shop, "B", "x")
    _wait(sim, watcher, 10)
    assert _ids(watcher) == [[a, b]]
    sim.crash("E")  # and again: nothing is matched twice
    _restart(sim, watcher)
    _wait(sim, watcher, 10)
    assert _ids(watcher) == [[a, b]]


def test_a_match_made_while_its_client_is_away_waits_for_it() -> None:
    sim, shop, watcher = _overlay(SEQUENCE)
    sim.detach(watcher.client)
    a, b = _publish(sim, shop, "A", "y"), _publish(sim, shop, "B", "y")
    _wait(sim, watcher, 3)
    sim.crash("E")
    sim.add_broker("E")
    sim.link("E", "P")
    sim.run()
    assert watcher.got == []
    sim.reattach(watcher.client)
    watcher.connect()
    sim.run()
    watcher.collect()
    assert _ids(watcher) == [[a, b]]


@pytest.mark.parametrize(
    ("absent", "fires"),
    [(None, True), ("guaranteed", False), ("plain", True)],
)
def test_an_absence_whose_window_closes_while_its_broker_is_down_fires_once_after(
    absent: str | None, fires: bool
) -> None:
    """A came; the broker dies; the window closes while it is down. After the restart the
    absence fires once, unless a guaranteed B came in the window (the overlay brings it
    back); a plain B published while the broker was down is lost, and does not stop it."""
    sim, shop, watcher = _overlay(ABSENCE)
    a = _publish(sim, shop, "A", "z")
    sim.crash("E")
    sim.tick(1.0)
    if absent is not None:
        _publish(sim, shop, "B", "z", guaranteed=absent == "guaranteed")
    sim.tick(8.0)  # the window (3 s) closes while E is down
    _restart(sim, watcher)
    held = sim.brokers["E"].durables.statistics()[0]["held"]
    assert held >= 1  # A waits in the restored state
    _wait(sim, watcher, int(durable.HOLD) + 3)
    assert _ids(watcher) == ([[a]] if fires else [])
    sim.crash("E")  # once reported, it is not reported again
    _restart(sim, watcher)
    _wait(sim, watcher, int(durable.HOLD) + 3)
    assert _ids(watcher) == ([[a]] if fires else [])


def test_what_several_trees_bring_back_after_a_restart_is_matched_in_time_order() -> None:
    """B, then A, published on two trees while the edge broker is down: the trees' roots
    answer its recoveries one after the other, A's first, and yet ``B ; A`` matches (neither
    is taken for late)."""
    sim, shop, watcher = _overlay(f"{B} ; {A} within 10s")
    sim.crash("E")
    b = _publish(sim, shop, "B", "w")
    sim.tick(2.0)
    a = _publish(sim, shop, "A", "w")
    _restart(sim, watcher)
    _wait(sim, watcher, int(durable.HOLD) + 2)
    assert _ids(watcher) == [[b, a]]


@pytest.mark.parametrize("seed", range(3))
def test_every_match_once_through_crashes_at_random_moments(seed: int) -> None:
    """Guaranteed publications keep coming while the edge broker is killed again and again:
    the matches delivered are those of the same composite never interrupted, each once."""
    text = f"{A} ; {B} within 5s late 2s"  # the lateness: a tick may come between a
    # publication's stamp and its arrival, as it may at a broker
    sim, shop, watcher = _overlay(text, seed)
    rng = random.Random(seed)
    published: list[Publication] = []
    for _ in range(6):
        for _ in range(rng.randint(5, 30)):
            cls, key = rng.choice("AB"), rng.choice(["k1", "k2", "k3"])
            pub = Publication(
                f"p{len(published)}",
                {"class": cls, "k": key},
                datetime.fromtimestamp(sim.clock, UTC),
            )
            published.append(pub)
            sim.send(shop, Guaranteed(pub))
            sim.step(rng.randint(0, 15))
            if rng.random() < 0.2:
                sim.tick(rng.choice([0.3, 1.0, 2.5]))
            watcher.collect()
        sim.crash("E")
        sim.tick(rng.choice([0.5, 2.0]))
        _restart(sim, watcher)
    sim.run()
    _wait(sim, watcher, 20)
    reference = DurableComposite(parse_composite(text, id="w"), CompositeLimits())
    expected: list[CompositeNotify] = []
    for pub in published:
        expected += reference.match(pub)
    expected += reference.advance(datetime.fromtimestamp(sim.clock + 3600, UTC), AHEAD)
    assert len(shop.acks) >= len(published)
    assert _keys(watcher.got) == _keys(expected)


def test_a_durable_composite_brought_to_another_broker_starts_afresh_there() -> None:
    """The client moves to broker F (``roam``): F makes the composite anew and empty, E lets
    go of its copy, with the A it held; matches start again from 1 at F."""
    sim, shop, watcher = _overlay(SEQUENCE)
    sim.add_broker("F")
    sim.link("F", "P")
    sim.run()
    _publish(sim, shop, "A", "m")
    assert sim.brokers["E"].durables.statistics()[0]["held"] == 1
    sim.detach(watcher.client)
    moved = Watcher(sim, sim.attach("watch", "F"), SEQUENCE)
    sub = parse_composite(SEQUENCE, id="w")
    sim.send(moved.client, Durable(sub, 0, roam=Roam(age=1.0, left="E")))
    sim.run()
    assert "w" in moved.client.acks
    assert sim.brokers["E"].durables.statistics() == []
    (row,) = sim.brokers["F"].durables.statistics()
    assert row["held"] == 0 and row["next"] == 1
    _publish(sim, shop, "B", "m")  # its A stayed behind
    a, b = _publish(sim, shop, "A", "n"), _publish(sim, shop, "B", "n")
    _wait(sim, moved, 3)
    assert _ids(moved) == [[a, b]] and moved.last == 1


def test_partial_matches_that_cannot_be_read_are_started_afresh_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A poisoned journal (its partial matches overwritten): the broker starts, logs it, and
    the composite starts afresh; the match it had queued is kept. What is lost: the three A
    it held (in its memory and its reorder buffer)."""
    path = str(tmp_path / "journal.sqlite")
    journal = SqliteJournal(path)
    broker = Broker("B", journal=journal)
    now = T0.timestamp()
    for client in ("shop", "watch"):
        broker.handle(Hello(client, Role.CLIENT), client, now)
    for cls in "AB":
        broker.handle(parse_advertisement(f"[class,eq,'{cls}'],[k,isPresent]", id=cls), "shop", now)
    broker.handle(Durable(parse_composite(SEQUENCE, id="w")), "watch", now)
    for n, (cls, key) in enumerate([("A", "a"), ("B", "a"), ("A", "b"), ("A", "c")]):
        pub = Publication(f"{cls}{n}", {"class": cls, "k": key}, T0 + timedelta(seconds=n))
        broker.handle(pub, "shop", now)
    journal.commit()
    assert [(d["queued"], d["held"]) for d in broker.durables.statistics()] == [(1, 3)]
    journal.close()
    with closing(sqlite3.connect(path)) as db:
        db.execute("UPDATE partials SET state = ?", (b'[{"facts": 3}]',))
        db.commit()
    again = Broker("B", journal=SqliteJournal(path))
    assert "cannot read the partial matches of durable subscription 'w'" in caplog.text
    assert [(d["queued"], d["held"]) for d in again.durables.statistics()] == [(1, 0)]
