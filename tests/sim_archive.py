"""A database for the simulation: it stores what its specs match and answers replay requests
when the test says so, so a test can choose exactly where the replay falls in the live stream."""

from __future__ import annotations

from dataclasses import dataclass, field

from padres.language.parser import parse_filter
from padres.matching.matcher import matches
from padres.model.messages import Advertisement, Publication, Subscription
from padres.model.protocol import (
    Envelope,
    Hello,
    Notify,
    ReplayBatch,
    ReplayEnd,
    ReplayOffer,
    ReplayRequest,
    Role,
)
from padres.runtime.simulation import SimClient, Simulation


@dataclass(eq=False)
class SimArchive(SimClient):
    sim: Simulation | None = None
    stored: dict[tuple[str, str], Publication] = field(default_factory=dict)
    requests: list[ReplayRequest] = field(default_factory=list)
    batch: int = 3

    @classmethod
    def attach(cls, sim: Simulation, name: str, broker: str) -> SimArchive:
        archive = sim.clients[name] = cls(name, broker, sim=sim)
        sim.send(archive, Hello(name, Role.CLIENT))
        return archive

    def store(self, spec: str, sid: str) -> None:
        """Store what ``spec`` matches from now on, and offer to replay it."""
        assert self.sim is not None
        flt = parse_filter(spec)
        self.sim.send(self, Subscription(sid, flt))
        self.sim.send(self, ReplayOffer(Advertisement(sid, flt)))

    def keep(self, pubs: list[Publication]) -> None:
        """Publications stored before the test began."""
        for pub in pubs:
            self.stored[pub.publisher, pub.id] = pub

    def receive(self, message: Envelope) -> None:
        if isinstance(message, Notify):
            self.keep([message.publication])
        elif isinstance(message, ReplayRequest):
            self.requests.append(message)
        else:
            super().receive(message)

    def answer(self, fail_after: int | None = None) -> None:
        """Answer every request received so far, in time order and in batches; with
        ``fail_after``, stop after that many batches without an end (as if it crashed)."""
        assert self.sim is not None
        for request in self.requests:
            flt = request.subscription.filter
            window = flt.window
            found = sorted(
                (
                    p
                    for p in self.stored.values()
                    if matches(flt, p) and (window is None or p.timestamp in window)
                ),
                key=lambda p: p.timestamp,
            )
            rid = request.subscription.id
            chunks = [found[i : i + self.batch] for i in range(0, len(found), self.batch)]
            for n, chunk in enumerate(chunks):
                if fail_after is not None and n >= fail_after:
                    return
                self.sim.send(self, ReplayBatch(rid, request.database, tuple(chunk)))
            self.sim.send(self, ReplayEnd(rid, request.database, len(found)))
        self.requests.clear()
