"""Which subscriptions see a transactional publication, and how it is delivered to them."""

from __future__ import annotations

from collections.abc import Callable

from msgspec.structs import replace

from padres.broker.journal import Delivered, Tag
from padres.broker.routes import Out
from padres.model.messages import Publication
from padres.model.protocol import CompositeNotify, Notify, Outcome, TxNotify, Visibility

__all__ = ["deliveries", "delivery", "visible"]

_SEEN_BY: dict[Outcome, frozenset[Visibility]] = {
    Outcome.PENDING: frozenset({Visibility.IMMEDIATE}),
    Outcome.COMMITTING: frozenset({Visibility.DEFERRED}),
    Outcome.COMMITTED: frozenset({Visibility.ON_COMMIT, Visibility.IMMEDIATE, Visibility.DEFERRED}),
    Outcome.ABORTED: frozenset({Visibility.IMMEDIATE, Visibility.DEFERRED, Visibility.ON_ABORT}),
}


def visible(visibility: Visibility, outcome: Outcome) -> bool:
    """Whether a subscription of ``visibility`` sees a publication at ``outcome``."""
    return visibility in _SEEN_BY[outcome]


def delivery(
    item: Delivered, ids: tuple[str, ...], seq: int, tag: Tag | None
) -> Notify | CompositeNotify:
    """The delivery of ``item`` to subscriptions ``ids``: a ``TxNotify`` for a transaction's
    publication; a composite's match as it is (its subscription named), numbered ``seq``."""
    if isinstance(item, CompositeNotify):
        return replace(item, seq=seq)
    pub = item
    if tag is None:
        return Notify(pub, ids, seq)
    return TxNotify(pub, ids, seq, tx=tag[0], outcome=tag[1])


def deliveries(
    pub: Publication,
    owners: dict[str, list[str]],
    tag: Tag,
    visibility_of: Callable[[str, str], Visibility],
) -> list[Out]:
    """The ``TxNotify`` of each local owner (a client's hop) whose subscriptions ``ids`` see
    ``pub`` at its outcome; ``visibility_of(hop, id)`` says what a subscription sees."""
    out: list[Out] = []
    for owner, ids in owners.items():
        seeing = tuple(sid for sid in ids if visible(visibility_of(owner, sid), tag[1]))
        if seeing:
            out.append((owner, TxNotify(pub, seeing, tx=tag[0], outcome=tag[1])))
    return out
