"""An overlay of broker cores in one process, with a deterministic scheduler.

Every link (broker to broker, client to broker, broker to client) is a FIFO queue, as a
WebSocket is. ``run`` delivers queued messages a frame at a time (one to ``FRAME`` messages of
a link), choosing the next link at random from a seeded generator, so the same seed replays the
same interleaving, and different seeds explore different ones; a broker can be frozen
(``freeze``: nothing reaches it or leaves it until ``thaw``), and the measures of its links set
(``measure``), as the runtime's pings would. A broker takes a frame through
the pump, as a node does (``padres.runtime.pump``): its publications matched together, then its
messages in turn, each a millisecond after the last on the simulation's clock; what each one
answers is committed to the journal and queued on the links before the next is handled, so
links are scheduled in the order the messages made them busy. Unlike a node's, its pump lets an
exception of the core through, to the test. Every message is encoded and decoded on its way, as
a connection would, so what the simulation checks is what crosses the wire. Tests and
``padres bench overlay`` drive it.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from typing import Final

from padres.broker import Broker, BrokerConfig, Covering, Merging, Out
from padres.broker.journal import Journal
from padres.broker.losses import Tally
from padres.broker.memory_journal import MemoryJournal
from padres.broker.paths import LinkState, Switching
from padres.model.codec import encode
from padres.model.messages import Publication
from padres.model.protocol import (
    ENVELOPES,
    CompositeNotify,
    Envelope,
    Error,
    Hello,
    Notify,
    Ok,
    QueryResult,
    Role,
    RoutePublish,
    Welcome,
)
from padres.runtime.pump import Pump
from padres.security.accounts import Accounts, Credentials
from rete import CompositeLimits

__all__ = ["FRAME", "SimClient", "Simulation"]

FRAME: Final = 4
"""The most messages of one link delivered as one frame."""


@dataclass(eq=False)
class SimClient:
    """A client of the simulation: what it sends goes to its broker, what it gets is kept."""

    name: str
    broker: str
    notifications: list[Notify] = field(default_factory=list)
    composites: list[CompositeNotify] = field(default_factory=list)
    errors: list[Error] = field(default_factory=list)
    acks: list[str] = field(default_factory=list)
    incomplete: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Acknowledged requests whose routing could not settle everywhere, and why."""
    other: list[Envelope] = field(default_factory=list)
    connected: bool = True

    def receive(self, message: Envelope) -> None:
        match message:
            case Notify():
                self.notifications.append(message)
            case CompositeNotify():
                self.composites.append(message)
            case Error():
                self.errors.append(message)
            case Ok():
                self.acks.append(message.ref)
                if message.incomplete:
                    self.incomplete[message.ref] = message.incomplete
            case Welcome() | QueryResult():
                self.other.append(message)
            case _:
                self.other.append(message)


