"""Transactions of publications, on the client's side (``docs/transactions.md``).

::

    async with client.transaction() as tx:
        await tx.publish({"class": "Order", "item": "shoes"})
        await tx.publish({"class": "Payment", "amount": 120})
    # committed here; an exception in the block aborts the transaction and goes on

A block that ends normally commits: if the broker aborted the transaction meanwhile, leaving
the block raises ``TransactionAborted`` (or ``TransactionLimit``) with the broker's reason.

Each subscriber sees the transaction's publications as its subscription's ``visibility``
says: ``on_commit`` (the default) once committed, ``immediate`` at once and again with the
outcome, ``deferred`` when the commit starts and again with the outcome, ``on_abort`` once
aborted. Consumers may vote on it (``Client.vote``): mark it rollback-only, or, if the
producer named them ``vital``, say their reaction is ready or failed; its commit then waits for
every vital consumer's ``ready`` (``wait`` seconds at most) and aborts if one fails, is gone,
or is late. A consumer's own transaction may react to one it received (``trigger``): it then
commits only if that one ended as it says (``padres.client.outcomes``). Or it may *join* it
(``join``, a shared context): it is then a part of that transaction, whose publications are
that transaction's and end with it::

    async with client.transaction(join=note.tx) as part:
        await part.publish({"class": "Shipment", "order": note.publication.id})
    # done: held by the broker, it ends as note.tx does (await part.outcome())

A transaction's life: NEW -> OPEN -> COMMITTED or ABORTED, and a part's NEW -> OPEN -> PREPARED
(done) -> COMMITTED or ABORTED; its broker may abort it (its client was away too long, it
stayed idle too long, it outgrew a limit), and then publishing or committing raises
``TransactionAborted`` saying why.
A client made with ``reconnect=True`` goes on with its open transactions after a reconnect
if the broker still holds them (``padres broker --tx-linger``); what it publishes while the
connection is down raises ``ConnectionLost``. A commit whose answer was lost with the
connection may be sent again: the broker answers as it did the first time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from enum import Enum
from types import TracebackType
from typing import TYPE_CHECKING, Any

from padres.errors import (
    PadresError,
    RequestFailed,
    TransactionAborted,
    TransactionClosed,
    TransactionError,
    TransactionLimit,
)
from padres.model.messages import Publication
from padres.model.protocol import Ok, Outcome, TxAbort, TxBegin, TxCommit, TxEnded, TxPublish

if TYPE_CHECKING:
    from padres.client.connection import BlockingClient, Client

__all__ = ["BlockingTransaction", "Transaction", "TransactionState"]

log = logging.getLogger("padres.client.connection")


class TransactionState(Enum):
    NEW = "new"
    OPEN = "open"
    PREPARED = "prepared"
    """A part that is done: its broker holds it until the transaction it joined ends."""
    COMMITTED = "committed"
    ABORTED = "aborted"


class Transaction:
    """A transaction of ``Client`` (see the module docstring): ``async with`` it, or call
    ``begin``, ``publish``, and ``commit`` or ``abort``."""

    def __init__(
        self,
        client: Client,
        ident: str,
        *,
        vital: tuple[str, ...] = (),
        wait: float = 10.0,
        trigger: tuple[str, Outcome] | None = None,
        join: str = "",
    ) -> None:
        """``vital``: the consumers whose reactions its commit waits for, ``wait`` seconds at
        most; ``trigger``: the transaction it reacts to and the outcome that one must have for
        this one to commit (``padres.client.outcomes``); ``join``: the transaction it is a part
        of."""
        self.id = ident
        self.vital = vital
        self.wait = wait
        self.trigger = trigger
        self.join = join
        self.state = TransactionState.NEW
        self.count = 0
        """Publications made in it."""
        self.reason = ""
        """Why it was aborted, once it was."""
        self.limited = False
        """Whether a limit of the broker aborted it."""
        self._client = client
        self._committing = False
        self._abandoned = False
        """Whether its client aborted it (a block that did so has nothing left to commit)."""
        self._over = asyncio.Event()
        """Set once it is committed or aborted."""

    async def begin(self) -> Transaction:
        """Open it at the broker; ``TransactionLimit`` if this client has too many open."""
        if self.state is not TransactionState.NEW:
            raise TransactionClosed(f"transaction {self.id!r} has begun already", self.id)
        self._client._transactions[self.id] = self
        try:
            reply = await self._ask(TxBegin(self.id, self.vital, self.wait, self.join))
        except BaseException:
            self._client._transactions.pop(self.id, None)
            raise
        if isinstance(reply, TxEnded):
            self._client._transactions.pop(self.id, None)
            if self.join and not reply.limit:  # the transaction to join refused it
                raise TransactionClosed(reply.reason, self.id)
            why = f"transaction {self.id!r} refused: {reply.reason}"
            raise TransactionLimit(why, self.id, reply.reason)
        self.state = TransactionState.OPEN
        return self

    async def publish(
        self, publication: str | Publication | dict[str, Any], id: str | None = None
    ) -> str:
        """Publish in the transaction (PADRES text, a ``Publication`` or an attribute dict);
        returns the publication's id. Its ids, like a guaranteed publication's, must not be
        reused by this publisher: the ids made here carry a token of this client's run."""
        self._check_open("publish in")
        pub = self._client._publication(publication, id)
        await self._client._send([TxPublish(self.id, pub)])
        self.count += 1
        return pub.id

    async def commit(self) -> None:
        """Commit: returns once every publication is on the broker's disk (and on its way to
        the subscribers), after its vital consumers (if any) reported ready and its parts (if
        any) are done; ``TransactionAborted`` if the transaction was aborted instead (one of
        them failed, say). A part is done instead: it returns once its broker holds it on disk
        (the state is then PREPARED); it ends as the transaction it joined does
        (``outcome``)."""
        if self.state in (TransactionState.COMMITTED, TransactionState.PREPARED):
            return
        self._check_open("commit")
        if self.trigger is not None:
            await self._depend(*self.trigger)
        self._committing = True
        try:
            reply = await self._ask(TxCommit(self.id, self.count))
        except TransactionError as exc:  # the broker does not know it: it is over
            self._ended(exc.text)
            raise
        finally:
            self._committing = False
        if isinstance(reply, TxEnded):
            self._ended(reply.reason, reply.limit)
            self._check_open("commit")
        if self.join and self.state is TransactionState.OPEN:
            self.state = TransactionState.PREPARED  # until its transaction ends
            return
        self._committed()

    async def outcome(self, timeout: float | None = None) -> Outcome:
        """How it ended, once it has (a part: as the transaction it joined did); waits
        ``timeout`` seconds at most (``TimeoutError``), or as long as it takes if None."""
        await asyncio.wait_for(self._over.wait(), timeout)
        if self.state is TransactionState.COMMITTED:
            return Outcome.COMMITTED
        return Outcome.ABORTED

    async def _depend(self, trigger: str, on: Outcome) -> None:
        """Wait for the outcome of ``trigger``; abort unless it is ``on``."""
        outcome = await self._client._outcomes.of(trigger, self.wait)
        if outcome is on:
            return
        if outcome is None:
            why = f"the outcome of its trigger {trigger} did not come within {self.wait:g} s"
        else:
            why = f"its trigger {trigger} was {outcome.value}, not {on.value}"
        if self.state is TransactionState.OPEN:
            with contextlib.suppress(PadresError, TimeoutError):
                await self._ask(TxAbort(self.id))
        self._ended(why)
        self._check_open("commit")

    async def abort(self) -> None:
        """Abort: ``on_abort`` subscribers get its publications, ``immediate`` ones the
        outcome, ``on_commit`` ones nothing."""
        if self.state is TransactionState.ABORTED:
            return
        if self.state is TransactionState.COMMITTED:
            raise TransactionClosed(f"transaction {self.id!r} is committed already", self.id)
        if self.state is TransactionState.PREPARED:
            why = f"transaction {self.id!r} is done: it ends as {self.join} does"
            raise TransactionClosed(why, self.id)
        if self.state is TransactionState.OPEN:
            await self._ask(TxAbort(self.id))
        self._abandoned = True
        self._ended("aborted by its client")

    async def __aenter__(self) -> Transaction:
        return await self.begin()

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if e is None:
            # A block that ends normally commits, unless its code aborted: a transaction the
            # broker aborted meanwhile raises here (``commit`` says why), never passes quietly.
            if not self._abandoned:
                await self.commit()
            return
        if self.state is TransactionState.OPEN:
            # The block's own exception goes on; the broker aborts it anyway when it cannot
            # be told (the connection is lost).
            with contextlib.suppress(PadresError, TimeoutError):
                await self.abort()
            self._ended(f"the block raised {type(e).__name__}")

    def _check_open(self, what: str) -> None:
        if self.state is TransactionState.ABORTED:
            why = f"cannot {what} transaction {self.id!r}: it was aborted ({self.reason})"
            error = TransactionLimit if self.limited else TransactionAborted
            raise error(why, self.id, self.reason)
        if self.state is TransactionState.PREPARED:
            why = f"cannot {what} transaction {self.id!r}: it is done, and ends as {self.join} does"
            raise TransactionClosed(why, self.id)
        if self.state is not TransactionState.OPEN:
            state = "not begun" if self.state is TransactionState.NEW else self.state.value
            raise TransactionClosed(
                f"cannot {what} transaction {self.id!r}: it is {state}", self.id
            )

    async def _ask(self, message: TxBegin | TxCommit | TxAbort) -> Ok | TxEnded:
        # A commit may wait for vital consumers or parts, ``wait`` seconds at most.
        waits = self.wait if isinstance(message, TxCommit) else None
        try:
            reply = await self._client._request(self.id, message, timeout=waits)
        except RequestFailed as exc:
            raise TransactionError(exc.text, self.id) from None
        if not isinstance(reply, (Ok, TxEnded)):
            raise TransactionError(f"unexpected answer {type(reply).__name__}", self.id)
        return reply

    def _lost(self) -> None:
        """The connection is lost for good: the broker aborts the transaction, unless it was
        being committed (then it may have committed it) or is a part that is done (its broker
        holds it until its transaction ends)."""
        if not self._committing and self.state is not TransactionState.PREPARED:
            self._ended("the connection to the broker was lost")

    def _ended(self, reason: str, limited: bool = False) -> None:
        """It is aborted (by its client, or by its broker for ``reason``; ``limited``: by a
        limit)."""
        if self.state in (TransactionState.NEW, TransactionState.OPEN, TransactionState.PREPARED):
            self.state = TransactionState.ABORTED
            self.reason = reason
            self.limited = limited
        self._client._transactions.pop(self.id, None)
        self._over.set()

    def _committed(self) -> None:
        """It is committed (a part: the transaction it joined committed)."""
        self.state = TransactionState.COMMITTED
        self._client._transactions.pop(self.id, None)
        self._over.set()


class BlockingTransaction:
    """``Transaction`` for ``BlockingClient``: ``with client.transaction() as tx:``."""

    def __init__(self, client: BlockingClient, transaction: Transaction) -> None:
        self._client = client
        self.transaction = transaction

    @property
    def id(self) -> str:
        return self.transaction.id

    @property
    def state(self) -> TransactionState:
        return self.transaction.state

    def begin(self) -> BlockingTransaction:
        self._client._call(self.transaction.begin())
        return self

    def publish(
        self, publication: str | Publication | dict[str, Any], id: str | None = None
    ) -> str:
        return self._client._call(self.transaction.publish(publication, id))

    def commit(self) -> None:
        self._client._call(self.transaction.commit())

    def abort(self) -> None:
        self._client._call(self.transaction.abort())

    def outcome(self, timeout: float | None = None) -> Outcome:
        return self._client._call(self.transaction.outcome(timeout))

    def __enter__(self) -> BlockingTransaction:
        return self.begin()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._client._call(self.transaction.__aexit__(t, e, tb))
