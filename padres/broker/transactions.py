"""Transactions of publications, at the publisher's broker.

A client opens a transaction (``TxBegin``), publishes in it (``TxPublish``) and commits
(``TxCommit``) or aborts (``TxAbort``) it. Subscribers choose what they see of it per
subscription (``Visibility``, ``docs/transactions.md``):

- each publication is routed at once, tagged ``pending`` (``RouteTxPublish``); the brokers of
  the subscribers deliver it to ``immediate`` subscriptions only, and composite subscriptions
  do not see it;
- the transaction's publications are kept here, bounded (``TxLimits``), until it ends;
- on commit they are written to the journal, all in the frame of the ``TxCommit`` (the
  runtime commits the journal once per frame: all of them are on disk, or none), and routed
  as guaranteed publications tagged ``committed`` (``on_commit`` and ``immediate``
  subscriptions get them, durable ones exactly once); the publisher's ``ok`` follows;
- on abort they are routed again tagged ``aborted`` (``on_abort``, ``immediate`` and
  ``deferred`` subscriptions get them), at most once as any plain publication;
- when the client asks to commit, they are routed once more first, tagged ``committing``
  (``deferred`` subscriptions get them, at most once): the producer has started its commit.

Consumers may vote on a transaction whose publications they received (``padres.broker.votes``
brings the votes here). One may mark it rollback-only: its commit then aborts, saying who
marked it and why. The producer may name *vital* consumers when it begins it (``TxBegin.vital``):
its commit then waits until each has voted ``ready`` (``wait`` seconds at most, counted from
the commit), and aborts when one votes ``failed``, is ``gone`` (its connection ended before it
voted), or has not voted in time. The publisher's ``ok`` comes once the commit is done.

A transaction belongs to its client's name, not to its connection: a client that reconnects
within ``TxLimits.linger`` takes it up with its ``hello``. Meanwhile the advertisements of the
client's lost connection are *held*: their trees stay in place, so that the transaction's
publications can still reach every subscriber, whatever its outcome. They are withdrawn when
the client's last held transaction ends (a client that came back has advertised again by then,
in the same trees). A transaction is aborted by this broker when its client has been away
longer than ``linger``, when it has been idle longer than ``TxLimits.timeout``, when it
outgrows its limits, when a publication in it is refused (by a grant, a schema, the conformity
check, or because its id was used by the publisher before), when the advertisement one of its
publications needs is withdrawn, and when the ``TxCommit`` counts other publications than
arrived (some lost with a connection); the client is told (``TxEnded``) if it is connected.
The outcome of the last ``TxLimits.remembered`` transactions is kept, so that a commit sent
again after a lost acknowledgement is answered as the first was; a committed transaction is
also found in the journal after a restart (by its publications: an empty one is not). Open
transactions do not survive a restart of this broker: their commit is then refused as unknown.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from padres.broker.journal import Journal, Tag
from padres.broker.routes import Out
from padres.broker.session import Session
from padres.model.codec import encode
from padres.model.messages import Publication
from padres.model.protocol import (
    Envelope,
    Error,
    Ok,
    Outcome,
    RouteTxVote,
    TxAbort,
    TxBegin,
    TxCommit,
    TxEnded,
    TxPublish,
    Vote,
)

__all__ = ["Deliver", "Transactions", "TxLimits", "Withdraw"]

Deliver = Callable[[Publication, str, str, int, Tag], list[Out]]
"""Routes a transactional publication: (publication, tree, source hop, position, tag)."""
Withdraw = Callable[[str], list[Out]]
"""Withdraws a held advertisement (by its overlay-wide id)."""

SEPARATOR: Final = ":"
"""Between the client's name and its id for a transaction, in the overlay-wide id."""


