"""How much one client may hold at a broker: subscriptions, advertisements and durable queues.

Every subscription and advertisement costs routing state at every broker it reaches, so a
broker bounds how many one client keeps. A request beyond the quota is refused with an
``error`` naming the quota; what the client already has is untouched. Schemas cost state at
every broker too: a broker bounds how many the overlay holds, and how many attributes one
has, when one is declared.
"""

from __future__ import annotations

from dataclasses import dataclass

from padres.broker.session import Session
from padres.model.messages import Advertisement, CompositeSubscription, Subscription
from padres.model.protocol import Envelope, Error
from padres.model.requests import composite_of, subscription_of

__all__ = ["Quotas"]


@dataclass(frozen=True, slots=True)
class Quotas:
    """What one client session may hold at its broker at a time."""

    subscriptions: int = 10_000
    """Subscriptions one client may hold (atomic, composite and durable together; durable
    ones count while the client is away too)."""
    advertisements: int = 10_000
    """Advertisements one client may hold."""
    schemas: int = 1_000
    """Schemas of typed classes the overlay holds (dropped ones do not count): a declaration
    of one more, at this broker, is refused."""
    schema_attributes: int = 100
    """Attributes of one schema: a declaration of more, at this broker, is refused."""
    durable_queued: int = 10_000_000
    """Deliveries one durable subscription keeps for its client, at most; past that, the
    oldest tenth is discarded, and the client is told how many when it comes back."""
    durable_queue_bytes: int = 1 << 30
    """Bytes of deliveries one durable subscription keeps for its client, at most; past that,
    the oldest tenth is discarded, and the client is told how many when it comes back."""
    durable_bytes: int = 1 << 30
    """Bytes of deliveries queued for one client's durable subscriptions together, at most;
    past that, the oldest deliveries of its largest queue are discarded, and the client is
    told how many when it comes back."""

    def __post_init__(self) -> None:
        counts = (self.subscriptions, self.advertisements, self.schemas, self.schema_attributes)
        durable = (self.durable_queued, self.durable_queue_bytes, self.durable_bytes)
        if min(*counts, *durable) < 1:
            raise ValueError("quotas must be at least 1")

    def refusal(self, message: Envelope, session: Session, durables: int = 0) -> Error | None:
        """The error refusing ``message`` if it would take ``session`` over a quota; its
        client keeps ``durables`` durable subscriptions (a durable one taken up again is not
        counted: the caller does not ask for it)."""
        asked = subscription_of(message) or composite_of(message) or message
        match asked:
            case Subscription() | CompositeSubscription():
                ident, what, limit = asked.id, "subscriptions", self.subscriptions
            case Advertisement():
                ident, what, limit = asked.id, "advertisements", self.advertisements
            case _:
                return None
        held = (
            len(session.subscriptions) + len(session.composites) + durables
            if what == "subscriptions"
            else len(session.advertisements)
        )
        if held < limit:
            return None
        return Error(
            f"too many {what}: this client holds {held:,}, the limit per client is "
            f"{limit:,}; remove some first",
            ident,
        )
