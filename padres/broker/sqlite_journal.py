"""The journal in SQLite (WAL mode): what a broker keeps on disk across crashes and restarts.

See ``padres.broker.journal`` for what a journal holds and promises; this is how SQLite keeps
it. Guaranteed publications are the rows of ``log``, the trees of local advertisements those
of ``trees``, durable subscriptions those of ``durables``, schemas those of ``schemas``, and
exception queues the entries of ``exceptions`` with, per queue, how many were dropped in
``exception_queues``.

A durable subscription's queue is kept as *runs*: the consecutive deliveries queued for it
between two commits are one row (``runs``), their bodies side by side, so that a frame that
queues hundreds of deliveries writes one row rather than hundreds. A run partly acknowledged is
cut down to what is left, so the table holds exactly what is queued.

``sync`` is SQLite's ``synchronous`` setting: ``full`` (the default) survives a power failure
as well as a crash; ``normal`` survives a crash of the process (the operating system still has
the data) but may lose the last commits at a power failure; ``off`` leaves it to the operating
system. ``SqliteJournal()`` without a path keeps everything in memory; ``SqliteJournal("")`` in
a temporary file that goes when it is closed (its rollback journal in memory: the file does not
outlive the process, so nothing on disk needs to survive a crash), which bounds the memory a
long queue takes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final, TypeAlias

import msgspec
import orjson

from padres.broker.journal import (
    RETENTION,
    TREES_KEPT,
    DeadLetterQueue,
    DurableRecord,
    Journal,
    Logged,
    Queued,
    Tag,
    dead_letter_size,
)
from padres.errors import JournalError
from padres.model.classes import Schema
from padres.model.codec import decode, encode, from_dict, to_dict
from padres.model.messages import Publication, Subscription
from padres.model.protocol import ExceptionEntry, Outcome, Visibility

__all__ = ["SqliteJournal", "Sync"]

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS log (
    pos INTEGER PRIMARY KEY, tree TEXT NOT NULL, publisher TEXT NOT NULL, id TEXT NOT NULL,
    at REAL NOT NULL, body BLOB NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS log_publication ON log (publisher, id);
CREATE INDEX IF NOT EXISTS log_tree ON log (tree, pos);
CREATE TABLE IF NOT EXISTS trees (
    publisher TEXT NOT NULL, advertisement TEXT NOT NULL, tree TEXT NOT NULL,
    PRIMARY KEY (publisher, advertisement));
CREATE TABLE IF NOT EXISTS durables (
    owner TEXT NOT NULL, name TEXT NOT NULL, subscription BLOB NOT NULL, cursors BLOB NOT NULL,
    next INTEGER NOT NULL, acked INTEGER NOT NULL, discarded INTEGER NOT NULL,
    created REAL NOT NULL, PRIMARY KEY (owner, name));
CREATE TABLE IF NOT EXISTS runs (
    owner TEXT NOT NULL, name TEXT NOT NULL, first INTEGER NOT NULL, last INTEGER NOT NULL,
    size INTEGER NOT NULL, sizes BLOB NOT NULL, bodies BLOB NOT NULL, tags BLOB,
    PRIMARY KEY (owner, name, first)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS schemas (class TEXT PRIMARY KEY, body BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS exceptions (
    entry INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT NOT NULL, subscription TEXT NOT NULL,
    ref TEXT NOT NULL, body BLOB NOT NULL, error TEXT NOT NULL, attempts INTEGER NOT NULL,
    at REAL NOT NULL, size INTEGER NOT NULL, replay INTEGER NOT NULL DEFAULT 0);
CREATE UNIQUE INDEX IF NOT EXISTS exceptions_ref ON exceptions (owner, subscription, ref);
CREATE TABLE IF NOT EXISTS exception_queues (
    owner TEXT NOT NULL, subscription TEXT NOT NULL, dropped INTEGER NOT NULL,
    PRIMARY KEY (owner, subscription));
"""
_COLUMNS: Final = (
    ("log", "tx", "TEXT NOT NULL DEFAULT ''"),
    ("durables", "visibility", "TEXT NOT NULL DEFAULT 'on_commit'"),
    ("durables", "producers", "BLOB NOT NULL DEFAULT '{}'"),
)
"""Columns added since the first schema: a journal written before gets them when opened."""
_RUN_DELIVERIES: Final = 1_000
_RUN_BYTES: Final = 256 << 10
"""A run holds at most ``_RUN_DELIVERIES`` deliveries and about ``_RUN_BYTES`` bytes (the
delivery that crosses the bound is its last): acknowledging part of a run rewrites at most
that much, and reading one reads no more."""
_INSERT_RUN: Final = (
    "INSERT INTO runs (owner, name, first, last, size, sizes, bodies, tags) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_QUEUE: Final = "owner = ? AND subscription = ?"
"""The condition selecting one exception queue's entries."""


class Sync(StrEnum):
    """When SQLite waits for the disk (its ``synchronous`` setting); see the module docstring."""

    FULL = "full"
    NORMAL = "normal"
    OFF = "off"


def _body(pub: Publication) -> bytes:
    return encode(pub)


def _publication(body: bytes) -> Publication:
    message = decode(body, checked=True)  # what this broker accepted and wrote
    if not isinstance(message, Publication):
        raise JournalError("the journal holds something other than a publication")
    return message


def _entry_publication(body: bytes) -> Publication:
    """The publication of an exception entry (kept as ``to_dict`` makes it)."""
    message = from_dict(orjson.loads(body))
    if not isinstance(message, Publication):
        raise JournalError("an exception queue holds something other than a publication")
    return message


def _among(entries: Sequence[int]) -> tuple[str, tuple[int, ...]]:
    """The condition selecting ``entries`` (any entry when empty), and its arguments."""
    if not entries:
        return "", ()
    return f" AND entry IN ({','.join('?' * len(entries))})", tuple(entries)


_RunRow: TypeAlias = tuple[str, str, int, int, int, bytes, bytes, bytes | None]


@dataclass
class _Run:
    """Consecutive deliveries queued for one durable subscription, numbered from ``first``:
    a row of the journal's ``runs``."""

    first: int
    sizes: list[int] = field(default_factory=list)
    bodies: bytearray = field(default_factory=bytearray)
    """Their encoded publications, one after the other."""
    tags: list[Tag | None] | None = None
    """Per delivery, its tag; None where none has one."""

    @classmethod
    def read(cls, first: int, sizes: bytes, bodies: bytes, tags: bytes | None) -> _Run:
        """The run of a row."""
        lengths: list[int] = orjson.loads(sizes)
        if tags is None:
            return cls(first, lengths, bytearray(bodies))
        tagged = [None if t is None else (t[0], Outcome(t[1])) for t in orjson.loads(tags)]
        return cls(first, lengths, bytearray(bodies), tagged)

    def row(self, owner: str, name: str) -> _RunRow:
        return (
            owner,
            name,
            self.first,
            self.first + len(self.sizes) - 1,
            len(self.bodies),
            orjson.dumps(self.sizes),
            bytes(self.bodies),
            None if self.tags is None else orjson.dumps(self.tags),
        )

    def takes(self, seq: int) -> bool:
        """Whether delivery ``seq`` may join the run: it comes next, and the run has room."""
        return (
            seq == self.first + len(self.sizes)
            and len(self.sizes) < _RUN_DELIVERIES
            and len(self.bodies) < _RUN_BYTES
        )

    def add(self, body: bytes, tag: Tag | None) -> None:
        if tag is not None and self.tags is None:
            self.tags = [None] * len(self.sizes)
        if self.tags is not None:
            self.tags.append(tag)
        self.sizes.append(len(body))
        self.bodies += body

    def deliveries(self, after: int, limit: int) -> list[Queued]:
        """Up to ``limit`` of its deliveries after number ``after``."""
        skip = max(0, after - self.first + 1)
        offset = sum(self.sizes[:skip])
        found = []
        for i, size in enumerate(self.sizes[skip : skip + limit], skip):
            pub = _publication(bytes(self.bodies[offset : offset + size]))
            found.append((self.first + i, pub, None if self.tags is None else self.tags[i], size))
            offset += size
        return found

    def cut(self, upto: int) -> tuple[int, int]:
        """Drop its deliveries up to number ``upto``; returns how many, and their bytes."""
        count = upto - self.first + 1
        size = sum(self.sizes[:count])
        del self.sizes[:count], self.bodies[:size]
        if self.tags is not None:
            del self.tags[:count]
            if not any(self.tags):
                self.tags = None
        self.first = upto + 1
        return count, size


class SqliteJournal(Journal):
    """See the module docstring."""

    def __init__(
        self, path: str = ":memory:", *, sync: Sync = Sync.FULL, retention: int = RETENTION
    ) -> None:
        """``retention``: guaranteed publications kept (``RETENTION``)."""
        self.path = path
        self.retention = retention
        try:
            self._db = sqlite3.connect(path, isolation_level="DEFERRED", check_same_thread=False)
            if path == "":  # see the module docstring
                self._db.execute("PRAGMA journal_mode=MEMORY")
            elif path != ":memory:":
                self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={sync.value.upper()}")
            self._db.executescript(_SCHEMA)
            for table, column, declaration in _COLUMNS:
                found = self._db.execute(f"PRAGMA table_info({table})").fetchall()
                if column not in {row[1] for row in found}:
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
            self._db.execute("CREATE INDEX IF NOT EXISTS log_tx ON log (tx) WHERE tx != ''")
            self._take_old_queue()
            row = self._db.execute("SELECT max(pos) FROM log").fetchone()
        except sqlite3.Error as exc:
            raise JournalError(f"cannot open the journal {path}: {exc}") from exc
        self.head: int = row[0] or 0
        """The position of the last guaranteed publication accepted."""
        self._unsaved: dict[tuple[str, str], DurableRecord] = {}
        """Durable subscriptions changed since the last commit (``save``)."""
        self._enqueued: dict[tuple[str, str], _Run] = {}
        """Per durable subscription, the deliveries queued and not yet inserted (``enqueue``):
        inserted together, before the next commit or read of the queue."""

    def _take_old_queue(self) -> None:
        """A journal written before runs holds its durable subscriptions' queues one row per
        delivery (table ``queue``): they become runs, and the table goes."""
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(queue)")}
        if not columns:
            return
        tags = "tx, outcome" if "tx" in columns else "'', ''"
        rows = self._db.execute(  # a row at a time: the queue may be larger than memory
            f"SELECT owner, name, seq, body, {tags} FROM queue ORDER BY owner, name, seq"
        )
        key: tuple[str, str] | None = None
        run = _Run(0)
        for owner, name, seq, body, tx, outcome in rows:
            if (owner, name) != key or not run.takes(seq):
                if key is not None:
                    self._db.execute(_INSERT_RUN, run.row(*key))
                key, run = (owner, name), _Run(seq)
            run.add(body, (tx, Outcome(outcome)) if tx else None)
        if key is not None:
            self._db.execute(_INSERT_RUN, run.row(*key))
        self._db.execute("DROP TABLE queue")
        self._db.commit()

    def close(self) -> None:
        self._db.close()

    def commit(self) -> None:
        try:
            self._write_enqueued()
            self._write_unsaved()
            self._db.commit()
        except sqlite3.Error as exc:
            raise JournalError(f"cannot commit the journal {self.path}: {exc}") from exc

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """A savepoint. A savepoint opened outside a transaction would commit on release, so
        one is begun first."""
        head = self.head
        self._write_enqueued()
        if not self._db.in_transaction:
            self._db.execute("BEGIN")
        self._db.execute("SAVEPOINT atomic")
        try:
            yield
            self._write_enqueued()
        except BaseException:
            self._enqueued.clear()
            self._db.execute("ROLLBACK TO atomic")
            self._db.execute("RELEASE atomic")
            self.head = head
            raise
        self._db.execute("RELEASE atomic")

    def rollback(self) -> None:
        self._enqueued.clear()
        self._unsaved.clear()
        self._db.rollback()
        row = self._db.execute("SELECT max(pos) FROM log").fetchone()
        self.head = row[0] or 0

    # -- guaranteed publications -------------------------------------------------------------

    def append(self, tree: str, pub: Publication, at: float, tx: str = "") -> tuple[int, bool]:
        found = self._db.execute(
            "SELECT pos FROM log WHERE publisher = ? AND id = ?", (pub.publisher, pub.id)
        ).fetchone()
        if found is not None:
            return found[0], False
        self.head += 1
        self._db.execute(
            "INSERT INTO log (pos, tree, publisher, id, at, body, tx) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (self.head, tree, pub.publisher, pub.id, at, _body(pub), tx),
        )
        if self.head % 1000 == 0 and self.head > self.retention:
            self._db.execute("DELETE FROM log WHERE pos <= ?", (self.head - self.retention,))
        return self.head, True

    def recorded(self, publisher: str, pub_id: str) -> bool:
        found = self._db.execute(
            "SELECT 1 FROM log WHERE publisher = ? AND id = ?", (publisher, pub_id)
        )
        return found.fetchone() is not None

    def committed(self, tx: str) -> bool:
        found = self._db.execute("SELECT 1 FROM log WHERE tx = ? AND tx != '' LIMIT 1", (tx,))
        return found.fetchone() is not None

    def since(
        self, tree: str, after: int, limit: int, at: float = 0.0
    ) -> tuple[list[Logged], bool]:
        rows = self._db.execute(
            "SELECT pos, body, tx FROM log WHERE tree = ? AND pos > ? AND at >= ? "
            "ORDER BY pos LIMIT ?",
            (tree, after, at, limit),
        ).fetchall()
        oldest = self._db.execute("SELECT min(pos) FROM log").fetchone()[0]
        lost = after > 0 and oldest is not None and oldest > after + 1
        return [(pos, _publication(body), tx) for pos, body, tx in rows], lost

    def tree_of(self, publisher: str, advertisement: str) -> str | None:
        row = self._db.execute(
            "SELECT tree FROM trees WHERE publisher = ? AND advertisement = ?",
            (publisher, advertisement),
        ).fetchone()
        return None if row is None else str(row[0])

    def remember_tree(self, publisher: str, advertisement: str, tree: str) -> None:
        cursor = self._db.execute(
            "INSERT OR REPLACE INTO trees (publisher, advertisement, tree) VALUES (?, ?, ?)",
            (publisher, advertisement, tree),
        )
        rowid = cursor.lastrowid or 0
        if rowid % 1000 == 0 and rowid > TREES_KEPT:
            self._db.execute("DELETE FROM trees WHERE rowid <= ?", (rowid - TREES_KEPT,))

    def forget_tree(self, publisher: str, advertisement: str) -> None:
        self._db.execute(
            "DELETE FROM trees WHERE publisher = ? AND advertisement = ?",
            (publisher, advertisement),
        )

    # -- schemas -----------------------------------------------------------------------------

    def schemas(self) -> Iterator[Schema]:
        for (body,) in self._db.execute("SELECT body FROM schemas").fetchall():
            try:
                yield msgspec.json.decode(body, type=Schema)
            except msgspec.DecodeError as exc:
                raise JournalError(f"the journal holds a schema it cannot read: {exc}") from exc

    def save_schema(self, schema: Schema) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO schemas (class, body) VALUES (?, ?)",
            (schema.class_name, msgspec.json.encode(schema)),
        )

    # -- durable subscriptions ---------------------------------------------------------------

    def durables(self) -> Iterator[DurableRecord]:
        self._write_unsaved()
        rows = self._db.execute(
            "SELECT owner, subscription, cursors, next, acked, discarded, created, visibility, "
            "producers FROM durables"
        ).fetchall()
        for owner, sub, cursors, nxt, acked, discarded, created, visibility, producers in rows:
            subscription = decode(sub)
            if not isinstance(subscription, Subscription):
                raise JournalError("the journal holds a durable subscription it cannot read")
            yield DurableRecord(
                owner,
                subscription,
                orjson.loads(cursors),
                nxt,
                acked,
                discarded,
                created,
                Visibility(visibility),
                orjson.loads(producers),
            )

    def save(self, record: DurableRecord) -> None:
        self._unsaved[record.owner, record.name] = record

    def _write_unsaved(self) -> None:
        if not self._unsaved:
            return
        rows = [
            (
                record.owner,
                record.name,
                encode(record.subscription),
                orjson.dumps(record.cursors),
                record.next,
                record.acked,
                record.discarded,
                record.created,
                record.visibility.value,
                orjson.dumps(record.producers),
            )
            for record in self._unsaved.values()
        ]
        self._unsaved.clear()
        self._db.executemany(
            "INSERT OR REPLACE INTO durables "
            "(owner, name, subscription, cursors, next, acked, discarded, created, visibility, "
            "producers) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )

    def forget(self, record: DurableRecord) -> None:
        self._write_enqueued()
        key = (record.owner, record.name)
        self._unsaved.pop(key, None)
        self._db.execute("DELETE FROM durables WHERE owner = ? AND name = ?", key)
        self._db.execute("DELETE FROM runs WHERE owner = ? AND name = ?", key)

    def enqueue(
        self, record: DurableRecord, seq: int, pub: Publication, tag: Tag | None = None
    ) -> int:
        """It is inserted with the others queued before the next commit or read."""
        body = _body(pub)
        key = (record.owner, record.name)
        run = self._enqueued.get(key)
        if run is None or not run.takes(seq):
            if run is not None:
                self._write_enqueued()
            run = self._enqueued[key] = _Run(seq)
        run.add(body, tag)
        return len(body)

    def _write_enqueued(self) -> None:
        """Insert the deliveries queued so far, a run per durable subscription: all of them,
        or, on an error, none (they stay queued for the next attempt)."""
        if not self._enqueued:
            return
        rows = [run.row(owner, name) for (owner, name), run in self._enqueued.items()]
        if not self._db.in_transaction:
            self._db.execute("BEGIN")
        self._db.execute("SAVEPOINT enqueued")
        try:
            self._db.executemany(_INSERT_RUN, rows)
        except BaseException:
            self._db.execute("ROLLBACK TO enqueued")
            self._db.execute("RELEASE enqueued")
            raise
        self._db.execute("RELEASE enqueued")
        self._enqueued.clear()

    def queued(self, record: DurableRecord, after: int, limit: int) -> list[Queued]:
        self._write_enqueued()
        cursor = self._db.execute(
            "SELECT first, sizes, bodies, tags FROM runs "
            "WHERE owner = ? AND name = ? AND last > ? ORDER BY first",
            (record.owner, record.name, after),
        )
        found: list[Queued] = []
        try:
            for first, sizes, bodies, tags in cursor:
                run = _Run.read(first, sizes, bodies, tags)
                found += run.deliveries(after, limit - len(found))
                if len(found) >= limit:
                    break
        finally:
            cursor.close()
        return found

    def backlog(self, record: DurableRecord) -> tuple[int, int]:
        self._write_enqueued()
        row = self._db.execute(
            "SELECT coalesce(sum(last - first + 1), 0), coalesce(sum(size), 0) FROM runs "
            "WHERE owner = ? AND name = ?",
            (record.owner, record.name),
        ).fetchone()
        return int(row[0]), int(row[1])

    def dequeue(
        self, record: DurableRecord, upto: int, known: tuple[int, int] | None = None
    ) -> tuple[int, int]:
        self._write_enqueued()
        key = (record.owner, record.name, upto)
        count = size = 0
        if known is None:
            row = self._db.execute(
                "SELECT coalesce(sum(last - first + 1), 0), coalesce(sum(size), 0) FROM runs "
                "WHERE owner = ? AND name = ? AND last <= ?",
                key,
            ).fetchone()
            count, size = int(row[0]), int(row[1])
        self._db.execute("DELETE FROM runs WHERE owner = ? AND name = ? AND last <= ?", key)
        row = self._db.execute(  # the run ``upto`` falls in, if any: what is left of it stays
            "SELECT first, sizes, bodies, tags FROM runs "
            "WHERE owner = ? AND name = ? AND first <= ?",
            key,
        ).fetchone()
        if row is not None:
            run = _Run.read(*row)
            cut, cut_size = run.cut(upto)
            count += cut
            size += cut_size
            self._db.execute(
                "DELETE FROM runs WHERE owner = ? AND name = ? AND first = ?",
                (record.owner, record.name, row[0]),
            )
            self._db.execute(_INSERT_RUN, run.row(record.owner, record.name))
        return known if known is not None else (count, size)

    def oldest(self, record: DurableRecord, count: int) -> int:
        self._write_enqueued()
        cursor = self._db.execute(
            "SELECT first, last FROM runs WHERE owner = ? AND name = ? ORDER BY first",
            (record.owner, record.name),
        )
        try:
            for first, last in cursor:
                if count <= last - first + 1:
                    return int(first) + count - 1
                count -= last - first + 1
        finally:
            cursor.close()
        return 0

    # -- exception (dead-letter) queues ------------------------------------------------------

    def add_dead_letter(
        self,
        owner: str,
        subscription: str,
        ref: str,
        publication: Publication,
        error: str,
        attempts: int,
        at: float,
    ) -> None:
        body = orjson.dumps(to_dict(publication))
        size = dead_letter_size(publication, error)
        self._db.execute(
            "INSERT INTO exceptions (owner, subscription, ref, body, error, attempts, at, size) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (owner, subscription, ref, body, error, attempts, at, size),
        )

    def has_dead_letter(self, owner: str, subscription: str, ref: str) -> bool:
        found = self._db.execute(
            f"SELECT 1 FROM exceptions WHERE {_QUEUE} AND ref = ?", (owner, subscription, ref)
        )
        return found.fetchone() is not None

    def update_dead_letter(
        self, owner: str, subscription: str, entry: int, error: str, attempts: int, at: float
    ) -> None:
        self._db.execute(
            "UPDATE exceptions SET error = ?, attempts = ?, at = ?, replay = 0, "
            "size = size - length(CAST(error AS BLOB)) + ? "
            f"WHERE entry = ? AND {_QUEUE}",
            (error, attempts, at, len(error.encode()), entry, owner, subscription),
        )

    def trim_dead_letters(
        self, owner: str, subscription: str, max_entries: int, max_bytes: int
    ) -> list[int]:
        key = (owner, subscription)
        row = self._db.execute(
            f"SELECT count(*), coalesce(sum(size), 0) FROM exceptions WHERE {_QUEUE}", key
        ).fetchone()
        length, size = int(row[0]), int(row[1])
        dropped: list[int] = []
        while length > max_entries or size > max_bytes:
            entry, bytes_ = self._db.execute(
                f"SELECT entry, size FROM exceptions WHERE {_QUEUE} ORDER BY entry LIMIT 1", key
            ).fetchone()
            self._db.execute("DELETE FROM exceptions WHERE entry = ?", (entry,))
            dropped.append(entry)
            length, size = length - 1, size - bytes_
        if dropped:
            self._db.execute(
                "INSERT INTO exception_queues (owner, subscription, dropped) VALUES (?, ?, ?) "
                "ON CONFLICT (owner, subscription) DO UPDATE SET dropped = dropped + ?",
                (*key, len(dropped), len(dropped)),
            )
        return dropped

    def dead_letters(
        self,
        owner: str,
        subscription: str,
        limit: int,
        *,
        entries: Sequence[int] = (),
        after: int = 0,
        marked: bool = False,
    ) -> list[ExceptionEntry]:
        among, args = _among(entries)
        rows = self._db.execute(
            "SELECT entry, body, error, attempts, at, replay FROM exceptions "
            f"WHERE {_QUEUE}{among}{' AND replay = 1' if marked else ''} AND entry > ? "
            "ORDER BY entry LIMIT ?",
            (owner, subscription, *args, after, limit),
        ).fetchall()
        return [
            ExceptionEntry(
                id=entry,
                publication=_entry_publication(body),
                error=error,
                attempts=attempts,
                at=at,
                replaying=bool(replay),
            )
            for entry, body, error, attempts, at, replay in rows
        ]

    def mark_dead_letters(self, owner: str, subscription: str, entries: Sequence[int]) -> int:
        among, args = _among(entries)
        cursor = self._db.execute(
            f"UPDATE exceptions SET replay = 1 WHERE {_QUEUE}{among}", (owner, subscription, *args)
        )
        return cursor.rowcount

    def purge_dead_letters(self, owner: str, subscription: str, entries: Sequence[int]) -> int:
        among, args = _among(entries)
        cursor = self._db.execute(
            f"DELETE FROM exceptions WHERE {_QUEUE}{among}", (owner, subscription, *args)
        )
        return cursor.rowcount

    def dead_letter_queue(self, owner: str, subscription: str) -> DeadLetterQueue:
        key = (owner, subscription)
        length, size, replaying = self._db.execute(
            "SELECT count(*), coalesce(sum(size), 0), coalesce(sum(replay), 0) "
            f"FROM exceptions WHERE {_QUEUE}",
            key,
        ).fetchone()
        row = self._db.execute(
            f"SELECT dropped FROM exception_queues WHERE {_QUEUE}", key
        ).fetchone()
        dropped = 0 if row is None else int(row[0])
        return DeadLetterQueue(owner, subscription, length, size, replaying, dropped)

    def dead_letter_queues(self) -> list[DeadLetterQueue]:
        rows = self._db.execute(
            "SELECT e.owner, e.subscription, count(e.entry), coalesce(sum(e.size), 0), "
            "coalesce(sum(e.replay), 0), coalesce(max(q.dropped), 0) "
            "FROM exceptions e LEFT JOIN exception_queues q "
            "ON q.owner = e.owner AND q.subscription = e.subscription "
            "GROUP BY e.owner, e.subscription "
            "UNION ALL SELECT q.owner, q.subscription, 0, 0, 0, q.dropped "
            "FROM exception_queues q WHERE NOT EXISTS (SELECT 1 FROM exceptions e "
            "WHERE e.owner = q.owner AND e.subscription = q.subscription) "
            "ORDER BY 1, 2"
        ).fetchall()
        return [DeadLetterQueue(*row) for row in rows]
