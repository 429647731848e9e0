"""Publishing: publications, from a broker's clients and neighbours, down their trees.

A client's publication is stamped with its publisher and goes down the tree of the publisher's
advertisement it conforms to; with the conformity check on (``BrokerConfig.conformity``), one
that conforms to none is refused. A guaranteed publication is written to the journal first, and
a second copy of one (sent again after a lost acknowledgement) is only acknowledged.

Delivering a publication, here or at a neighbour's broker it came down to, sends it on down
its tree to the neighbours that sent a matching subscription, queues it for durable
subscriptions, feeds the watches of historic ones, notifies local subscribers (a transaction's
publication by each subscription's visibility, ``visibility``) and completes composite
subscriptions.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Final

from padres.broker.durable import Durables
from padres.broker.echoes import Echoes
from padres.broker.history import History
from padres.broker.journal import Journal, Tag
from padres.broker.paths import Paths
from padres.broker.routes import Out, Routes
from padres.broker.session import Session, stamped
from padres.broker.subscribing import LocalComposite
from padres.broker.timeline import AHEAD
from padres.broker.trees import Tree, Trees
from padres.broker.visibility import deliveries
from padres.broker.votes import Votes
from padres.matching.matcher import conforms_to
from padres.model.messages import Publication
from padres.model.protocol import (
    CompositeNotify,
    Error,
    Notify,
    Ok,
    Outcome,
    RoutePublish,
    RouteTxPublish,
    Visibility,
)
from rete import Activation

__all__ = ["GRACE", "Publishing"]

GRACE: Final = 1.0
"""Seconds the broker's clock is taken to lag behind publishers' timestamps: composites
matched in timestamp order close their windows by the broker's clock this much late (and
less their lateness), so that a publication a client stamped just before it sent it is not
late for having crossed a tick."""


class Publishing:
    """Where a broker's publications go, and how they are delivered."""

    def __init__(
        self,
        routes: Routes,
        trees: Trees,
        journal: Journal,
        durables: Durables,
        history: History,
        sessions: Mapping[str, Session],
        composites: Mapping[str, LocalComposite],
        conformity: bool,
        votes: Votes,
        paths: Paths,
        echoes: Echoes,
    ) -> None:
        """``sessions``: the broker's connected clients by hop; ``composites``: the composite
        subscriptions matched here (both read, never changed); ``conformity``: whether a
        publication must conform to one of its publisher's advertisements."""
        self.routes = routes
        self.votes = votes
        self.trees = trees
        self.journal = journal
        self.durables = durables
        self.history = history
        self.conformity = conformity
        self.paths = paths
        self.echoes = echoes
        self._sessions = sessions
        self._composites = composites

    def publish(
        self, pub: Publication, session: Session, now: float, guaranteed: bool = False
    ) -> list[Out]:
        """A publication from the client of ``session``; a ``guaranteed`` one is journalled
        before it is delivered, and acknowledged."""
        pub = stamped(pub, session)
        tree = self.tree_for(pub, session, strict=guaranteed)
        if guaranteed:
            if tree is None:
                why = f"guaranteed publication {pub.id!r} conforms to none of your advertisements"
                return [(session.hop, Error(why, pub.id))]
            position, new = self.journal.append(tree, pub, now)
            ack: list[Out] = [(session.hop, Ok(pub.id))]
            if not new:
                return ack
            return self.deliver(pub, tree, session.hop, position, exact=True) + ack
        if tree is None and self.conformity:
            return [
                (
                    session.hop,
                    Error(
                        f"publication {pub.id!r} matches none of the advertisements of "
                        f"{session.name}: advertise what you publish first",
                        pub.id,
                    ),
                )
            ]
        return self.deliver(pub, tree, session.hop, exact=self.conformity)

    def tree_for(self, pub: Publication, session: Session, strict: bool = False) -> str | None:
        """The tree of an advertisement of the publisher that ``pub`` conforms to.

        Without the conformity check a publication that conforms to none takes the tree of the
        publisher's first advertisement (it reaches the subscriptions routed there only), or,
        with no advertisement at all, reaches local subscribers only. Not when ``strict`` (a
        guaranteed or transactional publication, which must reach every subscriber): None.
        """
        for gid, checks in session.conforming.get(pub.class_name, {}).items():
            if conforms_to(checks, pub):
                tree = self.trees.tree_of(gid)
                if tree is not None:
                    return tree.id
        if self.conformity or strict:
            return None
        trees = (self.trees.tree_of(gid) for gid in session.advertisements.values())
        return next((tree.id for tree in trees if tree is not None), None)

    def arrive(self, message: RoutePublish | RouteTxPublish, hop: str, now: float) -> list[Out]:
        """A publication sent down its tree by the neighbour on ``hop``: from its parent, or
        from a former one while the tree moves (``paths``), once."""
        tree = self.trees.get(message.tree)
        if tree is None or not self.paths.accepts(tree, hop, message, now):
            return []  # along a route left over from an earlier path of the tree, or again
        pub = message.publication
        if isinstance(message, RouteTxPublish):
            tag = (message.tx, message.outcome)
            return self.deliver(pub, tree.id, hop, message.position, tag)
        if message.matched is None:
            return self.deliver(pub, tree.id, hop, message.position)
        known = message.matched if self._trusts(hop, tree) else None
        return self.deliver(pub, tree.id, hop, message.position, known=known, exact=True)

    def trusts(self, message: RoutePublish, hop: str) -> bool:
        """Whether the subscriptions ``message`` says it matches (``RoutePublish.matched``)
        are all those forwarded to ``hop`` that it matches: ``hop`` has taken in every
        routing message sent to it (each has echoed), and knew all it could match here
        (``Routes.knows``)."""
        tree = self.trees.get(message.tree)
        return message.matched is not None and tree is not None and self._trusts(hop, tree)

    def _trusts(self, hop: str, tree: Tree) -> bool:
        return not self.echoes.awaited(hop) and self.routes.knows(hop, tree)

    def deliver(
        self,
        pub: Publication,
        tree: str | None,
        source: str,
        position: int = 0,
        tag: Tag | None = None,
        *,
        known: tuple[str, ...] | None = None,
        exact: bool = False,
    ) -> list[Out]:
        """Route ``pub`` down ``tree`` and deliver it here; ``tag``: a transaction's, which
        each subscription sees by its visibility (composite and historic subscriptions see
        committed ones only). ``exact`` (no ``tag``): ``pub`` conforms to the advertisement
        of ``tree``, so each neighbour it goes to is told which of its subscriptions it
        matches (``RoutePublish.matched``) and need not match it again; ``known``: what
        ``source`` told this broker so (``Routes.match``)."""
        committed = tag is None or tag[1] is Outcome.COMMITTED
        matches = self.routes.match(
            pub, tree, source, composites=committed, known=known, exact=exact
        )
        out: list[Out] = []
        if tree is not None and matches.hops:
            found = matches.found
            if tag is not None:
                message = RouteTxPublish(pub, tree, tag[0], tag[1], position)
                out += [(hop, message) for hop in sorted(matches.hops)]
            elif found is None:
                shared = RoutePublish(pub, tree, position)  # encoded once for every hop
                out += [(hop, shared) for hop in sorted(matches.hops)]
            else:
                out += [
                    (hop, RoutePublish(pub, tree, position, tuple(found[hop])))
                    for hop in sorted(matches.hops)
                ]
        if matches.durables:
            out += self.durables.arrived(matches.durables, pub, tree, position, tag)
        if committed:
            for pid in matches.watches:
                out += self.history.arrived(pid, pub)
        if tag is None:
            out += [(client, Notify(pub, tuple(ids))) for client, ids in matches.clients.items()]
        else:
            delivered = deliveries(pub, matches.clients, tag, self._visibility)
            if tag[1] in (Outcome.PENDING, Outcome.COMMITTING):
                if tree is not None and (delivered or matches.durables):
                    self.votes.delivered(tag[0], tree, (hop for hop, _ in delivered))
            else:
                self.votes.ended(tag[0])
            out += delivered
        if matches.activations:
            out += self._notify(matches.activations)
        return out

    def windows_closed(self, now: float) -> list[Out]:
        """The composites matched in timestamp order take the broker's clock, ``GRACE``
        seconds behind ``now``, as a lower bound of their watermark: matches that wait for a
        window to close with no absent publication are reported although no publication
        comes (docs/language.md, "Sequences and windows"); historic and hybrid ones too, once
        their past is complete (``History.advance``), and the durable ones
        (``Durables.advance``). Called at every tick."""
        clock = datetime.fromtimestamp(now - GRACE, UTC)
        out = self._notify(self.routes.network.advance(clock, AHEAD))
        return out + self.history.advance(clock) + self.durables.advance(clock, AHEAD)

    def _notify(self, activations: list[Activation]) -> list[Out]:
        out: list[Out] = []
        for activation in activations:
            owner, local_id, _ = self._composites[activation.id]
            facts: tuple[Publication, ...] = activation.facts
            out.append((owner, CompositeNotify(local_id, facts, activation.bindings)))
        return out

    def _visibility(self, hop: str, subscription: str) -> Visibility:
        session = self._sessions.get(hop)
        if session is None:
            return Visibility.ON_COMMIT
        return session.visibility.get(subscription, Visibility.ON_COMMIT)
