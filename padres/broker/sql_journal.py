"""What the journals in SQL databases share: the tables' use, the statements, the queue as runs.

``padres.broker.sqlite_journal`` (SQLite) and ``padres.broker.postgres_journal`` (PostgreSQL)
each open their database, make its tables and say how it differs (``SqlJournal``'s class
attributes, ``_begin`` and ``_next_entry``); everything else is here, in SQL both understand,
written with ``?`` parameters. See ``padres.broker.journal`` for what a journal holds and promises.

Guaranteed publications are the rows of ``log``, the trees of local advertisements those of
``trees``, durable subscriptions those of ``durables`` (the partial matches of the composite
ones those of ``partials``), schemas those of ``schemas``, and exception queues the entries of
``exceptions`` with, per queue, how many were dropped in ``exception_queues``, and prepared
parts those of ``parts``.

A durable subscription's queue is kept as *runs*: the consecutive deliveries queued for it
between two commits are one row (``runs``), their bodies side by side, so that a frame that
queues hundreds of deliveries writes one row rather than hundreds. A run partly acknowledged is
cut down to what is left, so the table holds exactly what is queued.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Protocol, TypeAlias

import msgspec
import orjson

from padres.broker.journal import (
    RETENTION,
    TREES_KEPT,
    DeadLetterQueue,
    Delivered,
    DurableRecord,
    Journal,
    Logged,
    PreparedPart,
    Queued,
    Tag,
    dead_letter_size,
)
from padres.errors import JournalError
from padres.model.classes import Schema
from padres.model.codec import decode, encode, from_dict, to_dict
from padres.model.messages import CompositeSubscription, Publication, Subscription
from padres.model.protocol import (
    ENVELOPES,
    CompositeNotify,
    ExceptionEntry,
    Outcome,
    Scope,
    Visibility,
)

__all__ = ["INSERT_RUN", "Database", "Run", "SqlJournal"]

_RUN_DELIVERIES: Final = 1_000
_RUN_BYTES: Final = 256 << 10
"""A run holds at most ``_RUN_DELIVERIES`` deliveries and about ``_RUN_BYTES`` bytes (the
delivery that crosses the bound is its last): acknowledging part of a run rewrites at most
that much, and reading one reads no more."""
INSERT_RUN: Final = (
    "INSERT INTO runs (owner, name, first, last, size, sizes, bodies, tags) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_QUEUE: Final = "owner = ? AND subscription = ?"
"""The condition selecting one exception queue's entries."""
_PAGE: Final = 1_000
"""Rows of ``runs`` read at a time where a queue is walked (a queue may be larger than
memory)."""


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Database(Protocol):
    """A DB-API connection as ``SqlJournal`` uses it: ``?`` parameters, a transaction begun by
    the first statement after a commit or a rollback."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Cursor: ...

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]], /) -> Any: ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...

    def close(self) -> None: ...


def _body(pub: Publication) -> bytes:
    return encode(pub)


def _publication(body: bytes) -> Publication:
    message = decode(body, checked=True)  # what this broker accepted and wrote
    if not isinstance(message, Publication):
        raise JournalError("the journal holds something other than a publication")
    return message


def _delivered(body: bytes) -> Delivered:
    message = ENVELOPES.decode(body, len(body), checked=True)  # what this broker queued
    if not isinstance(message, Publication | CompositeNotify):
        raise JournalError("a durable queue holds something other than a delivery")
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
class Run:
    """Consecutive deliveries queued for one durable subscription, numbered from ``first``:
    a row of the journal's ``runs``."""

    first: int
    sizes: list[int] = field(default_factory=list)
    bodies: bytearray = field(default_factory=bytearray)
    """Their encoded publications, one after the other."""
    tags: list[Tag | None] | None = None
    """Per delivery, its tag; None where none has one."""

    @classmethod
    def read(cls, first: int, sizes: bytes, bodies: bytes, tags: bytes | None) -> Run:
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
            item = _delivered(bytes(self.bodies[offset : offset + size]))
            found.append((self.first + i, item, None if self.tags is None else self.tags[i], size))
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


