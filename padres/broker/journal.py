"""A broker's journal: what it has promised, kept where a crash of the broker does not take it.

``Journal`` is the interface the broker core writes and reads it through; it has three
implementations:

- ``padres.broker.sqlite_journal.SqliteJournal``: SQLite in WAL mode, on disk, for brokers
  that must keep their promises across a crash or a restart (``padres broker --data``), and
  in a temporary file for those that need not;
- ``padres.broker.postgres_journal.PostgresJournal``: PostgreSQL, for brokers that another
  process may replace on another machine (``padres broker --journal``);
- ``padres.broker.memory_journal.MemoryJournal``: Python structures with the same semantics,
  for the simulation, the tests, and a ``Broker`` built without a journal. Its commits survive
  what the simulation calls a crash (``rollback``), not the process.

A journal holds

- the guaranteed publications made at this broker, each with its *position* (1, 2, 3, ...
  in the order they were accepted), the tree it went down and its publisher and id, so that a
  publication sent again after a lost acknowledgement is recognised, and so that durable
  subscriptions elsewhere can ask for what they missed (``since``); the last ``RETENTION``
  are kept;
- the tree each local advertisement went down, so that a publisher advertising again (after
  it reconnected, or after a restart of the broker) gets its old tree, and positions stay
  meaningful to those who follow it;
- the durable subscriptions made at this broker, with what is queued for each (publications,
  or a composite subscription's matches), and the partial matches of the composite ones;
- the schemas of the typed classes it knows, so that it enforces them again after a restart;
- the exception (dead-letter) queues of its clients' subscriptions (``padres.broker.
  dead_letters`` decides what goes in and out of them, the journal keeps them);
- the joined parts of other brokers' transactions its clients made and finished, until those
  transactions end (``PreparedPart``).

A committed transaction's publications are guaranteed publications marked with the transaction
(``tx``), and deliveries of transactional publications with it and its outcome (a ``Tag``), so
that recovery and resumption show them as what they are.

Nothing is kept for good until ``commit``: the runtime commits once per frame it read, before
it sends anything that frame caused, so an acknowledgement never gets ahead of the journal.
``rollback`` forgets what was not committed, as a crash would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Final, Protocol, TypeAlias

import msgspec
import orjson

from padres.model.classes import Schema
from padres.model.codec import to_dict
from padres.model.messages import CompositeSubscription, Publication, Subscription
from padres.model.producers import Ranges
from padres.model.protocol import CompositeNotify, ExceptionEntry, Outcome, Scope, Visibility

__all__ = [
    "RETENTION",
    "TREES_KEPT",
    "DeadLetterQueue",
    "Delivered",
    "DurableRecord",
    "Journal",
    "Logged",
    "PreparedPart",
    "Queued",
    "Tag",
    "dead_letter_size",
]

RETENTION: Final = 1_000_000
"""Guaranteed publications kept for recovery, per broker (the oldest go first)."""
TREES_KEPT: Final = 100_000
"""Local advertisements whose tree is remembered, per broker (the oldest go first)."""

Tag: TypeAlias = tuple[str, Outcome]
"""A transactional publication's transaction and outcome."""
Delivered: TypeAlias = Publication | CompositeNotify
"""What a durable subscription delivers: a publication, or a composite subscription's match."""
Queued: TypeAlias = tuple[int, Delivered, Tag | None, int]
"""A delivery queued for a durable subscription: (number, what it delivers, tag, bytes)."""
Logged: TypeAlias = tuple[int, Publication, str]
"""A guaranteed publication as ``since`` reads it: (position, publication, the transaction it
was committed with or "")."""


@dataclass
class DurableRecord:
    """A durable subscription as the journal keeps it."""

    owner: str
    """The client's name in the overlay (``<client>@<broker>``)."""
    subscription: Subscription | CompositeSubscription
    """The client's id for it (its name) and its filter, or its composite expression."""
    cursors: dict[str, int] = field(default_factory=dict)
    """Per tree, the journal position of the root broker up to which nothing is missing."""
    next: int = 1
    """The number the next delivery gets."""
    acked: int = 0
    discarded: int = 0
    """Deliveries thrown away because the queue was over its limits while the client was away."""
    created: float = 0.0
    """When it was made (Unix seconds): what it asks the roots of new trees for."""
    visibility: Visibility = Visibility.ON_COMMIT
    """Which transactional publications it sees."""
    producers: Ranges = field(default_factory=dict)
    """The guaranteed publications it has taken, by producer (``padres.model.producers``)."""
    priority: int = 0
    """Where its deliveries come among its client's other durable subscriptions matching the
    same publication (higher first)."""
    scope: Scope = Scope.GLOBAL
    """Which publications it sees by where they were published."""

    @property
    def name(self) -> str:
        return self.subscription.id


