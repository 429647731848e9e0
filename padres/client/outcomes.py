"""The outcomes of producers' transactions, as a client learns them from its deliveries.

A reaction may depend on the transaction that triggered it (a *forward* dependency, X²TS):
a transaction of the consumer's made with ``trigger`` and ``on`` commits only once the client
knows that the trigger ended with ``on`` (``committed``, or ``aborted`` for a compensation), and
aborts if it ended otherwise. The client learns an outcome from a ``TxNotify`` of the trigger
that says it (an ``immediate`` or ``deferred`` subscription gets one either way; an
``on_commit`` one only when it committed, an ``on_abort`` one only when it aborted). It keeps
the last ``MAX_OUTCOMES``.
"""

from __future__ import annotations

import asyncio
from typing import Final

from padres.model.protocol import Outcome, TxNotify

__all__ = ["MAX_OUTCOMES", "Outcomes"]

MAX_OUTCOMES: Final = 10_000
"""Outcomes a client remembers, the latest."""


class Outcomes:
    """The outcomes of transactions delivered to a client (see the module docstring)."""

    def __init__(self) -> None:
        self._known: dict[str, Outcome] = {}
        self._waiting: dict[str, asyncio.Event] = {}

    def learned(self, note: TxNotify) -> None:
        """A delivery of transaction ``note.tx``: its outcome, if it says one."""
        if note.outcome not in (Outcome.COMMITTED, Outcome.ABORTED):
            return
        self._known.pop(note.tx, None)
        self._known[note.tx] = note.outcome
        if len(self._known) > MAX_OUTCOMES:
            del self._known[next(iter(self._known))]
        waiting = self._waiting.pop(note.tx, None)
        if waiting is not None:
            waiting.set()

    async def of(self, tx: str, timeout: float) -> Outcome | None:
        """How transaction ``tx`` ended, once known; None if not known within ``timeout``."""
        if tx not in self._known:
            event = self._waiting.setdefault(tx, asyncio.Event())
            try:
                await asyncio.wait_for(event.wait(), timeout)
            except TimeoutError:
                return None
            finally:
                if not event.is_set() and self._waiting.get(tx) is event:
                    del self._waiting[tx]
        return self._known.get(tx)
