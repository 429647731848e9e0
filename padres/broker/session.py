"""What a broker keeps for each connected client, and the ids it translates."""

from __future__ import annotations

from copy import copy
from dataclasses import dataclass, field

from msgspec.structs import force_setattr

from padres.matching.matcher import Conformity, conformity
from padres.model.messages import Advertisement, Publication
from padres.model.protocol import Visibility
from padres.security.accounts import Account

__all__ = ["LocalAdvertisement", "Session", "stamped"]


@dataclass
class Session:
    """A client attached to this broker.

    Clients choose their own ids (``s1``, ``a1``, ...), unique only per client; the broker maps
    each to an overlay-wide id (``<broker>#<epoch>.<n>``) when it enters the overlay.
    """

    hop: str
    name: str
    """The client's name in the overlay (``<client>@<broker>``), stamped on its publications."""
    subscriptions: dict[str, str] = field(default_factory=dict)
    composites: dict[str, str] = field(default_factory=dict)
    advertisements: dict[str, str] = field(default_factory=dict)
    """Its advertisements (and replay offers): the client's id -> the overlay-wide id."""
    conforming: dict[str, dict[str, Conformity]] = field(default_factory=dict)
    """Its advertisements by class, in the order made: overlay-wide id -> the tests a
    publication conforming to it passes (made once: a publisher's every publication is
    checked against the advertisements of its class)."""
    visibility: dict[str, Visibility] = field(default_factory=dict)
    """Subscriptions that see transactional publications otherwise than ``on_commit``."""
    account: Account | None = None
    """The account it authenticated as (None on a broker without accounts)."""
    _classes: dict[str, str] = field(default_factory=dict)
    """The class of each advertisement in ``conforming``, by overlay-wide id."""

    def advertised(self, advertisement: Advertisement, gid: str) -> None:
        """The client made ``advertisement``, overlay-wide ``gid``."""
        self.advertisements[advertisement.id] = gid
        checks = conformity(advertisement.filter)
        self.conforming.setdefault(advertisement.filter.class_name, {})[gid] = checks
        self._classes[gid] = advertisement.filter.class_name

    def unadvertised(self, advertisement: str) -> str | None:
        """The client withdrew ``advertisement``: its overlay-wide id, None if there is none."""
        gid = self.advertisements.pop(advertisement, None)
        if gid is None:
            return None
        class_name = self._classes.pop(gid, None)
        if class_name is not None:  # an advertisement, not a replay offer
            same = self.conforming[class_name]
            del same[gid]
            if not same:
                del self.conforming[class_name]
        return gid

    def drop(self, subscription: str) -> str | None:
        """Forget the subscription (plain or composite) and its visibility: its overlay-wide
        id, None if there is none."""
        self.visibility.pop(subscription, None)
        return self.subscriptions.pop(subscription, None) or self.composites.pop(subscription, None)


@dataclass
class LocalAdvertisement:
    """An advertisement made at this broker.

    ``hidden_by``: the local advertisement covering it, if it was not flooded for that reason;
    it then belongs to that one's tree, and publications conforming to it travel down that tree.
    """

    owner: str
    tree: str
    hidden_by: str | None = None
    hides: set[str] = field(default_factory=set)


def stamped(pub: Publication, session: Session) -> Publication:
    """``pub`` with its publisher: the client of ``session``, whatever it said. The copy is not
    checked again (``replace`` would: a tenth of a publisher's broker's time): only the
    publisher changes, to a session name, which is valid."""
    if pub.publisher == session.name:
        return pub
    copied = copy(pub)
    force_setattr(copied, "publisher", session.name)
    return copied