@dataclass(frozen=True, slots=True)
class TxLimits:
    """What a broker allows transactions, and how long it waits for them."""

    max_open: int = 100
    """Open transactions per client."""
    max_publications: int = 10_000
    """Publications in one transaction, at most."""
    max_bytes: int = 16 << 20
    """Bytes of publications (encoded) in one transaction."""
    max_total_bytes: int = 256 << 20
    """Bytes of publications in all the open transactions of the broker."""
    max_client_bytes: int = 32 << 20
    """Bytes of publications in all the open transactions of one client: a fraction of the
    broker's, so that no client can take all of it from the others."""
    timeout: float = 60.0
    """Seconds a transaction may stay idle (nothing published, not ended) before it is
    aborted."""
    linger: float = 10.0
    """Seconds a transaction outlives its client's connection: it is aborted unless the client
    is back by then."""
    remembered: int = 10_000
    """Ended transactions whose outcome is kept (for a commit or abort sent again)."""


@dataclass
class _Open:
    owner: str
    """The client's name in the overlay (``<client>@<broker>``)."""
    tx: str
    """The client's id for it."""
    hop: str | None
    """The client's connection, while it has one."""
    touched: float
    """When it was last used."""
    away: float | None = None
    """Since when its client has been disconnected."""
    publications: list[tuple[Publication, str]] = field(default_factory=list)
    """Its publications, in order, with the tree each goes down."""
    ids: set[str] = field(default_factory=set)
    size: int = 0
    vital: tuple[str, ...] = ()
    """The consumers whose reactions its commit waits for."""
    wait: float = 10.0
    """Seconds its commit waits for them, at most."""
    ready: set[str] = field(default_factory=set)
    """The vital consumers that voted ready (as named in ``vital``)."""
    rollback: str = ""
    """Who marked it rollback-only, and why."""
    committing: float | None = None
    """Since when its commit waits for its vital consumers."""

    @property
    def gid(self) -> str:
        """Its overlay-wide id, which subscribers see."""
        return f"{self.owner}{SEPARATOR}{self.tx}"

    def named(self, voter: str) -> str | None:
        """How ``vital`` names ``voter`` (``<client>@<broker>``): in full, by its client name
        alone, or not at all (None)."""
        if voter in self.vital:
            return voter
        name = voter.rpartition("@")[0]
        return name if name in self.vital else None

    def missing(self) -> list[str]:
        """The vital consumers that have not voted ready."""
        return [name for name in self.vital if name not in self.ready]


