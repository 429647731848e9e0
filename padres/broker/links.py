"""Links: a broker's connections to its neighbour brokers.

A link starts when either side dials (``Links.open_link`` sends its ``hello``) and the other
answers with its own. A connection this broker dialled carries a broker: a client's ``hello``
on it is refused. Once greeted, a neighbour is offered the schemas and the advertisement trees
it does not have yet. A lost link takes with it what was learned through it: the trees it was
the parent of move to other ways (``paths``) or are withdrawn from the other neighbours, and
the routes, echoes, recoveries and replays that went through it end.
"""

from __future__ import annotations

from padres.broker.advertising import Advertising
from padres.broker.durable import Durables
from padres.broker.echoes import Echoes
from padres.broker.history import History
from padres.broker.routes import Out, Routes
from padres.broker.schemas import Schemas
from padres.model.protocol import Error, Hello, Role
from padres.security.accounts import Credentials

__all__ = ["Links"]


class Links:
    """The links of one broker to its neighbours."""

    def __init__(
        self,
        broker_id: str,
        credentials: Credentials,
        peers: dict[str, str],
        routes: Routes,
        schemas: Schemas,
        history: History,
        echoes: Echoes,
        durables: Durables,
        advertising: Advertising,
    ) -> None:
        """``credentials``: what this broker authenticates with to the neighbours it dials;
        ``peers``: the broker's neighbours, hop -> broker id, which only links change."""
        self.id = broker_id
        self.credentials = credentials
        self.peers = peers
        self.routes = routes
        self.schemas = schemas
        self.history = history
        self.echoes = echoes
        self.durables = durables
        self.advertising = advertising
        self._dialled: set[str] = set()
        """The connections this broker dialled (and greeted first)."""

    def open_link(self, hop: str) -> list[Out]:
        """Start a link to a neighbour broker on ``hop``: greet it."""
        self._dialled.add(hop)
        return [(hop, self.credentials.hello(self.id, Role.BROKER))]

    def dialled(self, hop: str) -> bool:
        """Whether this broker dialled the connection ``hop`` (its frames are trusted)."""
        return hop in self._dialled

    def hello(self, hello: Hello, hop: str) -> list[Out]:
        """The ``hello`` of a broker on ``hop``, admitted: it is a neighbour from now on (it is
        greeted back unless this broker dialled it)."""
        if hello.name == self.id:
            return [(hop, Error(f"broker {self.id} cannot link to itself"))]
        self.peers[hop] = hello.name
        self.routes.brokers.add(hop)
        out = [] if hop in self._dialled else self.open_link(hop)
        out += self.schemas.offer(hop)
        return out + self.advertising.link_opened(hop, hello.name)

    def close(self, hop: str, now: float) -> list[Out]:
        """The connection ``hop`` is gone; if it was a neighbour's link, what was learned
        through it is withdrawn from the rest of the overlay (the trees it was the parent of
        move to other ways where they can)."""
        self._dialled.discard(hop)
        name = self.peers.pop(hop, None)
        if name is None:
            return []
        self.routes.brokers.discard(hop)
        why = f"the link from {self.id} to {name} was lost"
        out = self.history.hop_down(hop, why)
        out += self.echoes.hop_down(hop, why)
        out += self.durables.hop_down(hop)
        out += self.advertising.link_lost(hop, now)
        return out + self.routes.hop_down(hop)
