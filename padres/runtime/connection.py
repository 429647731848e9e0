"""One connection of a broker node and its lifecycle, as one value.

A connection is **accepted** (a socket came in, or an in-process client attached) or
**dialled** (this node dialled a neighbour). It becomes a **link** once it is known to join a
neighbour broker: at once for a dialled one, after the core took its ``hello`` as a broker's
for an accepted one; its queue then never thins. It is **closed** once, after which nothing
is sent to it. ``Phase.move`` refuses any other transition, so a bug in the node shows as an
error at the step that went wrong instead of as stale entries in parallel tables.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum

from padres.broker.losses import Tally
from padres.runtime.probe import Probe
from padres.runtime.rate import Rate
from padres.runtime.send_queue import SendQueue

__all__ = ["Connection", "InvalidTransition", "Phase"]


class InvalidTransition(RuntimeError):
    """A connection was asked to move to a phase it cannot reach from where it is (a bug)."""


class Phase(Enum):
    ACCEPTED = "accepted"
    """Came in: a client until its ``hello`` says it is a broker."""
    LINK = "link"
    """Joins a neighbour broker: its queue is a link queue, never thinned."""
    CLOSED = "closed"
    """Hung up: nothing more is sent or read."""


_NEXT: dict[Phase, frozenset[Phase]] = {
    Phase.ACCEPTED: frozenset({Phase.LINK, Phase.CLOSED}),
    Phase.LINK: frozenset({Phase.CLOSED}),
    Phase.CLOSED: frozenset(),
}


@dataclass(eq=False)
class Connection:
    """What the node keeps of one connection (its hop is its key in the node's table)."""

    hop: str
    queue: SendQueue
    """Its outgoing queue, bounded in bytes."""
    queries: Rate
    """How often it may query the routing tables."""
    refusals: Rate
    """How often its messages may be refused before its reading is slowed (``Limits``)."""
    slowed: float | None = None
    """Since when its frames have been slowed for refused messages, on end
    (``time.monotonic()``); None while it is within its rate."""
    address: str = ""
    """The address it came from ("" for one attached in this process, or dialled)."""
    name: str = ""
    """Who it is once its ``hello`` was taken: a client's session name, or a neighbour's id."""
    dialled: bool = False
    """This node dialled it: a neighbour it was given, whose frames it decodes without
    checking their publications again (``checked_before``)."""
    phase: Phase = Phase.ACCEPTED
    heard: float = field(default_factory=time.monotonic)
    """When a frame last came from it (``time.monotonic()``)."""
    opened: float = field(default_factory=time.monotonic)
    """When it came (``time.monotonic()``)."""
    refused: Tally = field(default_factory=Tally)
    """The plain publications its link queue refused once it was giving up, summarised as
    they came (the node tells their publishers when it hangs up)."""
    probe: Probe = field(default_factory=Probe)
    """A link's measures (``padres.runtime.probe``)."""

    @property
    def link(self) -> bool:
        return self.phase is Phase.LINK

    def move(self, phase: Phase) -> None:
        """Go to ``phase``; ``InvalidTransition`` if it cannot be reached from here."""
        if phase not in _NEXT[self.phase]:
            raise InvalidTransition(f"connection {self.hop}: {self.phase.value} -> {phase.value}")
        self.phase = phase
