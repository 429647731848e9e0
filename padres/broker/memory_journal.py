"""The journal in Python structures: the semantics of ``SqliteJournal``, nothing on disk.

For the simulation (a crash there is ``rollback``: what was committed survives it), the tests,
and a ``Broker`` built without a journal. What it keeps lives as long as the object.

Every change is made at once, and what undoes it is recorded: ``commit`` forgets the undoing,
``rollback`` undoes everything since the last commit (newest first), and ``atomic`` what was
done inside it when it fails. Durable records are copied on the way in and out, so that what a
caller changes afterwards reaches the journal only through ``save``. Publications are kept as
they are (they are immutable); sizes are those of their encoding, as in ``SqliteJournal``.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from operator import itemgetter
from typing import TypeVar

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
from padres.model.classes import Schema
from padres.model.codec import encode
from padres.model.messages import Publication
from padres.model.protocol import ExceptionEntry

__all__ = ["MemoryJournal"]

_K = TypeVar("_K")
_V = TypeVar("_V")
_Key = tuple[str, str]
"""(owner, name): a durable subscription; (owner, subscription): an exception queue."""


@dataclass(frozen=True)
class _Logged:
    """A guaranteed publication as the journal keeps it."""

    pos: int
    tree: str
    at: float
    publication: Publication
    tx: str


@dataclass
class _Queue:
    """The deliveries queued for a durable subscription, in order, and their bytes."""

    deliveries: list[Queued] = field(default_factory=list)
    size: int = 0

    def unqueue(self) -> None:
        """Take the last delivery off."""
        self.size -= self.deliveries.pop()[3]

    def requeue(self, deliveries: list[Queued]) -> None:
        """Put ``deliveries`` back before the others."""
        self.deliveries[:0] = deliveries
        self.size += sum(delivery[3] for delivery in deliveries)


@dataclass(frozen=True)
class _DeadLetter:
    """An entry of an exception queue as the journal keeps it."""

    entry: int
    ref: str
    publication: Publication
    error: str
    attempts: int
    at: float
    size: int
    replay: bool = False

    def listed(self) -> ExceptionEntry:
        return ExceptionEntry(
            id=self.entry,
            publication=self.publication,
            error=self.error,
            attempts=self.attempts,
            at=self.at,
            replaying=self.replay,
        )


def _copy(record: DurableRecord) -> DurableRecord:
    producers = {p: [list(r) for r in ranges] for p, ranges in record.producers.items()}
    return replace(record, cursors=dict(record.cursors), producers=producers)


def _assign(table: dict[_K, _V], key: _K, value: _V | None) -> None:
    """``table[key] = value``; for None, ``table`` without ``key``."""
    if value is None:
        table.pop(key, None)
    else:
        table[key] = value


_seq = itemgetter(0)
"""A queued delivery's number."""


