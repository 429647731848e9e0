"""Running a subscription's handler with retries, and its exception queue.

A subscription made with ``retries`` (``Client.subscribe(flt, handler, retries=3)``) hands its
deliveries to a ``Handler``: a task of its own that calls the handler (a function, or a
coroutine function, which is awaited) on one delivery at a time, in order. When the handler
raises, it is called again after a backoff (``padres.runtime.backoff``, from ``backoff`` seconds,
doubling), ``retries`` times at most; a subscription waiting so holds back only its own
deliveries. After the last failure the publication goes to the subscription's exception queue at
its broker (``Failed``, with the error's type and message and the number of attempts) and counts
as processed: a durable subscription's delivery is acknowledged by the broker in the same journal
transaction that stores it, and this client moves past it only once the broker has answered, so
it is neither lost nor put there twice when the connection or either side fails meanwhile.

Entries replayed from the exception queue (``Retry``) come through the same handler with the same
retries: when it succeeds the entry is purged, when it fails again it goes back with its attempts
added up.

Handlers given one ``Sequencer`` take their deliveries one at a time, across their
subscriptions, in the order the deliveries arrived from the broker: a publication matching
several of them is handled by each in the order the broker listed them (their priorities), and
one handler waiting between attempts holds back the others of its sequencer.

The handler takes its deliveries from the subscription's queue in the client
(``padres.client.pending``), bounded like any subscription's: it takes the next only when done
with the last, so that a slow handler fills that queue, not memory. When it is full, a plain
subscription's deliveries are dropped and counted, and the loss is logged as a warning once per
episode (``SlowConsumer``: there is no iterator to raise it from); a durable subscription's are
kept, and its client stops reading from the broker until the handler has taken some. Replayed
entries are always kept: the broker sends at most ``padres.broker.dead_letters.WINDOW`` at a time.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from padres.client.pending import MAX_PENDING, MAX_PENDING_BYTES, Pending, PendingStatistics
from padres.errors import ConnectionLost, RequestFailed, SlowConsumer
from padres.model.protocol import Envelope, ExceptionAction, Exceptions, Failed, Notify, Retry
from padres.runtime.backoff import Backoff

if TYPE_CHECKING:
    from padres.client.connection import Client

__all__ = ["MOST_BACKOFF", "Handler", "Sequencer", "describe"]

log = logging.getLogger("padres.client.connection")

MOST_BACKOFF: Final = 30.0
"""Seconds between two attempts, at most (unless ``backoff`` itself is longer)."""


def describe(exc: BaseException) -> str:
    """An error as its exception queue keeps it: the exception's type and message."""
    kind = type(exc)
    name = kind.__qualname__
    if kind.__module__ != "builtins":
        name = f"{kind.__module__}.{name}"
    return f"{name}: {exc}" if str(exc) else name


class Sequencer:
    """The order in which the handlers sharing it take their deliveries: the order the
    deliveries arrived (see the module docstring).

    Each delivery queued for one of them takes a ticket (``take``); its handler waits for the
    ticket's ``turn``, handles the delivery and lets the next one go (``leave``); a delivery
    dropped, forgotten or abandoned leaves too, so that none waits for ever."""

    def __init__(self) -> None:
        self._last = 0
        self._open: deque[int] = deque()
        """Tickets taken and not left, in order: the first one's turn is now."""
        self._left: set[int] = set()
        """Tickets left before their turn (their delivery was dropped or forgotten)."""
        self._waiting: dict[int, asyncio.Future[None]] = {}

    def __len__(self) -> int:
        """Deliveries that have a ticket and have not left."""
        return len(self._open) - len(self._left)

    def take(self) -> int:
        self._last += 1
        self._open.append(self._last)
        return self._last

    async def turn(self, ticket: int) -> None:
        """Wait until every delivery that arrived before ticket's has left."""
        if self._open[0] == ticket:
            return
        waiter = self._waiting[ticket] = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._waiting.pop(ticket, None)

    def leave(self, ticket: int) -> None:
        """The delivery of ``ticket`` is done with (handled, dropped or forgotten)."""
        self._left.add(ticket)
        open_ = self._open
        while open_ and open_[0] in self._left:
            self._left.discard(open_.popleft())
        if open_:
            waiter = self._waiting.get(open_[0])
            if waiter is not None and not waiter.done():
                waiter.set_result(None)


@dataclass(frozen=True)
class _Work:
    delivery: Notify
    entry: int = 0
    """The exception queue's entry it is delivered again from (0: a new delivery)."""
    attempts: int = 0
    """Attempts it has had before (an entry's)."""
    ticket: int = 0
    """Its place in its handler's ``Sequencer`` (0: it has none)."""


