"""What every journal promises (``padres.broker.journal.Journal``), checked against each
implementation, then the two side by side: the same operations, the same answers."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from padres.broker.journal import (
    RETENTION,
    DeadLetterQueue,
    Delivered,
    DurableRecord,
    Journal,
    PreparedPart,
)
from padres.broker.memory_journal import MemoryJournal
from padres.broker.postgres_journal import PostgresJournal, drop_journal
from padres.broker.sqlite_journal import SqliteJournal
from padres.language.parser import parse_composite, parse_subscription
from padres.model.classes import Schema, parse_attributes
from padres.model.codec import encode
from padres.model.messages import Publication
from padres.model.protocol import CompositeNotify, ExceptionEntry, Outcome, Scope
from tests.postgres import LIBPQ, postgres_or_skip, reachable
from tests.strategies import scaled

T0 = datetime(2026, 1, 1, tzinfo=UTC)

Make = Callable[..., Journal]
"""Builds a journal; takes ``retention``."""


@pytest.fixture(params=["sqlite", "memory", "postgres"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Make]:
    made: list[Journal] = []
    brokers: list[str] = []
    if request.param == "postgres":
        postgres_or_skip()

    def journal(retention: int = RETENTION) -> Journal:
        if request.param == "sqlite":
            path = str(tmp_path / f"journal{len(made)}.sqlite")
            made.append(SqliteJournal(path, retention=retention))
        elif request.param == "postgres":
            brokers.append(f"contract{uuid.uuid4().hex[:12]}")
            made.append(PostgresJournal(LIBPQ, brokers[-1], retention=retention))
        else:
            made.append(MemoryJournal(retention=retention))
        return made[-1]

    yield journal
    for each in made:
        each.close()
    for broker in brokers:
        drop_journal(LIBPQ, broker)


@pytest.fixture
def journal(make: Make) -> Journal:
    return make()


def _pub(n: int, publisher: str = "p@A") -> Publication:
    return Publication(f"p{n}", {"class": "T", "n": n}, T0, publisher)


def _record(name: str = "d", owner: str = "c@B") -> DurableRecord:
    return DurableRecord(owner, parse_subscription("[class,eq,'T']", id=name))


def _ids(rows: list[tuple[int, Publication, str]]) -> list[tuple[int, str, str]]:
    return [(pos, pub.id, tx) for pos, pub, tx in rows]


def _id(item: Delivered) -> str:
    return item.id if isinstance(item, Publication) else item.subscription


def _listed(entries: list[ExceptionEntry]) -> list[tuple[int, str, str, int, bool]]:
    return [(e.id, e.publication.id, e.error, e.attempts, e.replaying) for e in entries]


# -- each implementation ---------------------------------------------------------------------


def test_a_publication_is_recorded_once_by_publisher_and_id(journal: Journal) -> None:
    assert journal.append("t", _pub(1), 10.0) == (1, True)
    assert journal.append("u", _pub(2), 11.0, tx="p@A:t1") == (2, True)
    assert journal.append("t", _pub(1), 12.0) == (1, False)
    assert journal.append("t", _pub(1, "q@A"), 12.0) == (3, True)
    assert journal.head == 3
    assert journal.recorded("p@A", "p1") and not journal.recorded("p@A", "p9")
    assert journal.committed("p@A:t1") and not journal.committed("p@A:t2")
    assert not journal.committed("")
    rows, lost = journal.since("t", 0, 10, at=12.0)  # accepted at 12.0 or later
    assert (_ids(rows), lost) == ([(3, "p1", "")], False)
    assert _ids(journal.since("t", 0, 10)[0]) == [(1, "p1", ""), (3, "p1", "")]
    assert _ids(journal.since("t", 1, 10)[0]) == [(3, "p1", "")]
    assert _ids(journal.since("u", 0, 10)[0]) == [(2, "p2", "p@A:t1")]
    assert journal.since("t", 0, 1)[0][0][1] == _pub(1)


def test_the_oldest_publications_go_past_the_retention(make: Make) -> None:
    journal = make(retention=300)
    for n in range(1, 1001):
        journal.append("t" if n % 2 else "u", _pub(n), 0.0)
    journal.commit()
    assert not journal.recorded("p@A", "p700") and journal.recorded("p@A", "p701")
    rows, lost = journal.since("t", 2, 3)
    assert ([pos for pos, *_ in rows], lost) == ([701, 703, 705], True)
    assert journal.since("u", 0, 1) == (journal.since("u", 700, 1)[0], False)
    assert journal.append("t", _pub(1), 0.0) == (1001, True)  # forgotten: new again


def test_the_tree_of_an_advertisement_is_remembered_until_forgotten(journal: Journal) -> None:
    assert journal.tree_of("p@A", "a1") is None
    journal.remember_tree("p@A", "a1", "t1")
    journal.remember_tree("p@A", "a2", "t2")
    journal.remember_tree("p@A", "a1", "t3")
    journal.commit()
    assert (journal.tree_of("p@A", "a1"), journal.tree_of("p@A", "a2")) == ("t3", "t2")
    journal.forget_tree("p@A", "a1")
    journal.rollback()
    assert journal.tree_of("p@A", "a1") == "t3"
    journal.forget_tree("p@A", "a1")
    assert journal.tree_of("p@A", "a1") is None


def test_a_schema_is_kept_in_place_of_its_class_one(journal: Journal) -> None:
    first = Schema(class_name="T", attributes=parse_attributes("x:integer"))
    second = Schema(class_name="T", version=2, attributes=parse_attributes("x:integer y:string"))
    other = Schema(class_name="U", attributes=parse_attributes("z:float"))
    journal.save_schema(first)
    journal.save_schema(other)
    journal.commit()
    journal.save_schema(second)
    assert sorted(journal.schemas(), key=str) == sorted([second, other], key=str)
    journal.rollback()
    assert sorted(journal.schemas(), key=str) == sorted([first, other], key=str)


def test_a_durable_record_is_kept_as_saved_and_forgotten_with_its_queue(
    journal: Journal,
) -> None:
    record = _record()
    record.cursors["t"] = 4
    record.priority, record.scope = -12, Scope.LOCAL
    journal.save(record)
    journal.save(_record("e"))
    journal.enqueue(record, 1, _pub(1))
    journal.commit()
    record.acked = 1  # not saved again: the journal keeps the record as it was
    (kept, other) = sorted(journal.durables(), key=lambda r: r.name)
    assert (kept.name, kept.cursors, kept.acked) == ("d", {"t": 4}, 0)
    assert (kept.priority, kept.scope, other.priority, other.scope) == (
        -12,
        Scope.LOCAL,
        0,
        Scope.GLOBAL,
    )
    kept.cursors["t"] = 9  # a record of the caller's own
    assert next(iter(journal.durables())).cursors == {"t": 4}
    journal.save(record)
    assert [r.acked for r in journal.durables() if r.name == "d"] == [1]  # saved, uncommitted
    journal.rollback()
    journal.save(record)
    journal.rollback()
    journal.commit()
    assert [r.acked for r in journal.durables() if r.name == "d"] == [0]  # a crash lost both
    journal.forget(record)
    journal.commit()
    assert [r.name for r in journal.durables()] == ["e"]
    assert journal.backlog(record) == (0, 0) and journal.queued(record, 0, 10) == []


def test_a_durable_queue_reads_in_order_and_drops_from_the_oldest(journal: Journal) -> None:
    record, other = _record(), _record("e")
    tag = ("p@A:t1", Outcome.COMMITTED)
    sizes = {n: journal.enqueue(record, n, _pub(n), tag if n == 3 else None) for n in range(1, 8)}
    journal.enqueue(other, 1, _pub(99))
    assert sizes[1] == len(encode(_pub(1)))
    journal.commit()
    queued = journal.queued(record, 2, 3)
    assert [(seq, _id(item), t, size) for seq, item, t, size in queued] == [
        (3, "p3", tag, sizes[3]),
        (4, "p4", None, sizes[4]),
        (5, "p5", None, sizes[5]),
    ]
    assert journal.backlog(record) == (7, sum(sizes.values()))
    assert (journal.oldest(record, 1), journal.oldest(record, 7), journal.oldest(record, 8)) == (
        1,
        7,
        0,
    )
    assert journal.dequeue(record, 2) == (2, sizes[1] + sizes[2])
    assert journal.dequeue(record, 4, (2, 5)) == (2, 5)  # as the caller knows it
    assert journal.oldest(record, 1) == 5
    assert [seq for seq, *_ in journal.queued(record, 0, 10)] == [5, 6, 7]
    assert journal.backlog(other) == (1, len(encode(_pub(99))))


def test_a_durable_composite_keeps_its_matches_and_its_partial_matches(journal: Journal) -> None:
    """A composite subscription's record, its queued matches, and its partial matches as
    they were written at the last commit (``keep_partial`` writes them then, once)."""
    record = DurableRecord(
        "c@B", parse_composite("{[class,eq,'T']} ; {[class,eq,'U']} within 5s", id="w")
    )
    match = CompositeNotify("w", (_pub(1), _pub(2)), {"X": 3})
    journal.save(record)
    size = journal.enqueue(record, 1, match)
    assert size == len(encode(match))
    states = iter([b"first", b"second", b"third"])
    calls: list[bytes] = []

    def state() -> bytes:
        calls.append(next(states))
        return calls[-1]

    journal.keep_partial(record, state)
    journal.keep_partial(record, state)  # written once, as it is at the commit
    journal.commit()
    assert calls == [b"first"]
    assert journal.partial(record) == b"first"
    (kept,) = journal.durables()
    assert kept.subscription == record.subscription
    assert [(seq, item) for seq, item, _, _ in journal.queued(record, 0, 10)] == [(1, match)]
    journal.keep_partial(record, state)
    journal.rollback()  # a crash: what was not committed is lost, and not written
    assert journal.partial(record) == b"first" and calls == [b"first"]
    journal.keep_partial(record, state)
    assert journal.partial(record) == b"second"  # as it would be written now
    journal.commit()
    assert journal.partial(record) == b"third"
    journal.forget(record)
    journal.commit()
    assert journal.partial(record) is None and list(journal.durables()) == []


def test_a_failed_atomic_write_and_a_rollback_forget_what_was_not_committed(
    journal: Journal,
) -> None:
    record = _record()
    journal.append("t", _pub(1), 0.0)
    journal.enqueue(record, 1, _pub(1))
    journal.commit()
    with pytest.raises(RuntimeError), journal.atomic():
        journal.append("t", _pub(2), 0.0, tx="p@A:t1")
        journal.enqueue(record, 2, _pub(2))
        journal.add_dead_letter("c@B", "d", "f1", _pub(2), "no", 1, 0.0)
        raise RuntimeError("the disk failed")
    assert journal.head == 1 and not journal.committed("p@A:t1")
    assert journal.backlog(record)[0] == 1 and journal.dead_letter_queues() == []
    with journal.atomic():  # kept, but not committed
        journal.append("t", _pub(3), 0.0)
        journal.enqueue(record, 3, _pub(3))
    journal.dequeue(record, 1)
    journal.save_schema(Schema(class_name="T", attributes=parse_attributes("x:integer")))
    assert (journal.head, journal.backlog(record)[0]) == (2, 1)
    journal.rollback()  # a crash
    assert journal.head == 1 and not journal.recorded("p@A", "p3")
    assert [seq for seq, *_ in journal.queued(record, 0, 10)] == [1]
    assert list(journal.schemas()) == []
    assert journal.append("t", _pub(4), 0.0) == (2, True)


def test_a_prepared_part_is_kept_until_settled(journal: Journal) -> None:
    pubs = ((_pub(1, "c@B"), "t"), (_pub(2, "c@B"), "u"))
    part = PreparedPart("c@B", "j1", "p@A:t1", ("B", "C", "A"), pubs)
    other = PreparedPart("c@B", "j2", "p@A:t2", ("B", "A"), ())
    journal.prepare(part)
    journal.prepare(other)
    journal.commit()
    assert sorted(journal.prepared(), key=lambda p: p.tx) == [part, other]
    journal.settle("c@B", "j1")
    journal.rollback()  # a crash: both are as committed
    assert sorted(journal.prepared(), key=lambda p: p.tx) == [part, other]
    with pytest.raises(RuntimeError), journal.atomic():
        journal.settle("c@B", "j2")
        raise RuntimeError("the disk failed")
    with journal.atomic():
        journal.settle("c@B", "j1")
    journal.commit()
    assert list(journal.prepared()) == [other]


def test_dead_letters_are_added_listed_replayed_and_purged(journal: Journal) -> None:
    for n in range(1, 5):
        journal.add_dead_letter("c@B", "d", f"f{n}", _pub(n), f"error {n}", n, float(n))
    journal.add_dead_letter("c@B", "e", "f1", _pub(9), "other", 1, 0.0)
    size = journal.dead_letter_queue("c@B", "d").size
    assert size == sum(len(encode(_pub(n))) + len(f"error {n}") for n in range(1, 5))
    assert journal.has_dead_letter("c@B", "d", "f2")
    assert not journal.has_dead_letter("c@B", "d", "f9")
    listed = journal.dead_letters("c@B", "d", 2, after=1)
    assert _listed(listed) == [(2, "p2", "error 2", 2, False), (3, "p3", "error 3", 3, False)]
    assert [e.id for e in journal.dead_letters("c@B", "d", 10, entries=[4, 1, 9])] == [1, 4]
    assert journal.mark_dead_letters("c@B", "d", [2, 3]) == 2
    assert [e.id for e in journal.dead_letters("c@B", "d", 10, marked=True)] == [2, 3]
    journal.update_dead_letter("c@B", "d", 2, "error again", 7, 9.0)
    journal.update_dead_letter("c@B", "e", 3, "not its queue", 7, 9.0)
    assert _listed(journal.dead_letters("c@B", "d", 10, entries=[2, 3])) == [
        (2, "p2", "error again", 7, False),
        (3, "p3", "error 3", 3, True),
    ]
    queue = journal.dead_letter_queue("c@B", "d")
    grown = len("error again") - len("error 2")
    assert (queue.length, queue.size, queue.replaying, queue.dropped) == (4, size + grown, 1, 0)
    assert journal.trim_dead_letters("c@B", "d", 2, 1 << 20) == [1, 2]
    assert journal.purge_dead_letters("c@B", "d", [4, 9]) == 1
    journal.commit()
    journal.add_dead_letter("c@B", "d", "f5", _pub(5), "error 5", 1, 5.0)
    assert [e.id for e in journal.dead_letters("c@B", "d", 10)] == [3, 6]  # never used twice
    journal.rollback()
    assert [(q.subscription, q.length, q.dropped) for q in journal.dead_letter_queues()] == [
        ("d", 1, 2),
        ("e", 1, 0),
    ]
    assert journal.purge_dead_letters("c@B", "d", []) == 1
    assert journal.trim_dead_letters("c@B", "e", 0, 0) == [5]
    assert [(q.subscription, q.length, q.dropped) for q in journal.dead_letter_queues()] == [
        ("d", 0, 2),
        ("e", 0, 1),
    ]
    assert journal.dead_letter_queue("x@B", "d") == DeadLetterQueue("x@B", "d")


# -- the two side by side ----------------------------------------------------------------------

OWNERS = st.sampled_from(["c@B", "k@B"])
NAMES = st.sampled_from(["d", "e"])
ENTRIES = st.lists(st.integers(1, 12), max_size=3)


def _plain(value: Any) -> Any:
    """An answer with its publications as their encoding, so that answers compare by value."""
    if isinstance(value, Publication):
        return encode(value)
    if isinstance(value, ExceptionEntry):
        publication = encode(value.publication)
        return (value.id, publication, value.error, value.attempts, value.at, value.replaying)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


class SideBySide(RuleBasedStateMachine):
    """Random operations on a ``MemoryJournal``, a ``SqliteJournal`` and, when a server
    answers, a ``PostgresJournal``: the same answers."""

    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.TemporaryDirectory()
        path = str(Path(self.directory.name) / "journal.sqlite")
        self.journals: list[Journal] = [MemoryJournal(), SqliteJournal(path)]
        self.broker = f"alike{uuid.uuid4().hex[:12]}"
        if reachable():
            self.journals.append(PostgresJournal(LIBPQ, self.broker))
        self.seq = 0
        """The number of the last delivery queued (numbers only grow, as a broker's do)."""
        self.refs = 0

    def teardown(self) -> None:
        for journal in self.journals:
            journal.close()
        self.directory.cleanup()
        if reachable():
            drop_journal(LIBPQ, self.broker)

    def both(self, operation: Callable[[Journal], Any]) -> Any:
        memory, *others = (_plain(operation(journal)) for journal in self.journals)
        assert others == [memory] * len(others)
        return memory

    @rule(n=st.integers(1, 20), tree=NAMES, tx=st.sampled_from(["", "x", "y"]), at=st.floats(0, 9))
    def append(self, n: int, tree: str, tx: str, at: float) -> None:
        self.both(lambda j: j.append(tree, _pub(n), at, tx))

    @rule(tree=NAMES, after=st.integers(0, 20), limit=st.integers(1, 5), at=st.floats(0, 9))
    def since(self, tree: str, after: int, limit: int, at: float) -> None:
        self.both(lambda j: j.since(tree, after, limit, at))

    @rule(n=st.integers(1, 20), tx=st.sampled_from(["x", "y", "z"]))
    def recorded(self, n: int, tx: str) -> None:
        self.both(lambda j: (j.recorded("p@A", f"p{n}"), j.committed(tx)))

    @rule(adv=NAMES, tree=NAMES, forget=st.booleans())
    def tree(self, adv: str, tree: str, forget: bool) -> None:
        if forget:
            self.both(lambda j: j.forget_tree("p@A", adv))
        else:
            self.both(lambda j: j.remember_tree("p@A", adv, tree))
        self.both(lambda j: j.tree_of("p@A", adv))

    @rule(owner=OWNERS, name=NAMES, acked=st.integers(0, 5), forget=st.booleans())
    def durable(self, owner: str, name: str, acked: int, forget: bool) -> None:
        record = _record(name, owner)
        record.acked = acked
        record.cursors = {"t": acked}
        if forget:
            self.both(lambda j: j.forget(record))
        else:
            self.both(lambda j: j.save(record))

    @rule(owner=OWNERS, name=NAMES, n=st.integers(1, 20), tagged=st.booleans())
    def enqueue(self, owner: str, name: str, n: int, tagged: bool) -> None:
        self.seq += 1
        tag = ("p@A:t1", Outcome.PENDING) if tagged else None
        self.both(lambda j: j.enqueue(_record(name, owner), self.seq, _pub(n), tag))

    @rule(owner=OWNERS, name=NAMES, upto=st.integers(0, 40))
    def dequeue(self, owner: str, name: str, upto: int) -> None:
        self.both(lambda j: j.dequeue(_record(name, owner), upto))

    @rule(owner=OWNERS, name=NAMES, after=st.integers(0, 40), count=st.integers(1, 6))
    def read(self, owner: str, name: str, after: int, count: int) -> None:
        record = _record(name, owner)
        self.both(lambda j: (j.queued(record, after, count), j.oldest(record, count)))

    @rule(owner=OWNERS, name=NAMES, n=st.integers(1, 20), known=st.booleans())
    def add_dead_letter(self, owner: str, name: str, n: int, known: bool) -> None:
        ref = "f0" if known else f"f{self.refs}"
        self.refs += 1
        if not self.both(lambda j: j.has_dead_letter(owner, name, ref)):
            self.both(lambda j: j.add_dead_letter(owner, name, ref, _pub(n), f"e{n}", n, 1.0))

    @rule(
        owner=OWNERS,
        name=NAMES,
        entry=st.integers(1, 12),
        error=st.text(
            st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=5
        ),
    )
    def update_dead_letter(self, owner: str, name: str, entry: int, error: str) -> None:
        self.both(lambda j: j.update_dead_letter(owner, name, entry, error, 9, 2.0))

    @rule(owner=OWNERS, name=NAMES, entries=st.integers(0, 4), size=st.integers(0, 400))
    def trim(self, owner: str, name: str, entries: int, size: int) -> None:
        self.both(lambda j: j.trim_dead_letters(owner, name, entries, size))

    @rule(owner=OWNERS, name=NAMES, entries=ENTRIES, purge=st.booleans())
    def mark_or_purge(self, owner: str, name: str, entries: list[int], purge: bool) -> None:
        if purge:
            self.both(lambda j: j.purge_dead_letters(owner, name, entries))
        else:
            self.both(lambda j: j.mark_dead_letters(owner, name, entries))

    @rule(
        owner=OWNERS,
        name=NAMES,
        entries=ENTRIES,
        after=st.integers(0, 12),
        marked=st.booleans(),
    )
    def list_dead_letters(
        self, owner: str, name: str, entries: list[int], after: int, marked: bool
    ) -> None:
        self.both(
            lambda j: j.dead_letters(owner, name, 3, entries=entries, after=after, marked=marked)
        )

    @rule()
    def commit(self) -> None:
        self.both(lambda j: j.commit())

    @rule()
    def crash(self) -> None:
        self.both(lambda j: j.rollback())

    @rule(n=st.integers(1, 20), owner=OWNERS, name=NAMES)
    def failed_atomic(self, n: int, owner: str, name: str) -> None:
        self.seq += 1

        def failing(journal: Journal) -> None:
            with pytest.raises(OSError), journal.atomic():
                journal.append("d", _pub(n), 0.0, "x")
                journal.enqueue(_record(name, owner), self.seq, _pub(n))
                journal.dequeue(_record(name, owner), self.seq - 2)
                journal.purge_dead_letters(owner, name, [])
                raise OSError("the disk failed")

        self.both(failing)

    @invariant()
    def the_same(self) -> None:
        self.both(lambda j: j.head)
        self.both(lambda j: sorted((r.owner, r.name, r.acked, r.cursors) for r in j.durables()))
        for owner in ("c@B", "k@B"):
            for name in ("d", "e"):
                self.both(lambda j: j.backlog(_record(name, owner)))  # noqa: B023
        self.both(lambda j: j.dead_letter_queues())


SideBySide.TestCase.settings = settings(
    max_examples=scaled(40), stateful_step_count=40, deadline=None
)
test_the_journals_answer_alike = SideBySide.TestCase
