"""The walk of a frame through a broker core: how the node and the simulation both drive it.

``Pump.walk`` hands the core the messages of a frame from one hop, in order, until its time
budget is spent: the publications ahead are matched together first (``Broker.prefetch``); a
message that did not decode, or that the driver's screen refuses, gets an ``error`` instead of
reaching the core; one the core fails on costs that message only (an ``error`` to its sender,
and the log). ``Pump.dispatch`` commits the journal and only then hands what the core answered
to the driver: nothing leaves ahead of what the broker promised on disk.

The rest is the driver's. The node (``padres.runtime.node``) decodes frames, walks them in time
slices with other connections served between them, and dispatches what a slice answered into
the send queues of its sockets; the simulation (``padres.runtime.simulation``) walks a frame
whole, each message a millisecond later on its virtual clock, and its pump is eager: what each
message answers is queued on the links before the next is handled.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Final

from padres.broker import Broker, Out
from padres.model.protocol import Envelope, Error, Hello, Rejected

__all__ = ["ERROR_TEXT", "PREFETCH", "Handled", "Pump", "Screen", "Walked"]

log = logging.getLogger("padres.broker")

PREFETCH: Final = 1000
"""Publications of a frame matched together, ahead of handling them one by one (a time slice
rarely gets through more)."""
ERROR_TEXT: Final = 1000
"""Characters of an exception's text that an ``error`` reply quotes at most."""

Handled = tuple[Envelope, list[Out], float]
"""A message the core took, what it sent for it, and the seconds it took."""
Walked = tuple[int, list[Out], list[Handled]]
"""What a walk got through: the index of the first message it left (the frame's length once
all are handled); what it answered and did not dispatch, in order (the core's answers, and the
``error`` of each message the core did not take); the messages the core took: from a hop it
has accepted, and not refused (answered with an ``error`` first)."""
Screen = Callable[[str, Envelope], Error | None]
"""The driver's check of a message from a hop before the core gets it: the ``error`` that
refuses it, or None."""


class Pump:
    """Hands one broker core the frames of its hops, and what it answers to ``send``."""

    def __init__(
        self,
        broker: Broker,
        send: Callable[[list[Out]], None],
        *,
        screen: Screen | None = None,
        contain: bool = True,
        eager: bool = False,
    ) -> None:
        """``send`` takes what leaves, once the journal holds what led to it. ``contain``:
        whether an exception of the core costs one message (else it propagates, for a test
        to see). ``eager``: a walk dispatches what each message answers before it hands the
        core the next (else it leaves its answers to the driver)."""
        self.broker = broker
        self.send = send
        self.screen = screen
        self.contain = contain
        self.eager = eager
        self.received = 0
        """Messages handed to the core."""
        self.rejected = 0
        """Messages refused before they reached the core."""

    def walk(
        self,
        hop: str,
        items: Sequence[Envelope | Rejected],
        clock: Callable[[], float],
        first: int = 0,
        budget: float = math.inf,
    ) -> Walked:
        """Hand the core ``items[first:]`` from ``hop``, each at the time ``clock`` then
        gives, until ``budget`` seconds have passed (one message at least)."""
        broker = self.broker
        handle, screen, perf_counter = broker.handle, self.screen, time.perf_counter
        outs: list[Out] = []
        answer = self.dispatch if self.eager else outs.extend
        handled: list[Handled] = []
        left = len(items)
        if broker.greeted(hop):  # nothing is matched for a connection not yet accepted
            broker.prefetch(items[first : first + PREFETCH], hop)
        until = perf_counter() + budget
        for index in range(first, len(items)):
            started = perf_counter()
            if index > first and started > until:
                left = index
                break
            item = items[index]
            if isinstance(item, Rejected):
                self.rejected += 1
                answer([(hop, Error(f"message refused: {item.error}", item.ref))])
                continue
            refusal = None if screen is None else screen(hop, item)
            if refusal is not None:
                self.rejected += 1
                answer([(hop, refusal)])
                continue
            self.received += 1
            try:
                answered = handle(item, hop, clock())
            except Exception as exc:  # a bug must cost one message, not the broker
                if not self.contain:
                    raise
                log.exception("%s: failed on a message from %s", broker.id, hop)
                why = f"internal error: {type(exc).__name__}: {exc}"
                answer([(hop, Error(why[:ERROR_TEXT]))])
                continue
            answer(answered)
            if not broker.greeted(hop):
                if broker.guard is not None and type(item) is Hello:
                    left = len(items)  # refused: the connection closes, the rest unread
                    break
            elif not (answered and answered[0][0] == hop and type(answered[0][1]) is Error):
                handled.append((item, answered, perf_counter() - started))
        broker.prefetch(())  # what was not handled is matched again when it is
        return left, outs, handled

    def dispatch(self, outs: list[Out]) -> None:
        """Commit the journal, then send ``outs``."""
        self.broker.journal.commit()
        self.send(outs)
