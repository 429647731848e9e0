"""The SQLite journal's durable queues, against a plain list of what should be queued; its runs
on disk."""

from __future__ import annotations

import sqlite3
import tempfile
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from padres.broker.journal import DurableRecord, Journal, Tag
from padres.broker.sqlite_journal import SqliteJournal
from padres.language.parser import parse_subscription
from padres.model.codec import encode
from padres.model.messages import Publication
from padres.model.protocol import Outcome, Scope

T0 = datetime(2026, 1, 1, tzinfo=UTC)
Queued = tuple[int, str, Tag | None, int]
"""A delivery as queued: number, publication id, tag, bytes."""


def _record(name: str = "d") -> DurableRecord:
    return DurableRecord("c@B", parse_subscription("[class,eq,'T']", id=name))


def _publication(n: int) -> Publication:
    return Publication(f"p{n}", {"class": "T", "n": n, "pad": "x" * (n % 7)}, T0)


def _queued(journal: Journal, record: DurableRecord, after: int, limit: int) -> list[Queued]:
    out: list[Queued] = []
    for seq, item, tag, size in journal.queued(record, after, limit):
        assert isinstance(item, Publication), item  # plain durable subscriptions queue these
        out.append((seq, item.id, tag, size))
    return out


class DurableQueue(RuleBasedStateMachine):
    """Deliveries queued in frames (each a commit, or not yet), acknowledged up to any number,
    read from any number, the broker crashing (what was not committed is lost) or restarting;
    the journal always holds what the list says."""

    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.TemporaryDirectory()
        self.path = str(Path(self.directory.name) / "journal.sqlite")
        self.journal = SqliteJournal(self.path)
        self.record = _record()
        self.other = _record("e")  # a second subscription, which nothing here may touch
        self.others = [(1, "p0", None, self.journal.enqueue(self.other, 1, _publication(0)))]
        self.journal.commit()
        self.queue: list[Queued] = []
        self.committed: list[Queued] = []
        self.next = 1
        """The number of the next delivery (the broker keeps it in the journal too)."""
        self.committed_next = 1

    def teardown(self) -> None:
        assert _queued(self.journal, self.other, 0, 10) == self.others
        self.journal.close()
        self.directory.cleanup()

    @rule(count=st.integers(1, 40), tagged=st.sampled_from([0, 1, 3]), commit=st.booleans())
    def frame(self, count: int, tagged: int, commit: bool) -> None:
        for _ in range(count):
            seq = self.next
            self.next += 1
            tag = (f"c@B:t{seq}", Outcome.PENDING) if tagged and seq % tagged == 0 else None
            size = self.journal.enqueue(self.record, seq, _publication(seq), tag)
            self.queue.append((seq, f"p{seq}", tag, size))
        if commit:
            self.commit()

    @rule()
    def commit(self) -> None:
        self.journal.commit()
        self.committed = list(self.queue)
        self.committed_next = self.next

    @rule(data=st.data(), tell=st.booleans())
    def acknowledge(self, data: st.DataObject, tell: bool) -> None:
        count = data.draw(st.integers(0, len(self.queue)))
        upto = self.queue[count - 1][0] if count else self.next - 1 - len(self.queue)
        gone = (count, sum(size for *_, size in self.queue[:count]))
        assert self.journal.dequeue(self.record, upto, gone if tell else None) == gone
        del self.queue[:count]

    @rule(data=st.data(), limit=st.integers(1, 60))
    def read(self, data: st.DataObject, limit: int) -> None:
        start = self.next - 1 - len(self.queue)
        after = data.draw(st.integers(start, self.next))
        expected = [q for q in self.queue if q[0] > after][:limit]
        assert _queued(self.journal, self.record, after, limit) == expected

    @rule(count=st.integers(1, 80))
    def oldest(self, count: int) -> None:
        expected = self.queue[count - 1][0] if count <= len(self.queue) else 0
        assert self.journal.oldest(self.record, count) == expected

    @rule()
    def crash(self) -> None:
        self.journal.rollback()
        self.queue = list(self.committed)
        self.next = self.committed_next

    @precondition(lambda self: len(self.committed) == len(self.queue))
    @rule()
    def restart(self) -> None:
        self.commit()  # nothing queued is pending (precondition), but acknowledgements may be
        self.journal.close()
        self.journal = SqliteJournal(self.path)

    @invariant()
    def backlog(self) -> None:
        expected = (len(self.queue), sum(size for *_, size in self.queue))
        assert self.journal.backlog(self.record) == expected


DurableQueue.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_a_durable_queue_holds_what_was_queued_and_not_acknowledged = DurableQueue.TestCase


