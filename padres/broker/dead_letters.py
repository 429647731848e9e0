"""Exception queues: the publications a subscriber's handler kept failing on, kept at its edge
broker, in the journal, per client and subscription.

A client whose handler still fails after its retries sends ``Failed``; the publication goes into
the exception queue of (client, subscription) with the error, the attempts and the time, and the
broker answers ``Ok``. For a durable subscription the delivery is acknowledged in the same
journal transaction: it is either still queued for the client or in the exception queue, never
both and never neither. A ``Failed`` sent again (its acknowledgement was lost) is recognised by
its ``ref``, and one for a durable delivery acknowledged already (sent again to a client that
reconnected, and failed again) by its ``seq``.

``Exceptions`` lists, replays or purges a queue, from the subscriber itself or from any other
session (a command line, the web API) naming the client. Replaying marks entries in the journal;
they are delivered (``Retry``) to the subscription whenever its client has it, now or when it
makes it again (after a restart of either side), at most ``WINDOW`` at a time. The client
answers each: handled (it purges the entry) or failed again (``Failed`` with the entry: its
error and attempts are updated and it rests in the queue again).

A queue keeps at most ``MAX_ENTRIES`` entries and ``MAX_BYTES`` bytes (publication and error
text); past either, its oldest entries are dropped and counted (``ExceptionReport.dropped``),
so that a handler failing on everything costs bounded disk and never stalls its subscription.
Queues outlive their subscriptions (a non-durable one ends with every disconnection): they go
when they are purged.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Final

import orjson

from padres.broker.durable import Durables
from padres.broker.journal import Journal
from padres.broker.routes import Out
from padres.broker.session import Session
from padres.errors import JournalError
from padres.model.codec import from_dict, to_dict
from padres.model.messages import Publication
from padres.model.protocol import (
    Ack,
    Error,
    ExceptionAction,
    ExceptionEntry,
    ExceptionReport,
    Exceptions,
    Failed,
    Ok,
    Retry,
)

__all__ = ["MAX_BYTES", "MAX_ENTRIES", "MAX_ERROR", "WINDOW", "ExceptionQueues"]

MAX_ENTRIES: Final = 10_000
"""Entries an exception queue keeps, at most (the oldest are dropped past it)."""
MAX_BYTES: Final = 64 << 20
"""Bytes (publications and error texts) an exception queue keeps, at most."""
MAX_ERROR: Final = 4096
"""Characters of an error text kept (the rest is cut)."""
WINDOW: Final = 100
"""Entries of a queue being delivered again (``Retry``) at a time."""

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS exceptions (
    entry INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT NOT NULL, subscription TEXT NOT NULL,
    ref TEXT NOT NULL, body BLOB NOT NULL, error TEXT NOT NULL, attempts INTEGER NOT NULL,
    at REAL NOT NULL, size INTEGER NOT NULL, replay INTEGER NOT NULL DEFAULT 0);
CREATE UNIQUE INDEX IF NOT EXISTS exceptions_ref ON exceptions (owner, subscription, ref);
CREATE TABLE IF NOT EXISTS exception_queues (
    owner TEXT NOT NULL, subscription TEXT NOT NULL, dropped INTEGER NOT NULL,
    PRIMARY KEY (owner, subscription));
"""

_Key = tuple[str, str]
"""(client name in the overlay, subscription id): one queue."""