@dataclass(frozen=True)
class DeadLetterQueue:
    """The counts of one exception queue: (client, subscription)."""

    owner: str
    """The client's name in the overlay (``<client>@<broker>``)."""
    subscription: str
    length: int = 0
    """Entries it holds."""
    size: int = 0
    """Their bytes (``dead_letter_size``)."""
    replaying: int = 0
    """Entries marked to be delivered again."""
    dropped: int = 0
    """Entries dropped, the oldest first, because it was over its bounds."""


class PreparedPart(msgspec.Struct, frozen=True):
    """A joined part its broker holds *prepared*: its client finished it, and it commits or
    aborts with the transaction it joined, whose broker decides (``padres.broker.parts``)."""

    owner: str
    """The client's name in the overlay (``<client>@<broker>``)."""
    tx: str
    """The client's id for the part."""
    joins: str
    """The overlay-wide id of the transaction it joined."""
    path: tuple[str, ...]
    """The brokers from this one to that transaction's, both included."""
    publications: tuple[tuple[Publication, str], ...]
    """Its publications, in order, with the tree each goes down."""


def dead_letter_size(publication: Publication, error: str) -> int:
    """The bytes an exception entry counts against its queue's bound: its publication as JSON
    and its error text (UTF-8)."""
    return len(orjson.dumps(to_dict(publication))) + len(error.encode())