class Simulation:
    """Brokers, links and clients in memory (see the module docstring)."""

    def __init__(
        self,
        seed: int = 0,
        *,
        covering: Covering = Covering.LAZY,
        merging: Merging | None = None,
        conformity: bool = True,
        limits: CompositeLimits | None = None,
        clock: float = 0.0,
        accounts: Accounts | None = None,
        switching: Switching | None = None,
    ) -> None:
        """``clock``: the brokers' time at the start, in Unix seconds; it advances by one
        millisecond per message delivered. ``accounts``: every broker's (``docs/security.md``);
        brokers and clients then give credentials (``add_broker``, ``attach``).
        ``switching``: when the brokers move trees to other ways (the default if None)."""
        self.random = random.Random(seed)
        self.covering = covering
        self.merging = merging or Merging()
        self.conformity = conformity
        self.limits = limits
        self.accounts = accounts
        self.switching = switching or Switching()
        self.frozen: set[str] = set()
        """Brokers that take and send nothing for now (``freeze``)."""
        self.brokers: dict[str, Broker] = {}
        self._pumps: dict[str, Pump] = {}
        self.clients: dict[str, SimClient] = {}
        self.seen: dict[str, list[Publication]] = {}
        """Per broker, the publications that reached it, in order."""
        self.delivered = 0
        self.publications_routed = 0
        """Publications a broker sent a neighbour (``RoutePublish``) that reached it."""
        self._queues: dict[tuple[str, str], deque[Envelope]] = {}
        self._ready: list[tuple[str, str]] = []
        self._clock = clock
        self.journals: dict[str, Journal] = {}
        """Per broker, its journal: what a crash does not take."""
        self._runs: dict[str, int] = {}
        self.skew: dict[str, float] = {}
        """Per broker, how far its clock is from the simulation's, in seconds (a broker whose
        clock is wrong)."""

    # -- building ----------------------------------------------------------------------------

    def add_broker(self, broker_id: str, credentials: Credentials | None = None) -> Broker:
        """A broker; added again after ``crash``, it restarts from its journal.
        ``credentials``: what it authenticates with to its neighbours."""
        run = self._runs[broker_id] = self._runs.get(broker_id, 0) + 1
        config = BrokerConfig(
            covering=self.covering,
            merging=self.merging,
            conformity=self.conformity,
            composites=self.limits or CompositeLimits(),
            epoch=str(run),
            switching=self.switching,
        )
        broker = Broker(
            broker_id,
            config,
            journal=self.journals.setdefault(broker_id, MemoryJournal()),
            accounts=self.accounts,
            credentials=credentials,
        )
        self.brokers[broker_id] = broker
        send = partial(self._emit, broker_id)
        self._pumps[broker_id] = Pump(broker, send, contain=False, eager=True)
        self.seen.setdefault(broker_id, [])
        return broker

    def crash(self, broker_id: str) -> None:
        """The broker dies at once: its links and its clients' connections fail, what it had
        not committed to its journal is lost. ``add_broker`` starts it again."""
        broker = self.brokers.pop(broker_id)
        del self._pumps[broker_id]
        self.journals[broker_id].rollback()
        for name in broker.peers.values():
            for key in ((broker_id, name), (name, broker_id)):
                if key in self._queues:
                    self._queues[key].clear()
            self._emit(name, self.brokers[name].close(broker_id))
        for client in self.clients.values():
            if client.broker == broker_id and client.connected:
                client.connected = False
                for key in ((client.name, broker_id), (broker_id, client.name)):
                    if key in self._queues:
                        self._queues[key].clear()

    def reattach(self, client: SimClient) -> None:
        """A client that lost its connection connects again, under the same name."""
        client.connected = True
        self.send(client, Hello(client.name, Role.CLIENT))

    def link(self, a: str, b: str) -> None:
        """Connect brokers ``a`` and ``b``; ``a`` opens the link."""
        self._emit(a, self.brokers[a].open_link(b))

    def unlink(self, a: str, b: str) -> None:
        """The link between ``a`` and ``b`` fails: messages in flight on it are lost."""
        for key in ((a, b), (b, a)):
            if key in self._queues:
                self._queues[key].clear()
        self._emit(a, self.brokers[a].close(b))
        self._emit(b, self.brokers[b].close(a))

    def freeze(self, broker: str) -> None:
        """The broker stops (as SIGSTOP stops a process): what is on its way to it waits, and
        it sends nothing, until ``thaw``; its links stay up."""
        self.frozen.add(broker)

    def thaw(self, broker: str) -> None:
        self.frozen.discard(broker)

    def measure(self, broker: str, links: dict[str, LinkState]) -> None:
        """The runtime of ``broker`` measured its links to these neighbours (by name)."""
        self._emit(broker, self.brokers[broker].measured(links, self._clock))

    def lose(self, broker: str, neighbour: str, tally: Tally, reason: str) -> None:
        """``broker`` dropped the plain publications of ``tally`` on its link to ``neighbour``,
        which ended for ``reason``: it reports them, as a node does (``Broker.lost``)."""
        self._emit(broker, self.brokers[broker].lost(neighbour, tally, reason))

    def attach(self, name: str, broker: str, credentials: Credentials | None = None) -> SimClient:
        client = self.clients[name] = SimClient(name, broker)
        self.send(client, (credentials or Credentials()).hello(name))
        return client

    def detach(self, client: SimClient) -> None:
        """The client disconnects; what it had sent but the broker had not read is lost."""
        client.connected = False
        for key in ((client.name, client.broker), (client.broker, client.name)):
            if key in self._queues:
                self._queues[key].clear()
        self._emit(client.broker, self.brokers[client.broker].close(client.name))

    def send(self, client: SimClient, message: Envelope) -> None:
        self._enqueue(client.name, client.broker, message)

    # -- running -----------------------------------------------------------------------------

    def run(self, max_steps: int = 10_000_000) -> int:
        """Deliver messages until none is left; returns how many were delivered."""
        steps = self.step(max_steps)
        if self._movable():
            raise RuntimeError(f"no quiescence after {max_steps} messages: a routing loop?")
        return steps

    def _movable(self) -> list[int]:
        """The indexes in ``_ready`` of the links that may deliver now (neither end frozen)."""
        frozen = self.frozen
        if not frozen:
            return list(range(len(self._ready)))
        return [i for i, (a, b) in enumerate(self._ready) if a not in frozen and b not in frozen]

    def step(self, count: int) -> int:
        """Deliver up to ``count`` messages; returns how many were delivered."""
        steps = 0
        while self._ready and steps < count:
            if self.frozen:
                movable = self._movable()
                if not movable:
                    break
                i = movable[self.random.randrange(len(movable))]
            else:
                i = self.random.randrange(len(self._ready))
            key = self._ready[i]
            queue = self._queues[key]
            # A frame: up to FRAME messages of the link, read together as a node reads them.
            size = min(len(queue), count - steps, self.random.randint(1, FRAME))
            frame = [queue.popleft() for _ in range(size)]
            if not queue:
                self._ready[i] = self._ready[-1]
                self._ready.pop()
            if frame:  # empty if the link failed after this queue was scheduled
                self._deliver(key[0], key[1], frame)
                steps += len(frame)
        self.delivered += steps
        return steps

    def _deliver(self, source: str, target: str, frame: list[Envelope]) -> None:
        client = self.clients.get(target)
        if client is not None and client.broker == source:
            for message in frame:
                client.receive(message)
            return
        pump = self._pumps.get(target)
        if pump is None:
            return  # it crashed with these messages on their way
        seen = self.seen[target]
        for message in frame:
            if isinstance(message, RoutePublish):
                seen.append(message.publication)
                self.publications_routed += 1
            elif isinstance(message, Publication):
                seen.append(message)
        skew = self.skew.get(target, 0.0)
        pump.walk(source, frame, lambda: self._next_millisecond() + skew)

    def _next_millisecond(self) -> float:
        """The time for the next message handled: one millisecond a message."""
        self._clock += 1e-3
        return self._clock

    def queued(self, source: str, target: str) -> list[Envelope]:
        """The messages on their way from ``source`` to ``target``."""
        return list(self._queues.get((source, target), ()))

    def tick(self, seconds: float) -> None:
        """Let ``seconds`` pass with no message, and give every broker a tick (its journal
        committed before what the tick sends, as a node's is)."""
        self._clock += seconds
        for name, broker in self.brokers.items():
            if name not in self.frozen:
                self._pumps[name].dispatch(broker.tick(self._clock + self.skew.get(name, 0.0)))

    @property
    def clock(self) -> float:
        return self._clock

    def _emit(self, source: str, outs: list[Out]) -> None:
        # Sorted by hop (stable: each link keeps its order), so that the order in which a broker
        # happens to list messages for different links does not change the schedule.
        for hop, message in sorted(outs, key=lambda out: out[0]):
            self._enqueue(source, hop, message)

    def _enqueue(self, source: str, target: str, message: Envelope) -> None:
        message = ENVELOPES.decode(encode(message))  # what the receiver reads
        key = (source, target)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
        if not queue:
            self._ready.append(key)
        queue.append(message)

    def tables_empty(self) -> bool:
        return all(b.is_empty() for b in self.brokers.values())