class Handler:
    """A subscription's handler with its retries (see the module docstring)."""

    def __init__(
        self,
        client: Client,
        subscription: str,
        callback: Callable[[Notify], Any],
        *,
        retries: int,
        backoff: float,
        processed: Callable[[int], None],
        max_pending: int = MAX_PENDING,
        max_pending_bytes: int = MAX_PENDING_BYTES,
        flow: Callable[[bool], None] | None = None,
        sequencer: Sequencer | None = None,
    ) -> None:
        """``processed(seq)``: called once a durable delivery is done with (handled, or in the
        exception queue). ``max_pending``, ``max_pending_bytes``: the limits of the queue of
        deliveries waiting for the handler; ``flow``: see ``Pending`` (a durable
        subscription's); ``sequencer``: shared with other handlers, they take their deliveries
        in the order they arrived."""
        if retries < 0:
            raise ValueError(f"retries must be 0 or more, not {retries}")
        if backoff <= 0:
            raise ValueError(f"backoff must be more than 0 seconds, not {backoff}")
        self.subscription = subscription
        self.retries = retries
        self.backoff = backoff
        self.failed = 0
        """Publications put into the exception queue by this handler."""
        self._client = client
        self._callback = callback
        self._processed = processed
        self._sequencer = sequencer
        self._queue: Pending[_Work] = Pending(
            subscription, max_pending, max_pending_bytes, flow=flow
        )
        self._task: asyncio.Task[None] | None = None

    def put(self, delivery: Notify, size: int, *, keep: bool = False) -> None:
        """Queue a delivery of ``size`` bytes for the handler (dropped if the queue is full,
        unless ``keep``)."""
        self._put(_Work(delivery, ticket=self._ticket()), size, keep)

    def put_retry(self, retry: Retry, size: int) -> None:
        delivery = Notify(retry.publication, (self.subscription,))
        self._put(_Work(delivery, retry.entry, retry.attempts, self._ticket()), size, True)

    def _ticket(self) -> int:
        return 0 if self._sequencer is None else self._sequencer.take()

    def _put(self, work: _Work, size: int, keep: bool) -> None:
        if self._queue.put(work, size, keep=keep):
            self._start()
        else:
            self._leave(work)

    def _leave(self, work: _Work) -> None:
        if self._sequencer is not None and work.ticket:
            self._sequencer.leave(work.ticket)

    def forget(self, done: int) -> None:
        """Before a durable subscription resumes: deliveries numbered after ``done`` come
        again, the queued ones are dropped (entries being replayed come again too)."""
        self._keep_only(lambda work: not work.entry and work.delivery.seq <= done)

    def _keep_only(self, wanted: Callable[[_Work], bool]) -> None:
        """Drop the queued deliveries not ``wanted``: they leave the sequencer."""

        def kept(work: _Work) -> bool:
            if wanted(work):
                return True
            self._leave(work)
            return False

        self._queue.keep_only(kept)

    def statistics(self) -> PendingStatistics:
        """The queue of deliveries waiting for the handler."""
        return self._queue.statistics()

    def stop(self) -> None:
        """The subscription is over: nothing more is handled."""
        self._keep_only(lambda work: False)
        self._queue.close()
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def _start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                work = await self._queue.get()
            except SlowConsumer as slow:
                log.warning("%s", slow)
                continue
            if work is None:
                return
            try:
                if self._sequencer is not None:
                    await self._sequencer.turn(work.ticket)
                await self._process(work)
            except ConnectionLost:
                return  # the client is closed: what was not done comes again next time
            except Exception:  # a bug here must not end the subscription's deliveries
                log.exception("subscription %s: handling failed", self.subscription)
            finally:
                self._leave(work)

    async def _process(self, work: _Work) -> None:
        attempts, error = await self._attempt(work.delivery)
        sub = self.subscription
        if error is None:
            if work.entry:
                purge = Exceptions(self._ref(), sub, ExceptionAction.PURGE, (work.entry,))
                await self._report(purge)
            elif work.delivery.seq:
                self._processed(work.delivery.seq)
            return
        failed = Failed(
            self._ref(),
            sub,
            work.delivery.publication,
            error,
            work.attempts + attempts,
            seq=work.delivery.seq,
            entry=work.entry,
        )
        await self._report(failed)
        self.failed += 1
        if work.delivery.seq:
            self._processed(work.delivery.seq)

    async def _attempt(self, delivery: Notify) -> tuple[int, str | None]:
        """Call the handler until it succeeds, ``retries`` + 1 times at most: the attempts
        made, and the last error (None if it succeeded)."""
        backoff = Backoff(self.backoff, max(self.backoff, MOST_BACKOFF))
        error = ""
        for attempt in range(1, self.retries + 2):
            try:
                result = self._callback(delivery)
                if inspect.isawaitable(result):
                    await result
                return attempt, None
            except Exception as exc:
                error = describe(exc)
                log.info(
                    "subscription %s: handler failed on %s (attempt %d of %d): %s",
                    self.subscription,
                    delivery.publication.id,
                    attempt,
                    self.retries + 1,
                    error,
                )
            if attempt <= self.retries:
                await backoff.wait()
        return self.retries + 1, error

    def _ref(self) -> str:
        return self._client._ref("f")

    async def _report(self, message: Failed | Exceptions) -> None:
        """Send ``message`` until the broker has answered it, across reconnections;
        ``ConnectionLost`` once the client is closed."""
        backoff = Backoff()
        ref = message.ref
        while True:
            try:
                reply: Envelope = await self._client._request(ref, message)
                log.debug("subscription %s: %s answered %s", self.subscription, ref, reply)
                return
            except RequestFailed as exc:
                log.error("subscription %s: the broker refused %s: %s", self.subscription, ref, exc)
                return
            except (ConnectionLost, TimeoutError):
                from padres.client.connection import (
                    ClientState,  # here: padres.client.connection imports this module
                )

                if not self._client.reconnect or self._client.state is ClientState.CLOSED:
                    raise ConnectionLost(f"client {self._client.name} is closed") from None
            await backoff.wait()