class SqlJournal(Journal):
    """A journal in a SQL database (see the module docstring); a subclass opens it."""

    ERRORS: ClassVar[tuple[type[Exception], ...]]
    """The database driver's exceptions, which ``commit`` turns into ``JournalError``."""
    TREE_ORDER: ClassVar[str]
    """The column of ``trees`` that grows with each insert (the oldest go first)."""
    TEXT_BYTES: ClassVar[str]
    """SQL for the bytes of a text column in UTF-8, ``{}`` standing for the column."""

    def __init__(self, db: Database, name: str, retention: int = RETENTION) -> None:
        """``db``: the open database, its tables made; ``name``: what errors call it."""
        self._db = db
        self.name = name
        self.retention = retention
        self.head: int = self._head()
        """The position of the last guaranteed publication accepted."""
        self._unsaved: dict[tuple[str, str], DurableRecord] = {}
        """Durable subscriptions changed since the last commit (``save``)."""
        self._enqueued: dict[tuple[str, str], Run] = {}
        """Per durable subscription, the deliveries queued and not yet inserted (``enqueue``):
        inserted together, before the next commit or read of the queue."""
        self._partials: dict[tuple[str, str], Callable[[], bytes]] = {}
        """Per durable composite subscription, what writes its partial matches at the next
        commit (``keep_partial``)."""

    def _head(self) -> int:
        row = self._db.execute("SELECT max(pos) FROM log").fetchone()
        return int(row[0] or 0)

    def _begin(self) -> None:
        """Make sure a transaction is open: a savepoint needs one."""

    def _next_entry(self) -> int | None:
        """The number of the next exception entry, or None for the database to give it. It
        is taken back by a rollback, as the entry is."""
        return None

    def close(self) -> None:
        self._db.close()

    def commit(self) -> None:
        try:
            self._write_enqueued()
            self._write_unsaved()
            self._write_partials()
            self._db.commit()
        except self.ERRORS as exc:
            raise JournalError(f"cannot commit the journal {self.name}: {exc}") from exc

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """A savepoint. A savepoint opened outside a transaction would commit on release, so
        one is begun first."""
        head = self.head
        self._write_enqueued()
        self._begin()
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
        self._partials.clear()
        self._db.rollback()
        self.head = self._head()

    # -- guaranteed publications -------------------------------------------------------------

    def append(self, tree: str, pub: Publication, at: float, tx: str = "") -> tuple[int, bool]:
        added = self._db.execute(  # one statement: a round trip, in PostgreSQL
            "INSERT INTO log (pos, tree, publisher, id, at, body, tx) VALUES (?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (publisher, id) DO NOTHING",
            (self.head + 1, tree, pub.publisher, pub.id, at, _body(pub), tx),
        )
        if added.rowcount == 0:
            found = self._db.execute(
                "SELECT pos FROM log WHERE publisher = ? AND id = ?", (pub.publisher, pub.id)
            ).fetchone()
            return int(found[0]), False
        self.head += 1
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

    # -- joined parts ------------------------------------------------------------------------

    def prepare(self, part: PreparedPart) -> None:
        self._db.execute(
            "INSERT INTO parts (owner, tx, body) VALUES (?, ?, ?) "
            "ON CONFLICT (owner, tx) DO UPDATE SET body = excluded.body",
            (part.owner, part.tx, msgspec.json.encode(part)),
        )

    def prepared(self) -> Iterator[PreparedPart]:
        for (body,) in self._db.execute("SELECT body FROM parts").fetchall():
            try:
                yield msgspec.json.decode(body, type=PreparedPart)
            except (msgspec.DecodeError, ValueError) as exc:
                raise JournalError(f"the journal holds a part it cannot read: {exc}") from exc

    def settle(self, owner: str, tx: str) -> None:
        self._db.execute("DELETE FROM parts WHERE owner = ? AND tx = ?", (owner, tx))

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
        self.forget_tree(publisher, advertisement)  # remembered again: the newest
        order = self.TREE_ORDER
        (number,) = self._db.execute(
            "INSERT INTO trees (publisher, advertisement, tree) VALUES (?, ?, ?) "
            f"RETURNING {order}",
            (publisher, advertisement, tree),
        ).fetchone()
        if number % 1000 == 0 and number > TREES_KEPT:
            self._db.execute(f"DELETE FROM trees WHERE {order} <= ?", (number - TREES_KEPT,))

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
            "INSERT INTO schemas (class, body) VALUES (?, ?) "
            "ON CONFLICT (class) DO UPDATE SET body = excluded.body",
            (schema.class_name, msgspec.json.encode(schema)),
        )

    # -- durable subscriptions ---------------------------------------------------------------

    def durables(self) -> Iterator[DurableRecord]:
        self._write_unsaved()
        rows = self._db.execute(
            "SELECT owner, subscription, cursors, next, acked, discarded, created, visibility, "
            "producers, priority, scope FROM durables"
        ).fetchall()
        for row in rows:
            owner, sub, cursors, nxt, acked, discarded, created, visibility, producers = row[:9]
            subscription = decode(sub)
            if not isinstance(subscription, Subscription | CompositeSubscription):
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
                int(row[9]),
                Scope(row[10]),
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
                record.priority,
                record.scope.value,
            )
            for record in self._unsaved.values()
        ]
        self._unsaved.clear()
        self._db.executemany(
            "INSERT INTO durables (owner, name, subscription, cursors, next, acked, discarded, "
            "created, visibility, producers, priority, scope) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (owner, name) DO UPDATE SET subscription = excluded.subscription, "
            "cursors = excluded.cursors, next = excluded.next, acked = excluded.acked, "
            "discarded = excluded.discarded, created = excluded.created, "
            "visibility = excluded.visibility, producers = excluded.producers, "
            "priority = excluded.priority, scope = excluded.scope",
            rows,
        )

    def forget(self, record: DurableRecord) -> None:
        self._write_enqueued()
        key = (record.owner, record.name)
        self._unsaved.pop(key, None)
        self._partials.pop(key, None)
        self._db.execute("DELETE FROM durables WHERE owner = ? AND name = ?", key)
        self._db.execute("DELETE FROM runs WHERE owner = ? AND name = ?", key)
        self._db.execute("DELETE FROM partials WHERE owner = ? AND name = ?", key)

    def keep_partial(self, record: DurableRecord, state: Callable[[], bytes]) -> None:
        self._partials[record.owner, record.name] = state

    def _write_partials(self) -> None:
        if not self._partials:
            return
        rows = [(owner, name, state()) for (owner, name), state in self._partials.items()]
        self._partials.clear()
        self._db.executemany(
            "INSERT INTO partials (owner, name, state) VALUES (?, ?, ?) "
            "ON CONFLICT (owner, name) DO UPDATE SET state = excluded.state",
            rows,
        )

    def partial(self, record: DurableRecord) -> bytes | None:
        key = (record.owner, record.name)
        state = self._partials.get(key)
        if state is not None:
            return state()
        row = self._db.execute(
            "SELECT state FROM partials WHERE owner = ? AND name = ?", key
        ).fetchone()
        return None if row is None else bytes(row[0])

    def enqueue(
        self, record: DurableRecord, seq: int, item: Delivered, tag: Tag | None = None
    ) -> int:
        """It is inserted with the others queued before the next commit or read."""
        body = encode(item)
        key = (record.owner, record.name)
        run = self._enqueued.get(key)
        if run is None or not run.takes(seq):
            if run is not None:
                self._write_enqueued()
            run = self._enqueued[key] = Run(seq)
        run.add(body, tag)
        return len(body)

    def _write_enqueued(self) -> None:
        """Insert the deliveries queued so far, a run per durable subscription: all of them,
        or, on an error, none (they stay queued for the next attempt)."""
        if not self._enqueued:
            return
        rows = [run.row(owner, name) for (owner, name), run in self._enqueued.items()]
        self._begin()
        self._db.execute("SAVEPOINT enqueued")
        try:
            self._db.executemany(INSERT_RUN, rows)
        except BaseException:
            self._db.execute("ROLLBACK TO enqueued")
            self._db.execute("RELEASE enqueued")
            raise
        self._db.execute("RELEASE enqueued")
        self._enqueued.clear()

    def queued(self, record: DurableRecord, after: int, limit: int) -> list[Queued]:
        self._write_enqueued()
        rows = self._db.execute(  # a run holds one delivery at least
            "SELECT first, sizes, bodies, tags FROM runs "
            "WHERE owner = ? AND name = ? AND last > ? ORDER BY first LIMIT ?",
            (record.owner, record.name, after, limit),
        ).fetchall()
        found: list[Queued] = []
        for first, sizes, bodies, tags in rows:
            found += Run.read(first, sizes, bodies, tags).deliveries(after, limit - len(found))
            if len(found) >= limit:
                break
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
            run = Run.read(*row)
            cut, cut_size = run.cut(upto)
            count += cut
            size += cut_size
            self._db.execute(
                "DELETE FROM runs WHERE owner = ? AND name = ? AND first = ?",
                (record.owner, record.name, row[0]),
            )
            self._db.execute(INSERT_RUN, run.row(record.owner, record.name))
        return known if known is not None else (count, size)

    def oldest(self, record: DurableRecord, count: int) -> int:
        self._write_enqueued()
        after = 0
        while True:
            rows = self._db.execute(
                "SELECT first, last FROM runs WHERE owner = ? AND name = ? AND first > ? "
                "ORDER BY first LIMIT ?",
                (record.owner, record.name, after, _PAGE),
            ).fetchall()
            for first, last in rows:
                if count <= last - first + 1:
                    return int(first) + count - 1
                count -= last - first + 1
            if len(rows) < _PAGE:
                return 0
            after = rows[-1][0]

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
            "INSERT INTO exceptions (entry, owner, subscription, ref, body, error, attempts, at, "
            "size) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (self._next_entry(), owner, subscription, ref, body, error, attempts, at, size),
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
            f"size = size - {self.TEXT_BYTES.format('error')} + ? "
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
                "ON CONFLICT (owner, subscription) "
                "DO UPDATE SET dropped = exception_queues.dropped + ?",
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
        return DeadLetterQueue(owner, subscription, int(length), int(size), int(replaying), dropped)

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
        return [DeadLetterQueue(o, s, int(n), int(b), int(r), int(d)) for o, s, n, b, r, d in rows]
