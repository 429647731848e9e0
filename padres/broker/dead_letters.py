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

This module decides what goes into a queue and out of it, and what is answered; the journal
keeps the queues (``Journal.add_dead_letter`` and the others).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from padres.broker.durable import Durables
from padres.broker.journal import Journal, dead_letter_size
from padres.broker.routes import Out
from padres.broker.session import Session, stamped
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

__all__ = ["MAX_BYTES", "MAX_ENTRIES", "MAX_ERROR", "WINDOW", "DeadLetterQueues"]

MAX_ENTRIES: Final = 10_000
"""Entries an exception queue keeps, at most (the oldest are dropped past it)."""
MAX_BYTES: Final = 64 << 20
"""Bytes (publications and error texts) an exception queue keeps, at most."""
MAX_ERROR: Final = 4096
"""Characters of an error text kept (the rest is cut)."""
WINDOW: Final = 100
"""Entries of a queue being delivered again (``Retry``) at a time."""

_Key = tuple[str, str]
"""(client name in the overlay, subscription id): one queue."""


class DeadLetterQueues:
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
        self._journal = journal
        self._durables = durables
        self._sessions = sessions
        self._broker = broker_id
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._sent: dict[_Key, dict[int, str]] = {}
        """Per queue, the entries delivered again and not answered yet, and the hop of each."""

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
        return [
            {
                "client": queue.owner.removesuffix(f"@{self._broker}"),
                "subscription": queue.subscription,
                "length": queue.length,
                "bytes": queue.size,
                "replaying": queue.replaying,
                "dropped": queue.dropped,
            }
            for queue in self._journal.dead_letter_queues()
        ]

    # -- failures ----------------------------------------------------------------------------

    def _failed(self, message: Failed, session: Session, now: float) -> list[Out]:
        key = (session.name, message.subscription)
        ok: list[Out] = [(session.hop, Ok(message.ref))]
        error = message.error[:MAX_ERROR].replace("\x00", "\ufffd")  # SQL text takes no NUL
        if message.entry:
            self._sent.get(key, {}).pop(message.entry, None)
            self._journal.update_dead_letter(
                *key, message.entry, error, message.attempts, now
            )  # an entry purged while it was delivered again stays purged
            self._bound(key)
            return ok + self._replay(key)
        durable = self._durables.has(*key)
        if not durable and message.subscription not in session.subscriptions:
            why = f"no subscription {message.subscription!r} to put an exception entry for"
            return [(session.hop, Error(why, message.ref))]
        known = self._journal.has_dead_letter(*key, message.ref)
        # A durable delivery acknowledged already was processed: handled, or set aside by an
        # earlier failure; this one is its handler's second try after a reconnection.
        again = durable and 0 < message.seq <= self._durables.acked(*key)
        if not known and not again:
            publication = self._kept(message, session)
            size = dead_letter_size(publication, error)
            if size > self.max_bytes:
                why = (
                    f"exception entry of {size:,} bytes refused: the exception queue of "
                    f"{message.subscription!r} keeps {self.max_bytes:,} bytes"
                )
                return [(session.hop, Error(why, message.ref))]
            self._journal.add_dead_letter(
                *key, message.ref, publication, error, message.attempts, now
            )
            self._bound(key)
        out: list[Out] = []
        if durable and message.seq:
            out = self._durables.ack(session.name, Ack(message.subscription, message.seq))
        return out + ok

    def _kept(self, message: Failed, session: Session) -> Publication:
        """What an entry keeps: the delivery as queued here, for a durable subscription's;
        else the publication the client reports, under the client's own name as publisher,
        since nothing here vouches for the publisher it claims."""
        if message.seq:
            queued = self._durables.delivery(session.name, message.subscription, message.seq)
            if isinstance(queued, Publication):
                return queued
        return stamped(message.publication, session)

    def _bound(self, key: _Key) -> None:
        """Drop the oldest entries of the queue while it is over its limits."""
        sent = self._sent.get(key, {})
        for entry in self._journal.trim_dead_letters(*key, self.max_entries, self.max_bytes):
            sent.pop(entry, None)

    # -- requests ----------------------------------------------------------------------------

    def _request(self, message: Exceptions, session: Session) -> list[Out]:
        owner = f"{message.client}@{self._broker}" if message.client else session.name
        key = (owner, message.subscription)
        entries = sorted(set(message.entries))
        if entries and message.action is not ExceptionAction.PURGE:
            found = self._journal.dead_letters(*key, len(entries), entries=entries)
            missing = sorted(set(entries) - {entry.id for entry in found})
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
                rows = self._journal.dead_letters(
                    *key, message.limit + 1, entries=entries, after=message.after
                )
                listed_entries, more = tuple(rows[: message.limit]), len(rows) > message.limit
            case ExceptionAction.REPLAY:
                affected = self._journal.mark_dead_letters(*key, entries)
                out = self._replay(key)
            case ExceptionAction.PURGE:
                affected = self._journal.purge_dead_letters(*key, entries)
                sent = self._sent.get(key, {})
                for entry in entries or list(sent):
                    sent.pop(entry, None)
                if session.name == owner:  # the subscriber's handler took it: more may go
                    out = self._replay(key)
        queue = self._journal.dead_letter_queue(*key)
        report = ExceptionReport(
            message.ref,
            message.subscription,
            listed_entries,
            more,
            affected,
            queue.length,
            queue.size,
            queue.dropped,
        )
        return [*out, (session.hop, report)]

    # -- delivering again --------------------------------------------------------------------

    def _replay(self, key: _Key) -> list[Out]:
        """Deliver again what is marked for it, to the subscription's client if it is here,
        keeping at most ``WINDOW`` under way."""
        hop = self._subscriber(*key)
        sent = self._sent.setdefault(key, {})
        room = WINDOW - len(sent)
        if hop is None or room <= 0:
            return []
        out: list[Out] = []
        for entry in self._journal.dead_letters(*key, WINDOW, marked=True):
            if entry.id in sent:
                continue
            if len(out) >= room:
                break
            sent[entry.id] = hop
            out.append((hop, Retry(key[1], entry.id, entry.publication, entry.attempts)))
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