class Transactions:
    """The open transactions of a broker's clients (see the module docstring)."""

    def __init__(
        self,
        journal: Journal,
        deliver: Deliver,
        withdraw: Withdraw,
        limits: TxLimits | None = None,
    ) -> None:
        self.journal = journal
        self.limits = limits or TxLimits()
        self._deliver = deliver
        self._withdraw = withdraw
        self._held: dict[str, list[str]] = {}
        """Per client away, the advertisements held for its open transactions."""
        self._open: dict[tuple[str, str], _Open] = {}
        self._by_gid: dict[str, _Open] = {}
        self._count: Counter[str] = Counter()
        """Open transactions per client."""
        self._size = 0
        """Bytes of publications in all open transactions."""
        self._bytes_of: Counter[str] = Counter()
        """Bytes of the open transactions of each client."""
        self._ended: dict[tuple[str, str], TxEnded] = {}
        """How recently ended transactions ended (oldest first)."""

    def __len__(self) -> int:
        return len(self._open) + len(self._held)

    def statistics(self) -> dict[str, int]:
        """Open transactions, those whose commit waits for vital consumers, their publications
        and bytes, and clients away whose advertisements are held for them."""
        return {
            "open": len(self._open),
            "committing": sum(t.committing is not None for t in self._open.values()),
            "publications": sum(len(t.publications) for t in self._open.values()),
            "bytes": self._size,
            "held": len(self._held),
        }

    # -- the client --------------------------------------------------------------------------

    def begin(self, session: Session, message: TxBegin, now: float) -> list[Out]:
        key = (session.name, message.tx)
        hop = session.hop
        if key in self._open or key in self._ended:
            return [(hop, Error(f"transaction {message.tx!r} already exists", message.tx))]
        most = self.limits.max_open
        if self._count[session.name] >= most:
            why = f"too many open transactions: a client may have {most} open at once"
            return [(hop, TxEnded(message.tx, Outcome.ABORTED, why, limit=True))]
        tx = _Open(session.name, message.tx, hop, now, vital=message.vital, wait=message.wait)
        self._open[key] = self._by_gid[tx.gid] = tx
        self._count[session.name] += 1
        return [(hop, Ok(message.tx))]

    def publish(
        self, session: Session, message: TxPublish, pub: Publication, tree: str | None, now: float
    ) -> list[Out]:
        """``pub`` (stamped with its publisher) in ``message.tx``; ``tree``: the tree of an
        advertisement it conforms to, if any."""
        tx = self._use(session, message.tx, now)
        if tx is None or tx.committing is not None:
            state = "it is committing" if tx else self._state(session.name, message.tx)
            return [(session.hop, Error(f"{state}: publication {pub.id!r} refused", pub.id))]
        if tree is None:
            why = f"publication {pub.id!r} conforms to none of your advertisements"
            return self._abort(tx, why, tell=True)
        if pub.id in tx.ids:
            why = f"publication id {pub.id!r} is used twice in it (ids must not be reused)"
            return self._abort(tx, why, tell=True)
        reused = self._reused(tx, [pub])
        if reused is not None:
            return self._abort(tx, reused, tell=True)
        size = len(encode(pub))
        limits = self.limits
        if len(tx.publications) >= limits.max_publications or tx.size + size > limits.max_bytes:
            why = (
                f"it would hold more than {limits.max_publications} publications or "
                f"{limits.max_bytes} bytes (the broker's limits)"
            )
            return self._abort(tx, why, tell=True, limit=True)
        if self._bytes_of[session.name] + size > limits.max_client_bytes:
            why = (
                f"your open transactions would hold more than {limits.max_client_bytes} bytes "
                "(the broker's limit per client): commit or abort some first"
            )
            return self._abort(tx, why, tell=True, limit=True)
        if self._size + size > limits.max_total_bytes:
            why = (
                f"the broker holds {limits.max_total_bytes} bytes of open transactions, "
                "its limit: commit or abort some first"
            )
            return self._abort(tx, why, tell=True, limit=True)
        tx.publications.append((pub, tree))
        tx.ids.add(pub.id)
        tx.size += size
        self._size += size
        self._bytes_of[session.name] += size
        return self._deliver(pub, tree, session.hop, 0, (tx.gid, Outcome.PENDING))

    def commit(self, session: Session, message: TxCommit, now: float) -> list[Out]:
        hop = session.hop
        tx = self._use(session, message.tx, now)
        if tx is None:
            return [(hop, self._ended_reply(session.name, message.tx))]
        held = len(tx.publications)
        if message.count > held:
            lost = message.count - held
            why = f"{lost} of its {message.count} publications were lost on the way"
            return self._abort(tx, why, tell=True)
        if message.count < held:
            why = f"its commit counts {message.count} publications, but the broker holds {held}"
            return self._abort(tx, why, tell=True)
        if tx.committing is not None:
            return []  # sent again while it waits for its vital consumers: answered then
        if tx.rollback:
            return self._abort(tx, f"it was marked rollback-only by {tx.rollback}", tell=True)
        # Published here since, under an id of the transaction's (as a guaranteed one, say).
        reused = self._reused(tx, [pub for pub, _ in tx.publications])
        if reused is not None:
            return self._abort(tx, reused, tell=True)
        out: list[Out] = []
        for pub, tree in tx.publications:
            out += self._deliver(pub, tree, hop, 0, (tx.gid, Outcome.COMMITTING))
        if tx.missing():
            tx.committing = now
            return out
        return out + self._commit(tx, now)

    def vote(self, vote: RouteTxVote, now: float) -> list[Out]:
        """A consumer's vote has reached this broker, the producer's."""
        tx = self._by_gid.get(vote.tx)
        if tx is None:
            return []  # over already: a late vote changes nothing
        why = f" ({vote.reason})" if vote.reason else ""
        if vote.vote is Vote.ROLLBACK:
            tx.rollback = tx.rollback or f"{vote.voter}{why}"
            if tx.committing is None:
                return []
            return self._abort(tx, f"it was marked rollback-only by {tx.rollback}", tell=True)
        name = tx.named(vote.voter)
        if name is None:
            return []  # not one its producer waits for
        if vote.vote is Vote.READY:
            tx.ready.add(name)
            if tx.committing is not None and not tx.missing():
                return self._commit(tx, now)
            return []
        what = "failed" if vote.vote is Vote.FAILED else "is gone"
        return self._abort(tx, f"its vital consumer {vote.voter} {what}{why}", tell=True)

    def _commit(self, tx: _Open, now: float) -> list[Out]:
        """Write ``tx``'s publications to the journal and send them down their trees as
        committed; its client is answered."""
        if tx.committing is not None:  # it waited: an id may have been used meanwhile
            reused = self._reused(tx, [pub for pub, _ in tx.publications])
            if reused is not None:
                return self._abort(tx, reused, tell=True)
        hop = tx.hop or ""
        with self.journal.atomic():  # all of them, or none if the disk fails
            positions = [self.journal.append(t, pub, now, tx.gid)[0] for pub, t in tx.publications]
        out: list[Out] = []
        for (pub, tree), position in zip(tx.publications, positions, strict=True):
            out += self._deliver(pub, tree, hop, position, (tx.gid, Outcome.COMMITTED))
        ended = TxEnded(tx.tx, Outcome.COMMITTED)
        answer = [(tx.hop, Ok(tx.tx))] if tx.hop is not None else []
        return [*out, *answer, *self._end(tx, ended)]

    def abort(self, session: Session, message: TxAbort, now: float) -> list[Out]:
        hop = session.hop
        tx = self._use(session, message.tx, now)
        if tx is not None:
            return [*self._abort(tx, "aborted by its client"), (hop, Ok(message.tx))]
        ended = self._ended.get((session.name, message.tx))
        if ended is not None and ended.outcome is Outcome.ABORTED:
            return [(hop, Ok(message.tx))]
        return [(hop, Error(self._state(session.name, message.tx), message.tx))]

    def refused(self, session: Session, message: Envelope, why: str) -> list[Out]:
        """``message`` was refused (by a grant or a schema) for ``why``: if it is a
        publication in a transaction, the transaction is aborted, saying so."""
        if not isinstance(message, TxPublish):
            return []
        tx = self._open.get((session.name, message.tx))
        if tx is None:
            return []
        why = f"a publication in it was refused: {why}"
        return self._abort(tx, why, tell=True)

    def resume(self, session: Session, now: float) -> None:
        """The client is back (on ``session``): its open transactions go on with it, as if
        used now."""
        for tx in self._open.values():
            if tx.owner == session.name:
                tx.hop, tx.away, tx.touched = session.hop, None, now

    def withdrawing(self, tree: str, delivered: Callable[[Publication], bool]) -> list[Out]:
        """An advertisement of ``tree`` is about to be withdrawn, after which the tree takes
        only the publications that ``delivered`` accepts: the open transactions holding one
        it does not are aborted now, while their publications can still go down the tree."""
        out: list[Out] = []
        for tx in list(self._open.values()):
            lost = next((p for p, t in tx.publications if t == tree and not delivered(p)), None)
            if lost is not None:
                why = f"the advertisement its publication {lost.id!r} conforms to was withdrawn"
                out += self._abort(tx, why, tell=True)
        return out

    def hold(self, session: Session, advertisements: list[str], now: float) -> bool:
        """The client's connection is lost: its open transactions wait ``linger`` for it, and
        ``advertisements`` (its advertisements' overlay-wide ids) are held until they end.
        False if it has none open: the advertisements are not held."""
        waiting = [t for t in self._open.values() if t.hop == session.hop]
        for tx in waiting:
            tx.hop, tx.away = None, now
        if waiting:
            self._held.setdefault(session.name, []).extend(advertisements)
        return bool(waiting)

    def expire(self, now: float) -> list[Out]:
        """Abort the transactions whose client has been away, or that have been idle, too
        long."""
        out: list[Out] = []
        limits = self.limits
        for tx in list(self._open.values()):
            if tx.committing is not None and now - tx.committing >= tx.wait:
                late = ", ".join(tx.missing())
                why = f"its vital consumers {late} did not report ready within {tx.wait:g} s"
                out += self._abort(tx, why, tell=True)
            elif tx.away is not None and now - tx.away >= limits.linger:
                why = f"its client was disconnected for more than {limits.linger:g} s"
                out += self._abort(tx, why)
            elif tx.committing is None and now - tx.touched >= limits.timeout:
                why = f"it was idle for more than {limits.timeout:g} s"
                out += self._abort(tx, why, tell=True)
        return out

    # -- internals ---------------------------------------------------------------------------

    def _use(self, session: Session, tx_id: str, now: float) -> _Open | None:
        """The open transaction ``tx_id`` of the session's client, used now on its connection
        (a client back after a lost connection takes it up)."""
        tx = self._open.get((session.name, tx_id))
        if tx is not None:
            tx.hop, tx.away, tx.touched = session.hop, None, now
        return tx

    def _reused(self, tx: _Open, pubs: list[Publication]) -> str | None:
        """Why ``tx`` cannot take ``pubs``: one's id is in the journal already, under the same
        publisher (its committed copy would be taken for that one sent again)."""
        for pub in pubs:
            if self.journal.recorded(pub.publisher, pub.id):
                why = f"publication id {pub.id!r} was used by {tx.owner} already"
                return f"{why} (ids must not be reused)"
        return None

    def _state(self, owner: str, tx_id: str) -> str:
        ended = self._ended.get((owner, tx_id))
        if ended is None:
            return f"no transaction {tx_id!r}"
        return f"transaction {tx_id!r} is {ended.outcome.value}"

    def _ended_reply(self, owner: str, tx_id: str) -> Ok | Error | TxEnded:
        """The answer to a commit of a transaction that is not open."""
        ended = self._ended.get((owner, tx_id))
        if ended is None:
            if self.journal.committed(f"{owner}{SEPARATOR}{tx_id}"):
                return Ok(tx_id)  # committed before this broker restarted
            return Error(f"no transaction {tx_id!r} (a restart of the broker ends them)", tx_id)
        if ended.outcome is Outcome.COMMITTED:
            return Ok(tx_id)  # committed: the acknowledgement was lost with a connection
        return ended

    def _abort(self, tx: _Open, why: str, *, tell: bool = False, limit: bool = False) -> list[Out]:
        """End ``tx`` as aborted: its publications go to those who see aborted ones; ``tell``:
        its client learns why."""
        out: list[Out] = []
        for pub, tree in tx.publications:
            out += self._deliver(pub, tree, tx.hop or "", 0, (tx.gid, Outcome.ABORTED))
        ended = TxEnded(tx.tx, Outcome.ABORTED, why, limit=limit)
        if tell and tx.hop is not None:
            out.append((tx.hop, ended))
        return out + self._end(tx, ended)

    def _end(self, tx: _Open, ended: TxEnded) -> list[Out]:
        """Forget ``tx`` but how it ended; the client's held advertisements are withdrawn
        once its last transaction ends (after what the transaction sent)."""
        key = (tx.owner, tx.tx)
        del self._open[key]
        del self._by_gid[tx.gid]
        self._size -= tx.size
        self._bytes_of[tx.owner] -= tx.size
        if not self._bytes_of[tx.owner]:
            del self._bytes_of[tx.owner]
        self._count[tx.owner] -= 1
        self._ended[key] = ended
        if len(self._ended) > self.limits.remembered:
            del self._ended[next(iter(self._ended))]
        if self._count[tx.owner]:
            return []
        del self._count[tx.owner]
        out: list[Out] = []
        for gid in self._held.pop(tx.owner, ()):
            out += self._withdraw(gid)
        return out