def _runs(path: str) -> list[tuple[int, int]]:
    """The runs on disk: (first, last)."""
    with closing(sqlite3.connect(path)) as db:
        return db.execute("SELECT first, last FROM runs ORDER BY first").fetchall()


def test_a_frame_of_deliveries_is_one_row(tmp_path: Path) -> None:
    path = str(tmp_path / "journal.sqlite")
    journal = SqliteJournal(path)
    record = _record()
    for seq in range(1, 501):
        journal.enqueue(record, seq, _publication(seq))
    journal.commit()
    assert _runs(path) == [(1, 500)]
    journal.dequeue(record, 200)  # acknowledged partly: what is left of the run stays
    journal.commit()
    assert _runs(path) == [(201, 500)]
    journal.close()


def test_a_run_is_bounded_in_deliveries_and_bytes(tmp_path: Path) -> None:
    path = str(tmp_path / "journal.sqlite")
    journal = SqliteJournal(path)
    record = _record()
    for seq in range(1, 2501):
        journal.enqueue(record, seq, _publication(seq))
    big = Publication("b", {"class": "T", "text": "x" * 100_000}, T0)
    for seq in range(2501, 2506):
        journal.enqueue(record, seq, big)
    journal.commit()
    # 2502 crosses the 256 KiB: it is the last of its run
    assert _runs(path) == [(1, 1000), (1001, 2000), (2001, 2502), (2503, 2505)]
    assert journal.backlog(record)[0] == 2505
    journal.close()


def test_what_a_crash_loses_of_a_subscription_is_forgotten(tmp_path: Path) -> None:
    journal = SqliteJournal(str(tmp_path / "journal.sqlite"))
    record = _record()
    journal.save(record)
    journal.commit()
    record.acked = 3  # saved, not committed: a crash loses it
    journal.save(record)
    journal.rollback()
    assert [r.acked for r in journal.durables()] == [0]
    journal.close()


def test_a_journal_written_before_priority_and_scope_reads_their_defaults(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "journal.sqlite")
    journal = SqliteJournal(path)
    journal.save(_record())
    journal.commit()
    journal.close()
    with closing(sqlite3.connect(path)) as db, db:  # the table as journals kept it before
        db.execute("ALTER TABLE durables DROP COLUMN priority")
        db.execute("ALTER TABLE durables DROP COLUMN scope")
    journal = SqliteJournal(path)
    (record,) = journal.durables()
    assert (record.name, record.priority, record.scope) == ("d", 0, Scope.GLOBAL)
    record.priority, record.scope = 7, Scope.LOCAL
    journal.save(record)
    journal.commit()
    assert [(r.priority, r.scope) for r in journal.durables()] == [(7, Scope.LOCAL)]
    journal.close()


def test_a_queue_written_one_row_per_delivery_is_taken_as_runs(tmp_path: Path) -> None:
    path = str(tmp_path / "journal.sqlite")
    SqliteJournal(path).close()
    record = _record()
    other = _record("e")
    tag = ("c@B:t1", Outcome.COMMITTED)
    rows = [(record, seq, _publication(seq), tag if seq == 3 else None) for seq in range(2, 1500)]
    rows += [(other, 7, _publication(7), None)]
    with closing(sqlite3.connect(path)) as db, db:  # the queue as journals kept it before runs
        db.execute("DROP TABLE runs")
        db.execute(
            "CREATE TABLE queue (owner TEXT NOT NULL, name TEXT NOT NULL, seq INTEGER NOT NULL, "
            "size INTEGER NOT NULL, body BLOB NOT NULL, tx TEXT NOT NULL DEFAULT '', "
            "outcome TEXT NOT NULL DEFAULT '', PRIMARY KEY (owner, name, seq)) WITHOUT ROWID"
        )
        for r, seq, pub, t in rows:
            body = encode(pub)
            tx, outcome = t or ("", "")
            db.execute(
                "INSERT INTO queue VALUES (?, ?, ?, ?, ?, ?, ?)",
                (r.owner, r.name, seq, len(body), body, tx, outcome),
            )
    journal = SqliteJournal(path)
    expected = [(seq, pub.id, t, len(encode(pub))) for _, seq, pub, t in rows]
    assert _queued(journal, record, 0, 2000) == expected[:-1]
    assert _queued(journal, other, 0, 10) == expected[-1:]
    assert journal.backlog(record) == (1498, sum(q[3] for q in expected[:-1]))
    with closing(sqlite3.connect(path)) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
        assert "queue" not in tables
        assert db.execute("SELECT count(*) FROM runs").fetchone() == (3,)
    journal.close()