class ExceptionQueues:
    """The exception queues of one broker (see the module docstring)."""

    def __init__(
        self,
        journal: Journal,
        durables: Durables,
        sessions: Mapping[str, Session],
        broker_id: str,
        *,
        max_entries: int = MAX_ENTRIES,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        """``sessions``: the broker's connected clients by hop (read, never changed)."""
        self._db = journal.connection
        self._durables = durables
        self._sessions = sessions
        self._broker = broker_id
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._sent: dict[_Key, dict[int, str]] = {}
        """Per queue, the entries delivered again and not answered yet, and the hop of each."""
        try:
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            why = f"cannot open the exception queues of {journal.path}: {exc}"
            raise JournalError(why) from exc

    def handle(self, message: Failed | Exceptions, session: Session, now: float) -> list[Out]:
        if isinstance(message, Failed):
            return self._failed(message, session, now)
        return self._request(message, session)

    def resume(self, owner: str, subscription: str) -> list[Out]:
        """Client ``owner`` has (again) made ``subscription``: what is to be replayed to it
        goes now (what was under way before is sent again)."""
        self._sent.pop((owner, subscription), None)
        return self._replay((owner, subscription))

    def hop_down(self, hop: str) -> None:
        """The client on ``hop`` left: what was being delivered again to it waits for it."""
        for sent in self._sent.values():
            for entry in [e for e, h in sent.items() if h == hop]:
                del sent[entry]

    def queues(self) -> list[dict[str, object]]:
        """Every queue that holds entries or has dropped some: its client (its name at this
        broker), its subscription, and its counts."""
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
        return [
            {
                "client": owner.removesuffix(f"@{self._broker}"),
                "subscription": sub,
                "length": length,
                "bytes": size,
                "replaying": replaying,
                "dropped": dropped,
            }
            for owner, sub, length, size, replaying, dropped in rows
        ]

    # -- failures ----------------------------------------------------------------------------

    def _failed(self, message: Failed, session: Session, now: float) -> list[Out]:
        key = (session.name, message.subscription)
        ok: list[Out] = [(session.hop, Ok(message.ref))]
        error = message.error[:MAX_ERROR]
        if message.entry:
            self._sent.get(key, {}).pop(message.entry, None)
            self._db.execute(
                "UPDATE exceptions SET error = ?, attempts = ?, at = ?, replay = 0, "
                "size = size - length(CAST(error AS BLOB)) + ? "
                "WHERE entry = ? AND owner = ? AND subscription = ?",
                (error, message.attempts, now, len(error.encode()), message.entry, *key),
            )  # an entry purged while it was delivered again stays purged
            self._bound(key)
            return ok + self._replay(key)
        durable = self._durables.has(*key)
        if not durable and message.subscription not in session.subscriptions:
            why = f"no subscription {message.subscription!r} to put an exception entry for"
            return [(session.hop, Error(why, message.ref))]
        known = self._db.execute(
            "SELECT 1 FROM exceptions WHERE owner = ? AND subscription = ? AND ref = ?",
            (*key, message.ref),
        ).fetchone()
        # A durable delivery acknowledged already was processed: handled, or set aside by an
        # earlier failure; this one is its handler's second try after a reconnection.
        again = durable and 0 < message.seq <= self._durables.acked(*key)
        if known is None and not again:
            body = orjson.dumps(to_dict(message.publication))
            size = len(body) + len(error.encode())
            if size > self.max_bytes:
                why = (
                    f"exception entry of {size:,} bytes refused: the exception queue of "
                    f"{message.subscription!r} keeps {self.max_bytes:,} bytes"
                )
                return [(session.hop, Error(why, message.ref))]
            self._db.execute(
                "INSERT INTO exceptions "
                "(owner, subscription, ref, body, error, attempts, at, size) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (*key, message.ref, body, error, message.attempts, now, size),
            )
            self._bound(key)
        out: list[Out] = []
        if durable and message.seq:
            out = self._durables.ack(session.name, Ack(message.subscription, message.seq))
        return out + ok

    def _bound(self, key: _Key) -> None:
        """Drop the oldest entries of the queue while it is over its limits."""
        length, size = self._size(key)
        dropped = 0
        while length > self.max_entries or size > self.max_bytes:
            entry, bytes_ = self._db.execute(
                "SELECT entry, size FROM exceptions WHERE owner = ? AND subscription = ? "
                "ORDER BY entry LIMIT 1",
                key,
            ).fetchone()
            self._db.execute("DELETE FROM exceptions WHERE entry = ?", (entry,))
            self._sent.get(key, {}).pop(entry, None)
            length, size, dropped = length - 1, size - bytes_, dropped + 1
        if dropped:
            self._db.execute(
                "INSERT INTO exception_queues (owner, subscription, dropped) VALUES (?, ?, ?) "
                "ON CONFLICT (owner, subscription) DO UPDATE SET dropped = dropped + ?",
                (*key, dropped, dropped),
            )

    def _size(self, key: _Key) -> tuple[int, int]:
        row = self._db.execute(
            "SELECT count(*), coalesce(sum(size), 0) FROM exceptions "
            "WHERE owner = ? AND subscription = ?",
            key,
        ).fetchone()
        return int(row[0]), int(row[1])

    # -- requests ----------------------------------------------------------------------------

    def _request(self, message: Exceptions, session: Session) -> list[Out]:
        owner = f"{message.client}@{self._broker}" if message.client else session.name
        key = (owner, message.subscription)
        entries = sorted(set(message.entries))
        if entries and message.action is not ExceptionAction.PURGE:
            missing = sorted(set(entries) - set(self._existing(key, entries)))
            if missing:
                listed = ", ".join(map(str, missing))
                why = (
                    f"no entry {listed} in the exception queue of subscription "
                    f"{message.subscription!r} of {owner}"
                )
                return [(session.hop, Error(why, message.ref))]
        out: list[Out] = []
        listed_entries: tuple[ExceptionEntry, ...] = ()
        more = False
        affected = 0
        match message.action:
            case ExceptionAction.LIST:
                listed_entries, more = self._list(key, entries, message.after, message.limit)
            case ExceptionAction.REPLAY:
                affected = self._mark(key, entries)
                out = self._replay(key)
            case ExceptionAction.PURGE:
                affected = self._purge(key, entries)
                if session.name == owner:  # the subscriber's handler took it: more may go
                    out = self._replay(key)
        length, size = self._size(key)
        row = self._db.execute(
            "SELECT dropped FROM exception_queues WHERE owner = ? AND subscription = ?", key
        ).fetchone()
        report = ExceptionReport(
            message.ref,
            message.subscription,
            listed_entries,
            more,
            affected,
            length,
            size,
            0 if row is None else int(row[0]),
        )
        return [*out, (session.hop, report)]

    def _existing(self, key: _Key, entries: list[int]) -> list[int]:
        marks = ",".join("?" * len(entries))
        rows = self._db.execute(
            f"SELECT entry FROM exceptions WHERE owner = ? AND subscription = ? "
            f"AND entry IN ({marks})",
            (*key, *entries),
        ).fetchall()
        return [int(r[0]) for r in rows]

    def _where(self, key: _Key, entries: list[int]) -> tuple[str, tuple[object, ...]]:
        """The condition selecting ``entries`` of the queue (all of it when empty)."""
        if not entries:
            return "owner = ? AND subscription = ?", key
        marks = ",".join("?" * len(entries))
        return f"owner = ? AND subscription = ? AND entry IN ({marks})", (*key, *entries)

    def _list(
        self, key: _Key, entries: list[int], after: int, limit: int
    ) -> tuple[tuple[ExceptionEntry, ...], bool]:
        where, args = self._where(key, entries)
        rows = self._db.execute(
            f"SELECT entry, body, error, attempts, at, replay FROM exceptions "
            f"WHERE {where} AND entry > ? ORDER BY entry LIMIT ?",
            (*args, after, limit + 1),
        ).fetchall()
        found = tuple(
            ExceptionEntry(
                id=entry,
                publication=_publication(body),
                error=error,
                attempts=attempts,
                at=at,
                replaying=bool(replay),
            )
            for entry, body, error, attempts, at, replay in rows[:limit]
        )
        return found, len(rows) > limit

    def _mark(self, key: _Key, entries: list[int]) -> int:
        where, args = self._where(key, entries)
        cursor = self._db.execute(f"UPDATE exceptions SET replay = 1 WHERE {where}", args)
        return cursor.rowcount

    def _purge(self, key: _Key, entries: list[int]) -> int:
        where, args = self._where(key, entries)
        cursor = self._db.execute(f"DELETE FROM exceptions WHERE {where}", args)
        sent = self._sent.get(key, {})
        for entry in entries or list(sent):
            sent.pop(entry, None)
        return cursor.rowcount

    # -- delivering again --------------------------------------------------------------------

    def _replay(self, key: _Key) -> list[Out]:
        """Deliver again what is marked for it, to the subscription's client if it is here,
        keeping at most ``WINDOW`` under way."""
        hop = self._subscriber(*key)
        sent = self._sent.setdefault(key, {})
        room = WINDOW - len(sent)
        if hop is None or room <= 0:
            return []
        rows = self._db.execute(
            "SELECT entry, body, attempts FROM exceptions "
            "WHERE owner = ? AND subscription = ? AND replay = 1 ORDER BY entry LIMIT ?",
            (*key, WINDOW),
        ).fetchall()
        out: list[Out] = []
        for entry, body, attempts in rows:
            if entry in sent:
                continue
            if len(out) >= room:
                break
            sent[entry] = hop
            out.append((hop, Retry(key[1], entry, _publication(body), attempts)))
        return out

    def _subscriber(self, owner: str, subscription: str) -> str | None:
        """The hop of the client that has ``subscription`` here now, if one does."""
        hop = self._durables.hop_of(owner, subscription)
        if hop is not None:
            return hop
        for session in self._sessions.values():
            if session.name == owner and subscription in session.subscriptions:
                return session.hop
        return None


def _publication(body: bytes) -> Publication:
    message = from_dict(orjson.loads(body))
    if not isinstance(message, Publication):
        raise JournalError("an exception queue holds something other than a publication")
    return message
