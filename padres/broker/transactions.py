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

A consumer's transaction may *join* a producer's (``TxBegin.join``, a shared context): it is
then a *part* of it, kept at the consumer's broker, whose publications are the producer's
transaction's (tagged with its id) and end with it; the producer's commit waits for every part
it took to be done. ``padres.broker.parts`` describes the protocol between the two brokers and
what a crash of either does; both sides are kept here.

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

from msgspec.structs import replace

from padres.broker.journal import Journal, PreparedPart, Tag
from padres.broker.parts import ASK_EVERY, MAX_PARTS, Joined, Link, Ways, extended
from padres.broker.routes import Out
from padres.broker.session import Session
from padres.broker.votes import Votes
from padres.model.codec import encode
from padres.model.messages import Publication
from padres.model.protocol import (
    MAX_PATH,
    MAX_REASON,
    Envelope,
    Error,
    Ok,
    Outcome,
    PartState,
    RouteTxOutcome,
    RouteTxPart,
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
    """Since when its commit waits for its vital consumers and parts."""
    parts: dict[str, Joined] = field(default_factory=dict)
    """The parts that joined it, by their overlay-wide ids."""
    link: Link | None = None
    """For a part of another broker's transaction: what it knows of that one."""

    @property
    def gid(self) -> str:
        """Its overlay-wide id."""
        return f"{self.owner}{SEPARATOR}{self.tx}"

    @property
    def tagged(self) -> str:
        """The transaction its publications belong to, which subscribers see: its own, or
        the one it joined."""
        return self.gid if self.link is None else self.link.joins

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

    def unfinished(self) -> list[str]:
        """The parts that are not done."""
        return [part for part, joined in self.parts.items() if not joined.prepared]


class Transactions:
    """The open transactions of a broker's clients, and their parts (see the module
    docstring)."""

    def __init__(
        self,
        journal: Journal,
        deliver: Deliver,
        withdraw: Withdraw,
        limits: TxLimits | None = None,
        *,
        ways: Ways,
        votes: Votes,
        clock: Callable[[], float],
    ) -> None:
        """``ways``: how the messages of parts travel; ``votes``: the consumers' votes passing
        through this broker (where a part's publications came from, who owes a vote);
        ``clock``: the broker's time, for what the messages of parts set off."""
        self.journal = journal
        self._clock = clock
        self.limits = limits or TxLimits()
        self._deliver = deliver
        self._withdraw = withdraw
        self._ways = ways
        self._votes = votes
        self._held: dict[str, list[str]] = {}
        """Per client away, the advertisements held for its open transactions."""
        self._open: dict[tuple[str, str], _Open] = {}
        self._by_gid: dict[str, _Open] = {}
        self._parts_of: dict[str, list[_Open]] = {}
        """Per transaction of another broker, the parts of it held here."""
        self._count: Counter[str] = Counter()
        """Open transactions per client."""
        self._size = 0
        """Bytes of publications in all open transactions."""
        self._bytes_of: Counter[str] = Counter()
        """Bytes of the open transactions of each client."""
        self._ended: dict[str, TxEnded] = {}
        """How recently ended transactions ended, by overlay-wide id (oldest first)."""

    def __len__(self) -> int:
        return len(self._open) + len(self._held)

    def statistics(self) -> dict[str, int]:
        """Open transactions (parts included), those whose commit waits for vital consumers or
        parts, their publications and bytes, clients away whose advertisements are held for
        them; the parts that joined this broker's open transactions (``joined``), and those of
        them not done yet (``unfinished``); the parts of other brokers' transactions held here
        (``parts``), and those of them that are done (``prepared``)."""
        return {
            "open": len(self._open),
            "committing": sum(t.committing is not None for t in self._open.values()),
            "publications": sum(len(t.publications) for t in self._open.values()),
            "bytes": self._size,
            "held": len(self._held),
            "joined": sum(len(t.parts) for t in self._open.values()),
            "unfinished": sum(len(t.unfinished()) for t in self._open.values()),
            "parts": sum(len(parts) for parts in self._parts_of.values()),
            "prepared": sum(p.link is not None and p.link.prepared for p in self._open.values()),
        }

    def restore(self) -> None:
        """Take up the prepared parts the journal holds (this broker restarted): each waits
        for the outcome of its transaction, and asks for it at the next tick."""
        for part in self.journal.prepared():
            link = Link(part.joins, "", part.path, taken=True, prepared=True)
            tx = _Open(part.owner, part.tx, None, 0.0, link=link)
            self._open[part.owner, part.tx] = self._by_gid[tx.gid] = tx
            self._parts_of.setdefault(part.joins, []).append(tx)
            self._count[part.owner] += 1
            for pub, tree in part.publications:
                size = len(encode(pub))
                tx.publications.append((pub, tree))
                tx.ids.add(pub.id)
                tx.size += size
                self._size += size
                self._bytes_of[part.owner] += size

    # -- the client --------------------------------------------------------------------------

    def begin(self, session: Session, message: TxBegin, now: float) -> list[Out]:
        hop = session.hop
        tx = _Open(session.name, message.tx, hop, now, vital=message.vital, wait=message.wait)
        if tx.gid in self._by_gid or tx.gid in self._ended:
            return [(hop, Error(f"transaction {message.tx!r} already exists", message.tx))]
        most = self.limits.max_open
        if self._count[session.name] >= most:
            why = f"too many open transactions: a client may have {most} open at once"
            return [(hop, TxEnded(message.tx, Outcome.ABORTED, why, limit=True))]
        if message.join:
            tree = self._votes.tree_of(message.join)
            found = None if tree is None else self._votes.trees.get(tree)
            if tree is None or found is None:
                why = f"no open transaction {message.join!r} whose publications reached this broker"
                return [(hop, Error(why, message.tx))]
            if len(found.path) > MAX_PATH:
                why = f"transaction {message.join!r} is more than {MAX_PATH} brokers away"
                return [(hop, Error(why, message.tx))]
            # Up the tree, to its root: the transaction's broker, or a part's that passes it on.
            tx.link = Link(message.join, tree, tuple(reversed(found.path)))
            self._parts_of.setdefault(message.join, []).append(tx)
        self._open[session.name, message.tx] = self._by_gid[tx.gid] = tx
        self._count[session.name] += 1
        if tx.link is not None:
            return self._report(tx, PartState.JOIN)  # answered when it is taken
        return [(hop, Ok(message.tx))]

    def publish(
        self, session: Session, message: TxPublish, pub: Publication, tree: str | None, now: float
    ) -> list[Out]:
        """``pub`` (stamped with its publisher) in ``message.tx``; ``tree``: the tree of an
        advertisement it conforms to, if any."""
        tx = self._use(session, message.tx, now)
        if tx is None or tx.committing is not None or (tx.link and not _takes(tx.link)):
            state = self._state(session.name, message.tx) if tx is None else _busy(tx)
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
        out = self._deliver(pub, tree, session.hop, 0, (tx.tagged, Outcome.PENDING))
        if tx.link is not None and tx.link.committing:  # the transaction's commit has started
            out += self._deliver(pub, tree, session.hop, 0, (tx.tagged, Outcome.COMMITTING))
        return out

    def commit(self, session: Session, message: TxCommit, now: float) -> list[Out]:
        hop = session.hop
        tx = self._use(session, message.tx, now)
        if tx is None:
            return [(hop, self._ended_reply(session.name, message.tx))]
        if tx.link is not None and tx.link.prepared:
            return [(hop, Ok(message.tx))]  # sent again after a lost answer
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
        if tx.link is not None:
            return self._prepare(tx, now)
        if tx.rollback:
            return self._abort(tx, f"it was marked rollback-only by {tx.rollback}", tell=True)
        # Published here since, under an id of the transaction's (as a guaranteed one, say).
        reused = self._reused(tx, [pub for pub, _ in tx.publications])
        if reused is not None:
            return self._abort(tx, reused, tell=True)
        out: list[Out] = []
        for pub, tree in tx.publications:
            out += self._deliver(pub, tree, hop, 0, (tx.gid, Outcome.COMMITTING))
        if tx.missing() or tx.unfinished():
            tx.committing = now
            for part in tx.parts:
                out += self._decide(tx, part, Outcome.COMMITTING)
            return out
        return out + self._commit(tx, now)

    def vote(self, vote: RouteTxVote, now: float) -> list[Out]:
        """A consumer's vote has reached this broker, the root of the tree it went up: the
        producer's, or that of a part of the transaction (which sends it on)."""
        tx = self._transaction(vote.tx)
        if tx is None:
            return self._pass_vote(vote)
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
            return self._commit_if_ready(tx, now)
        what = "failed" if vote.vote is Vote.FAILED else "is gone"
        return self._abort(tx, f"its vital consumer {vote.voter} {what}{why}", tell=True)

    def abort(self, session: Session, message: TxAbort, now: float) -> list[Out]:
        hop = session.hop
        tx = self._use(session, message.tx, now)
        if tx is not None and tx.link is not None and tx.link.prepared:
            return [(hop, Error(f"{_busy(tx)}: it cannot be aborted", message.tx))]
        if tx is not None:
            return [*self._abort(tx, "aborted by its client"), (hop, Ok(message.tx))]
        ended = self._ended.get(f"{session.name}{SEPARATOR}{message.tx}")
        if ended is not None and ended.outcome is Outcome.ABORTED:
            return [(hop, Ok(message.tx))]
        return [(hop, Error(self._state(session.name, message.tx), message.tx))]

    def refused(self, session: Session, message: Envelope, why: str) -> list[Out]:
        """``message`` was refused (by a grant or a schema) for ``why``: if it is a
        publication in a transaction, the transaction is aborted, saying so."""
        if not isinstance(message, TxPublish):
            return []
        tx = self._open.get((session.name, message.tx))
        if tx is None or (tx.link is not None and tx.link.prepared):
            return []
        why = f"a publication in it was refused: {why}"
        return self._abort(tx, why, tell=True)

    def resume(self, session: Session, now: float) -> None:
        """The client is back (on ``session``): its open transactions go on with it, as if
        used now."""
        for tx in self._open.values():
            if tx.owner == session.name:
                tx.hop, tx.away, tx.touched = session.hop, None, now

    def bound(self, tree: str, delivered: Callable[[Publication], bool]) -> str | None:
        """Why an advertisement of ``tree`` cannot be withdrawn now (after which the tree takes
        only the publications that ``delivered`` accepts): a prepared part holds a publication
        that needs it, and must be able to send it down once its transaction ends. None if
        none does."""
        for tx in self._open.values():
            if tx.link is None or not tx.link.prepared:
                continue
            if any(t == tree and not delivered(p) for p, t in tx.publications):
                return (
                    f"part {tx.tx!r} of transaction {tx.link.joins} is done and needs it until "
                    "that transaction ends"
                )
        return None

    def withdrawing(self, tree: str, delivered: Callable[[Publication], bool]) -> list[Out]:
        """An advertisement of ``tree`` is about to be withdrawn, after which the tree takes
        only the publications that ``delivered`` accepts: the open transactions holding one
        it does not are aborted now, while their publications can still go down the tree
        (prepared parts are not: ``bound`` keeps the advertisement)."""
        out: list[Out] = []
        for tx in list(self._open.values()):
            if tx.link is not None and tx.link.prepared:
                continue
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
        long, and those whose commit waited too long; prepared parts ask how their
        transactions ended."""
        out: list[Out] = []
        limits = self.limits
        for tx in list(self._open.values()):
            if tx.link is not None and tx.link.prepared:
                if now - tx.link.asked >= ASK_EVERY:
                    tx.link.asked = now
                    out += self._report(tx, PartState.ASK)
            elif tx.committing is not None and now - tx.committing >= tx.wait:
                out += self._abort(tx, _late(tx), tell=True)
            elif tx.away is not None and now - tx.away >= limits.linger:
                why = f"its client was disconnected for more than {limits.linger:g} s"
                out += self._abort(tx, why)
            elif tx.committing is None and now - tx.touched >= limits.timeout:
                why = f"it was idle for more than {limits.timeout:g} s"
                out += self._abort(tx, why, tell=True)
        return out

    # -- parts, between brokers --------------------------------------------------------------

    def part_message(self, message: RouteTxPart) -> list[Out]:
        """A part's message (from a neighbour, or from this broker) on its way along its path
        to the transaction's broker."""
        way = self._ways.along(message.path, forward=True)
        if way is None:
            return []  # the way is lost: the part asks again, or the commit times out
        if way:
            return [(way, message)]
        tx = self._transaction(message.tx)
        if tx is not None:
            return self._reported(tx, message)
        if message.state in (PartState.JOIN, PartState.ABORTED):
            return self._pass_on(message)  # not yet taken: its path may go on from here
        # A prepared part's (it asks, or says it is prepared) about a transaction that ended.
        ended = self._ended.get(message.tx)
        if ended is not None:
            return self._answer(message, ended.outcome, ended.reason)
        if self.journal.committed(message.tx):
            return self._answer(message, Outcome.COMMITTED)
        why = "its broker does not know it (it was lost with a restart, before it committed)"
        return self._answer(message, Outcome.ABORTED, why)

    def outcome_message(self, message: RouteTxOutcome) -> list[Out]:
        """The transaction's broker's word to a part (from a neighbour, or from this broker) on
        its way back along its path."""
        way = self._ways.along(message.path, forward=False)
        if way is None:
            return []
        if way:
            return [(way, message)]
        part = self._by_gid.get(message.part)
        if part is None or part.link is None or part.link.joins != message.tx:
            return []  # over already
        link = part.link
        if not link.taken:
            if message.refused or message.outcome in (Outcome.COMMITTED, Outcome.ABORTED):
                why = f"cannot join transaction {message.tx}: {message.reason}"
                ended = TxEnded(part.tx, Outcome.ABORTED, why)
                told = [(part.hop, ended)] if part.hop is not None else []
                return told + self._end(part, ended)
            link.taken, link.path = True, message.path
            link.committing = message.outcome is Outcome.COMMITTING
            return [(part.hop, Ok(part.tx))] if part.hop is not None else []
        if message.refused:
            return []  # a join answered twice
        if message.outcome is Outcome.COMMITTING:
            return self._committing(part)
        if message.outcome is Outcome.COMMITTED:
            return self._commit_part(part, self._clock()) if link.prepared else []
        if message.outcome is Outcome.ABORTED:
            why = f"the transaction it joined, {message.tx}, was aborted: {message.reason}"
            return self._abort(part, why[:MAX_REASON], tell=True, report=False)
        return []

    # -- internals ---------------------------------------------------------------------------

    def _transaction(self, gid: str) -> _Open | None:
        """The open transaction ``gid`` of a client of this broker (not a part)."""
        tx = self._by_gid.get(gid)
        return tx if tx is not None and tx.link is None else None

    def _use(self, session: Session, tx_id: str, now: float) -> _Open | None:
        """The open transaction ``tx_id`` of the session's client, used now on its connection
        (a client back after a lost connection takes it up)."""
        tx = self._open.get((session.name, tx_id))
        if tx is not None:
            tx.hop, tx.away, tx.touched = session.hop, None, now
        return tx

    def _commit_if_ready(self, tx: _Open, now: float) -> list[Out]:
        """Commit ``tx`` if its commit waits and has nothing more to wait for."""
        if tx.committing is not None and not tx.missing() and not tx.unfinished():
            return self._commit(tx, now)
        return []

    def _commit(self, tx: _Open, now: float) -> list[Out]:
        """Write ``tx``'s publications to the journal and send them down their trees as
        committed; its client is answered, and its parts told."""
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
        out += [*answer, *self._end(tx, ended)]
        for part in tx.parts:
            out += self._decide(tx, part, Outcome.COMMITTED)
        return out

    def _reused(self, tx: _Open, pubs: list[Publication]) -> str | None:
        """Why ``tx`` cannot take ``pubs``: one's id is in the journal already, under the same
        publisher (its committed copy would be taken for that one sent again)."""
        for pub in pubs:
            if self.journal.recorded(pub.publisher, pub.id):
                why = f"publication id {pub.id!r} was used by {tx.owner} already"
                return f"{why} (ids must not be reused)"
        return None

    def _state(self, owner: str, tx_id: str) -> str:
        ended = self._ended.get(f"{owner}{SEPARATOR}{tx_id}")
        if ended is None:
            return f"no transaction {tx_id!r}"
        return f"transaction {tx_id!r} is {ended.outcome.value}"

    def _ended_reply(self, owner: str, tx_id: str) -> Ok | Error | TxEnded:
        """The answer to a commit of a transaction that is not open."""
        gid = f"{owner}{SEPARATOR}{tx_id}"
        ended = self._ended.get(gid)
        if ended is None:
            if self.journal.committed(gid):
                return Ok(tx_id)  # committed before this broker restarted
            return Error(f"no transaction {tx_id!r} (a restart of the broker ends them)", tx_id)
        if ended.outcome is Outcome.COMMITTED:
            return Ok(tx_id)  # committed: the acknowledgement was lost with a connection
        return ended

    def _abort(
        self,
        tx: _Open,
        why: str,
        *,
        tell: bool = False,
        limit: bool = False,
        report: bool = True,
    ) -> list[Out]:
        """End ``tx`` as aborted: its publications go to those who see aborted ones; ``tell``:
        its client learns why. The parts of a transaction learn it; the transaction of a part
        learns it too (``report``), and is aborted with it, unless the part was prepared (then
        the transaction aborted it)."""
        out: list[Out] = []
        for pub, tree in tx.publications:
            out += self._deliver(pub, tree, tx.hop or "", 0, (tx.tagged, Outcome.ABORTED))
        ended = TxEnded(tx.tx, Outcome.ABORTED, why, limit=limit)
        if tell and tx.hop is not None:
            out.append((tx.hop, ended))
        link = tx.link
        if link is not None and link.prepared:
            self.journal.settle(tx.owner, tx.tx)
        out += self._end(tx, ended)  # before the other side hears of it: it may be here
        if link is not None and report and not link.prepared:
            out += self._report(tx, PartState.ABORTED, why)
        for part in tx.parts:
            out += self._decide(tx, part, Outcome.ABORTED, why)
        return out

    def _end(self, tx: _Open, ended: TxEnded) -> list[Out]:
        """Forget ``tx`` but how it ended; the client's held advertisements are withdrawn
        once its last transaction ends (after what the transaction sent)."""
        del self._open[tx.owner, tx.tx]
        del self._by_gid[tx.gid]
        if tx.link is not None:
            parts = self._parts_of[tx.link.joins]
            parts.remove(tx)
            if not parts:
                del self._parts_of[tx.link.joins]
        self._size -= tx.size
        self._bytes_of[tx.owner] -= tx.size
        if not self._bytes_of[tx.owner]:
            del self._bytes_of[tx.owner]
        self._count[tx.owner] -= 1
        self._ended[tx.gid] = ended
        if len(self._ended) > self.limits.remembered:
            del self._ended[next(iter(self._ended))]
        if self._count[tx.owner]:
            return []
        del self._count[tx.owner]
        out: list[Out] = []
        for gid in self._held.pop(tx.owner, ()):
            out += self._withdraw(gid)
        return out

    # -- internals: the transaction's side of its parts --------------------------------------

    def _reported(self, tx: _Open, message: RouteTxPart) -> list[Out]:
        """A part's message has reached ``tx``'s broker."""
        joined = tx.parts.get(message.part)
        if message.state is PartState.JOIN:
            if joined is not None:  # asked again: answered again
                return self._answer(message, _standing(tx))
            name = tx.named(message.voter)
            if tx.committing is not None and name not in tx.missing():
                why = "its commit has started: only a vital consumer it waits for may join it now"
                return self._answer(message, Outcome.COMMITTING, why, refused=True)
            if len(tx.parts) >= MAX_PARTS:
                why = f"it has {MAX_PARTS} parts, the most a transaction takes"
                return self._answer(message, _standing(tx), why, refused=True)
            tx.parts[message.part] = Joined(message.voter, message.path)
            return self._answer(message, _standing(tx))
        if joined is None:
            return []  # a part it never took (its join was lost): nothing hangs on it
        if message.state is PartState.ABORTED:
            why = f"its part {message.part} was aborted"
            why = f"{why} ({message.reason})" if message.reason else why
            return self._abort(tx, why[:MAX_REASON], tell=True)
        # Prepared (or asking, which a prepared part does: its first word may have been lost).
        joined.prepared = True
        name = tx.named(joined.voter)
        if name is not None:
            tx.ready.add(name)  # a vital consumer's part that is done is its "ready"
        return self._commit_if_ready(tx, self._clock())

    def _decide(self, tx: _Open, part: str, outcome: Outcome, why: str = "") -> list[Out]:
        """Tell ``tx``'s part ``part`` that ``tx``'s commit started, or how ``tx`` ended."""
        joined = tx.parts[part]
        word = RouteTxOutcome(tx.gid, part, outcome, joined.path, reason=why[:MAX_REASON])
        return self.outcome_message(word)

    def _answer(
        self, message: RouteTxPart, outcome: Outcome, why: str = "", *, refused: bool = False
    ) -> list[Out]:
        """Answer a part's ``message``, back along its path."""
        answer = RouteTxOutcome(
            message.tx, message.part, outcome, message.path, refused, why[:MAX_REASON]
        )
        return self.outcome_message(answer)

    def _pass_on(self, message: RouteTxPart) -> list[Out]:
        """A join (or the abort of a part not yet taken) has reached the end of its path, the
        root of the tree it went up, where the transaction is not open: if a part of it here
        made the publications the joining client saw, it goes on along that part's path. A
        join is refused otherwise."""
        onward = next(
            (
                p.link.path
                for p in self._parts_of.get(message.tx, ())
                if p.link is not None and p.link.taken and p.gid != message.part
                if p.link.path[-1] != self._ways.id
            ),
            None,
        )
        ended = self._ended.get(message.tx)
        if ended is None and onward is not None:
            path = extended(message.path, onward)
            if len(path) <= MAX_PATH:
                return self.part_message(replace(message, path=path))
        if message.state is not PartState.JOIN:
            return []
        if ended is not None:
            why = f"it is {ended.outcome.value}"
            return self._answer(message, ended.outcome, why, refused=True)
        why = "it is over, or unknown to its broker"
        return self._answer(message, Outcome.ABORTED, why, refused=True)

    def _pass_vote(self, vote: RouteTxVote) -> list[Out]:
        """A vote on a transaction that is not open here: if a part of it here made the
        publications the voter saw, the vote goes on up the tree that part's came down."""
        parts = self._parts_of.get(vote.tx, ())
        tree = next((p.link.tree for p in parts if p.link is not None and p.link.tree), "")
        if not tree or tree == vote.tree:
            return []  # over already: a late vote changes nothing
        return self._votes.route(replace(vote, tree=tree), "")

    # -- internals: a part's side ------------------------------------------------------------

    def _report(self, part: _Open, state: PartState, why: str = "") -> list[Out]:
        """Tell the broker of the transaction ``part`` joined that it asks to join, is
        prepared, asks how the transaction ended, or was aborted."""
        link = part.link
        if link is None:
            return []
        word = RouteTxPart(
            link.joins, part.gid, part.owner, state, link.path, reason=why[:MAX_REASON]
        )
        return self.part_message(word)

    def _prepare(self, part: _Open, now: float) -> list[Out]:
        """The client is done with ``part``: it goes to the journal (on disk before anything
        this frame sends leaves), and its transaction's broker is told."""
        link = part.link
        if link is None or not link.taken:
            return [(part.hop or "", Error(f"{_busy(part)}: it cannot commit", part.tx))]
        reused = self._reused(part, [pub for pub, _ in part.publications])
        if reused is not None:
            return self._abort(part, reused, tell=True)
        pubs = tuple(part.publications)
        self.journal.prepare(PreparedPart(part.owner, part.tx, link.joins, link.path, pubs))
        link.prepared, link.asked = True, now
        if part.hop is not None:
            self._votes.discharge(link.joins, part.hop)  # it is done: it owes no vote now
        answer = [(part.hop, Ok(part.tx))] if part.hop is not None else []
        return answer + self._report(part, PartState.PREPARED)

    def _committing(self, part: _Open) -> list[Out]:
        """The commit of ``part``'s transaction has started: its publications go to the
        subscriptions that see a commit start (``deferred``)."""
        link = part.link
        if link is None or link.committing:
            return []
        link.committing = True
        out: list[Out] = []
        for pub, tree in part.publications:
            out += self._deliver(pub, tree, part.hop or "", 0, (link.joins, Outcome.COMMITTING))
        return out

    def _commit_part(self, part: _Open, now: float) -> list[Out]:
        """``part``'s transaction committed: its publications go to the journal, as guaranteed
        ones of that transaction, and down their trees as committed."""
        link = part.link
        if link is None:
            return []
        out = self._committing(part)  # seen starting by deferred subscriptions first
        with self.journal.atomic():
            logged = [self.journal.append(t, p, now, link.joins) for p, t in part.publications]
            self.journal.settle(part.owner, part.tx)
        hop = part.hop or ""
        for (pub, tree), (position, new) in zip(part.publications, logged, strict=True):
            if new:  # not one whose id the client used again meanwhile
                out += self._deliver(pub, tree, hop, position, (link.joins, Outcome.COMMITTED))
        ended = TxEnded(part.tx, Outcome.COMMITTED)
        told = [(part.hop, ended)] if part.hop is not None else []
        return out + told + self._end(part, ended)


def _takes(link: Link) -> bool:
    """Whether a part takes publications: its transaction took it, and it is not done."""
    return link.taken and not link.prepared


def _busy(tx: _Open) -> str:
    """Why open transaction ``tx`` takes no publication now."""
    link = tx.link
    if link is None:
        return "it is committing"
    if not link.taken:
        return f"transaction {link.joins} has not taken it yet"
    return f"it is done, and ends as transaction {link.joins} does"


def _standing(tx: _Open) -> Outcome:
    """Where open transaction ``tx`` stands."""
    return Outcome.PENDING if tx.committing is None else Outcome.COMMITTING


def _late(tx: _Open) -> str:
    """Why ``tx``'s commit, which waited too long, is aborted."""
    whys = []
    if tx.missing():
        whys.append(f"its vital consumers {', '.join(tx.missing())} did not report ready")
    if tx.unfinished():
        whys.append(f"its parts {', '.join(tx.unfinished())} were not done")
    return f"{' and '.join(whys)} within {tx.wait:g} s"