class Journal(Protocol):
    """What the broker core keeps in its journal, and how (see the module docstring).

    Exception queues are named by ``owner`` (the client's name in the overlay) and
    ``subscription`` (its id); their entries by a number, increasing, never used twice in a
    journal."""

    head: int
    """The position of the last guaranteed publication accepted (for the journal to move)."""

    def close(self) -> None: ...

    def commit(self) -> None:
        """Keep for good what was written since the last commit; raises ``JournalError`` if it
        cannot (then nothing of it is kept)."""
        ...

    def atomic(self) -> AbstractContextManager[None]:
        """What is written inside is kept whole or not at all: an error inside undoes it, and
        goes on. It commits nothing."""
        ...

    def rollback(self) -> None:
        """Forget what was not committed (what a crash would lose)."""
        ...

    # -- guaranteed publications -------------------------------------------------------------

    def append(self, tree: str, pub: Publication, at: float, tx: str = "") -> tuple[int, bool]:
        """Record ``pub`` going down ``tree``, accepted at ``at`` (Unix seconds), committed
        with transaction ``tx`` if it has one: its position, and whether it is new (a
        publication already recorded, by publisher and id, keeps its first position)."""
        ...

    def recorded(self, publisher: str, pub_id: str) -> bool:
        """Whether a publication of ``publisher`` with id ``pub_id`` is recorded (as long as
        the journal keeps it)."""
        ...

    def committed(self, tx: str) -> bool:
        """Whether transaction ``tx`` committed publications here (that the journal keeps)."""
        ...

    # -- joined parts ------------------------------------------------------------------------

    def prepare(self, part: PreparedPart) -> None:
        """Keep ``part`` until ``settle``."""
        ...

    def prepared(self) -> Iterator[PreparedPart]:
        """The parts kept (``prepare``) and not settled; raises ``JournalError`` for one it
        cannot read."""
        ...

    def settle(self, owner: str, tx: str) -> None:
        """Forget the part ``tx`` of ``owner`` (its transaction ended)."""
        ...

    def since(
        self, tree: str, after: int, limit: int, at: float = 0.0
    ) -> tuple[list[Logged], bool]:
        """Up to ``limit`` publications of ``tree`` after position ``after`` accepted at ``at``
        (Unix seconds, by this broker's clock) or later, in order, and whether some after
        ``after`` may be gone (older than the journal keeps)."""
        ...

    # -- trees of local advertisements -------------------------------------------------------

    def tree_of(self, publisher: str, advertisement: str) -> str | None: ...

    def remember_tree(self, publisher: str, advertisement: str, tree: str) -> None:
        """Remember the tree of a local advertisement (the last ``TREES_KEPT`` advertisements
        are remembered: a publisher away longer than that many others advertised starts a new
        tree when it comes back)."""
        ...

    def forget_tree(self, publisher: str, advertisement: str) -> None: ...

    # -- schemas -----------------------------------------------------------------------------

    def schemas(self) -> Iterator[Schema]:
        """The schemas kept; raises ``JournalError`` for one it cannot read."""
        ...

    def save_schema(self, schema: Schema) -> None:
        """Keep ``schema``, in place of the one of its class kept before."""
        ...

    # -- durable subscriptions ---------------------------------------------------------------

    def durables(self) -> Iterator[DurableRecord]:
        """The durable subscriptions, as saved (committed or not): records of their own,
        which the caller may change and ``save``."""
        ...

    def save(self, record: DurableRecord) -> None:
        """Keep ``record`` as it is at the next ``commit`` (a subscription that takes many
        deliveries in one frame is written once for them all)."""
        ...

    def forget(self, record: DurableRecord) -> None:
        """Forget the durable subscription, its queue and its partial matches."""
        ...

    def enqueue(
        self, record: DurableRecord, seq: int, item: Delivered, tag: Tag | None = None
    ) -> int:
        """Queue delivery number ``seq`` (of a transaction's publication: ``tag``); returns
        its size in bytes (those of ``item`` encoded)."""
        ...

    def keep_partial(self, record: DurableRecord, state: Callable[[], bytes]) -> None:
        """Keep the partial matches of durable composite subscription ``record`` as ``state``
        writes them when the journal next commits (it is called then, once, however many
        times this was called since the last commit)."""
        ...

    def partial(self, record: DurableRecord) -> bytes | None:
        """The partial matches kept for ``record`` (committed or not), if any."""
        ...

    def queued(self, record: DurableRecord, after: int, limit: int) -> list[Queued]:
        """Up to ``limit`` deliveries queued for ``record`` after number ``after``, in
        order."""
        ...

    def backlog(self, record: DurableRecord) -> tuple[int, int]:
        """How many deliveries are queued for ``record``, and their bytes."""
        ...

    def dequeue(
        self, record: DurableRecord, upto: int, known: tuple[int, int] | None = None
    ) -> tuple[int, int]:
        """Forget the deliveries up to ``upto`` (acknowledged, or discarded); returns how many
        there were, and their bytes: ``known`` if the caller knows them, else counted."""
        ...

    def oldest(self, record: DurableRecord, count: int) -> int:
        """The delivery number of the ``count``-th oldest queued delivery (0 if none)."""
        ...

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
        """Put ``publication`` in the queue, with the ``ref`` of the failure that brought it,
        the handler's ``error``, its ``attempts`` and the time (``at``, Unix seconds)."""
        ...

    def has_dead_letter(self, owner: str, subscription: str, ref: str) -> bool:
        """Whether the queue holds the entry a failure ``ref`` brought."""
        ...

    def update_dead_letter(
        self, owner: str, subscription: str, entry: int, error: str, attempts: int, at: float
    ) -> None:
        """Entry ``entry``, delivered again, failed again: its error, attempts and time are
        these, and it is no longer marked to be delivered again. Nothing if it is gone."""
        ...

    def trim_dead_letters(
        self, owner: str, subscription: str, max_entries: int, max_bytes: int
    ) -> list[int]:
        """Drop the oldest entries of the queue while it holds more than ``max_entries``
        entries or ``max_bytes`` bytes, and count them as dropped; returns them."""
        ...

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
        """Up to ``limit`` entries of the queue numbered after ``after``, in order: among
        ``entries`` if any are given, only those marked to be delivered again if
        ``marked``."""
        ...

    def mark_dead_letters(self, owner: str, subscription: str, entries: Sequence[int]) -> int:
        """Mark ``entries`` of the queue (all of it if none are given) to be delivered again;
        returns how many there are."""
        ...

    def purge_dead_letters(self, owner: str, subscription: str, entries: Sequence[int]) -> int:
        """Remove ``entries`` from the queue (all of it if none are given); returns how many
        there were."""
        ...

    def dead_letter_queue(self, owner: str, subscription: str) -> DeadLetterQueue:
        """The counts of the queue (zeros if it holds nothing and dropped nothing)."""
        ...

    def dead_letter_queues(self) -> list[DeadLetterQueue]:
        """Every queue that holds entries or has dropped some, by owner and subscription."""
        ...