class MemoryJournal(Journal):
    """See the module docstring."""

    def __init__(self, *, retention: int = RETENTION) -> None:
        """``retention``: guaranteed publications kept (``RETENTION``)."""
        self.retention = retention
        self.head = 0
        """The position of the last guaranteed publication accepted."""
        self._undo: list[Callable[[], None]] = []
        """What undoes each change since the last commit, oldest first."""
        self._log: list[_Logged] = []
        """The guaranteed publications kept, by position (consecutive)."""
        self._positions: dict[tuple[str, str], int] = {}
        """(publisher, id) -> position, for each publication in ``_log``."""
        self._by_tree: dict[str, list[int]] = {}
        """Per tree, the positions of its publications in ``_log``, in order."""
        self._txs: Counter[str] = Counter()
        """Per transaction, its publications in ``_log``."""
        self._trees: dict[tuple[str, str], tuple[int, str]] = {}
        """(publisher, advertisement) -> (the stamp it was remembered with, its tree)."""
        self._stamp = 0
        """The stamp of the last tree remembered (they count up from 1)."""
        self._schemas: dict[str, Schema] = {}
        self._durables: dict[_Key, DurableRecord] = {}
        self._unsaved: dict[_Key, DurableRecord] = {}
        """Durable subscriptions changed since the last commit (``save``), as the caller's."""
        self._queues: dict[_Key, _Queue] = {}
        self._partials: dict[_Key, bytes] = {}
        self._unkept: dict[_Key, Callable[[], bytes]] = {}
        """Durable composite subscriptions whose partial matches are written at the next
        commit (``keep_partial``)."""
        self._dead_letters: dict[_Key, dict[int, _DeadLetter]] = {}
        """Per exception queue, its entries by number."""
        self._dropped: Counter[_Key] = Counter()
        self._entry = 0
        """The number of the last exception entry made."""
        self._parts: dict[_Key, PreparedPart] = {}

    def close(self) -> None:
        """Nothing to release."""

    def commit(self) -> None:
        self._write_unsaved()
        for key, state in self._unkept.items():
            self._replace(self._partials, key, state())
        self._unkept.clear()
        self._undo.clear()

    @contextmanager
    def atomic(self) -> Iterator[None]:
        mark = len(self._undo)
        try:
            yield
        except BaseException:
            self._undo_to(mark)
            raise

    def rollback(self) -> None:
        self._unsaved.clear()
        self._unkept.clear()
        self._undo_to(0)

    def _undo_to(self, mark: int) -> None:
        while len(self._undo) > mark:
            self._undo.pop()()

    def _replace(self, table: dict[_K, _V], key: _K, value: _V | None) -> None:
        """``_assign``, undoably."""
        before = table.get(key)
        _assign(table, key, value)
        self._undo.append(lambda: _assign(table, key, before))

    # -- guaranteed publications -------------------------------------------------------------

    def append(self, tree: str, pub: Publication, at: float, tx: str = "") -> tuple[int, bool]:
        found = self._positions.get((pub.publisher, pub.id))
        if found is not None:
            return found, False
        self.head += 1
        row = _Logged(self.head, tree, at, pub, tx)
        self._log.append(row)
        self._index(row, 1)
        self._by_tree.setdefault(tree, []).append(row.pos)
        self._undo.append(self._unappend)
        if self.head % 1000 == 0 and self.head > self.retention:
            self._drop_log(self.head - self.retention)
        return self.head, True

    def _unappend(self) -> None:
        row = self._log.pop()
        self._index(row, -1)
        positions = self._by_tree[row.tree]
        positions.pop()
        if not positions:
            del self._by_tree[row.tree]
        self.head = row.pos - 1

    def _index(self, row: _Logged, step: int) -> None:
        """Count ``row`` in (``step`` 1) or out (-1) of the indexes by publication and
        transaction (``_by_tree`` is the caller's)."""
        key = (row.publication.publisher, row.publication.id)
        if step > 0:
            self._positions[key] = row.pos
        else:
            del self._positions[key]
        if row.tx:
            self._txs[row.tx] += step
            if not self._txs[row.tx]:
                del self._txs[row.tx]

    def _drop_log(self, upto: int) -> None:
        """Forget the publications up to position ``upto`` (the oldest)."""
        count = max(0, upto - self._log[0].pos + 1)
        gone = self._log[:count]
        del self._log[:count]
        for row in gone:
            self._index(row, -1)
        for tree, dropped in Counter(row.tree for row in gone).items():
            positions = self._by_tree[tree]
            del positions[:dropped]
            if not positions:
                del self._by_tree[tree]
        self._undo.append(lambda: self._undrop_log(gone))

    def _undrop_log(self, gone: list[_Logged]) -> None:
        self._log[:0] = gone
        by_tree: dict[str, list[int]] = {}
        for row in gone:
            self._index(row, 1)
            by_tree.setdefault(row.tree, []).append(row.pos)
        for tree, positions in by_tree.items():
            self._by_tree.setdefault(tree, [])[:0] = positions

    def recorded(self, publisher: str, pub_id: str) -> bool:
        return (publisher, pub_id) in self._positions

    def committed(self, tx: str) -> bool:
        return tx in self._txs

    # -- joined parts ------------------------------------------------------------------------

    def prepare(self, part: PreparedPart) -> None:
        self._replace(self._parts, (part.owner, part.tx), part)

    def prepared(self) -> Iterator[PreparedPart]:
        yield from list(self._parts.values())

    def settle(self, owner: str, tx: str) -> None:
        self._replace(self._parts, (owner, tx), None)

    def since(
        self, tree: str, after: int, limit: int, at: float = 0.0
    ) -> tuple[list[Logged], bool]:
        positions = self._by_tree.get(tree, [])
        start = bisect_right(positions, after)
        oldest = self._log[0].pos if self._log else None
        found: list[Logged] = []
        for pos in positions[start:]:
            row = self._log[pos - (oldest or 0)]
            if row.at >= at:
                found.append((row.pos, row.publication, row.tx))
                if len(found) == limit:
                    break
        lost = after > 0 and oldest is not None and oldest > after + 1
        return found, lost

    def tree_of(self, publisher: str, advertisement: str) -> str | None:
        found = self._trees.get((publisher, advertisement))
        return None if found is None else found[1]

    def remember_tree(self, publisher: str, advertisement: str, tree: str) -> None:
        self._stamp += 1
        stamp = self._stamp
        self._undo.append(self._unstamp)
        self._replace(self._trees, (publisher, advertisement), (stamp, tree))
        if stamp % 1000 == 0 and stamp > TREES_KEPT:
            for key in [k for k, (s, _) in self._trees.items() if s <= stamp - TREES_KEPT]:
                self._replace(self._trees, key, None)

    def _unstamp(self) -> None:
        self._stamp -= 1

    def forget_tree(self, publisher: str, advertisement: str) -> None:
        self._replace(self._trees, (publisher, advertisement), None)

    # -- schemas -----------------------------------------------------------------------------

    def schemas(self) -> Iterator[Schema]:
        yield from list(self._schemas.values())

    def save_schema(self, schema: Schema) -> None:
        self._replace(self._schemas, schema.class_name, schema)

    # -- durable subscriptions ---------------------------------------------------------------

    def durables(self) -> Iterator[DurableRecord]:
        self._write_unsaved()
        for record in list(self._durables.values()):
            yield _copy(record)

    def save(self, record: DurableRecord) -> None:
        self._unsaved[record.owner, record.name] = record

    def _write_unsaved(self) -> None:
        for key, record in self._unsaved.items():
            self._replace(self._durables, key, _copy(record))
        self._unsaved.clear()

    def forget(self, record: DurableRecord) -> None:
        key = (record.owner, record.name)
        self._unsaved.pop(key, None)
        self._unkept.pop(key, None)
        self._replace(self._durables, key, None)
        self._replace(self._queues, key, None)
        self._replace(self._partials, key, None)

    def keep_partial(self, record: DurableRecord, state: Callable[[], bytes]) -> None:
        self._unkept[record.owner, record.name] = state

    def partial(self, record: DurableRecord) -> bytes | None:
        key = (record.owner, record.name)
        state = self._unkept.get(key)
        return state() if state is not None else self._partials.get(key)

    def enqueue(
        self, record: DurableRecord, seq: int, item: Delivered, tag: Tag | None = None
    ) -> int:
        size = len(encode(item))
        key = (record.owner, record.name)
        queue = self._queues.get(key)
        if queue is None:
            queue = _Queue()
            self._replace(self._queues, key, queue)
        queue.deliveries.append((seq, item, tag, size))
        queue.size += size
        self._undo.append(queue.unqueue)
        return size

    def queued(self, record: DurableRecord, after: int, limit: int) -> list[Queued]:
        deliveries = self._queue(record).deliveries
        start = bisect_right(deliveries, after, key=_seq)
        return deliveries[start : start + limit]

    def backlog(self, record: DurableRecord) -> tuple[int, int]:
        queue = self._queue(record)
        return len(queue.deliveries), queue.size

    def dequeue(
        self, record: DurableRecord, upto: int, known: tuple[int, int] | None = None
    ) -> tuple[int, int]:
        queue = self._queue(record)
        count = bisect_right(queue.deliveries, upto, key=_seq)
        gone = queue.deliveries[:count]
        del queue.deliveries[:count]
        size = sum(delivery[3] for delivery in gone)
        queue.size -= size
        self._undo.append(lambda: queue.requeue(gone))
        return known if known is not None else (count, size)

    def oldest(self, record: DurableRecord, count: int) -> int:
        deliveries = self._queue(record).deliveries
        return deliveries[count - 1][0] if 0 < count <= len(deliveries) else 0

    def _queue(self, record: DurableRecord) -> _Queue:
        """The queue of ``record`` (a new, empty one, not kept, if it has none)."""
        return self._queues.get((record.owner, record.name)) or _Queue()

    # -- exception (dead-letter) queues ------------------------------------------------------

    def _letters(self, owner: str, subscription: str) -> list[_DeadLetter]:
        """The entries of the queue, in order."""
        letters = self._dead_letters.get((owner, subscription), {})
        return [letters[entry] for entry in sorted(letters)]

    def _put(self, owner: str, subscription: str, letter: _DeadLetter) -> None:
        """Keep ``letter`` in its queue, in place of the entry of its number if any."""
        letters = self._dead_letters.setdefault((owner, subscription), {})
        self._replace(letters, letter.entry, letter)

    def _remove(self, owner: str, subscription: str, letters: list[_DeadLetter]) -> None:
        """Take ``letters`` out of their queue."""
        queue = self._dead_letters.get((owner, subscription), {})
        for letter in letters:
            self._replace(queue, letter.entry, None)

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
        self._entry += 1
        self._undo.append(self._unnumber)
        size = dead_letter_size(publication, error)
        letter = _DeadLetter(self._entry, ref, publication, error, attempts, at, size)
        self._put(owner, subscription, letter)

    def _unnumber(self) -> None:
        self._entry -= 1

    def has_dead_letter(self, owner: str, subscription: str, ref: str) -> bool:
        letters = self._dead_letters.get((owner, subscription), {})
        return any(letter.ref == ref for letter in letters.values())

    def update_dead_letter(
        self, owner: str, subscription: str, entry: int, error: str, attempts: int, at: float
    ) -> None:
        letter = self._dead_letters.get((owner, subscription), {}).get(entry)
        if letter is None:
            return
        size = letter.size - len(letter.error.encode()) + len(error.encode())
        again = replace(letter, error=error, attempts=attempts, at=at, size=size, replay=False)
        self._put(owner, subscription, again)

    def trim_dead_letters(
        self, owner: str, subscription: str, max_entries: int, max_bytes: int
    ) -> list[int]:
        letters = self._letters(owner, subscription)
        length, size = len(letters), sum(letter.size for letter in letters)
        dropped: list[_DeadLetter] = []
        for letter in letters:
            if length <= max_entries and size <= max_bytes:
                break
            dropped.append(letter)
            length, size = length - 1, size - letter.size
        if dropped:
            self._remove(owner, subscription, dropped)
            key = (owner, subscription)
            self._replace(self._dropped, key, self._dropped[key] + len(dropped))
        return [letter.entry for letter in dropped]

    def _selected(self, owner: str, subscription: str, entries: Sequence[int]) -> list[_DeadLetter]:
        """``entries`` of the queue (all of it when none are given), in order."""
        letters = self._letters(owner, subscription)
        if not entries:
            return letters
        chosen = set(entries)
        return [letter for letter in letters if letter.entry in chosen]

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
        found = [
            letter.listed()
            for letter in self._selected(owner, subscription, entries)
            if letter.entry > after and (letter.replay or not marked)
        ]
        return found[:limit]

    def mark_dead_letters(self, owner: str, subscription: str, entries: Sequence[int]) -> int:
        selected = self._selected(owner, subscription, entries)
        for letter in selected:
            self._put(owner, subscription, replace(letter, replay=True))
        return len(selected)

    def purge_dead_letters(self, owner: str, subscription: str, entries: Sequence[int]) -> int:
        selected = self._selected(owner, subscription, entries)
        self._remove(owner, subscription, selected)
        return len(selected)

    def dead_letter_queue(self, owner: str, subscription: str) -> DeadLetterQueue:
        letters = self._letters(owner, subscription)
        return DeadLetterQueue(
            owner,
            subscription,
            len(letters),
            sum(letter.size for letter in letters),
            sum(letter.replay for letter in letters),
            self._dropped[owner, subscription],
        )

    def dead_letter_queues(self) -> list[DeadLetterQueue]:
        keys = {key for key, letters in self._dead_letters.items() if letters} | set(self._dropped)
        return [self.dead_letter_queue(*key) for key in sorted(keys)]
