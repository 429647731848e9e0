"""What a client's request asks for, whatever its wrapper.

A publication travels in three forms (plain, ``Guaranteed``, ``TxPublish``), a subscription
in three (plain, ``Subscribe`` with options, ``Durable``) and a composite subscription in two
(plain, ``Durable``). The parts of a broker that screen requests (grants, schemas, quotas) and
the replies that name a request read them through ``publication_of``, ``subscription_of``,
``composite_of`` and ``reference``, so each handles a request once.

Adding a kind of request: declare its struct in ``padres.model.protocol`` (and name it in
``Envelope``); if it wraps a publication or a subscription, add it to ``PublishingWrapper`` or
``SubscribingWrapper`` here; then give it its handler in ``padres.broker.core``.
"""

from __future__ import annotations

from typing import TypeAlias

from padres.model.messages import (
    Advertisement,
    CompositeSubscription,
    Publication,
    Subscription,
    Unadvertise,
    Unsubscribe,
)
from padres.model.protocol import (
    DeclareSchema,
    DropSchema,
    Durable,
    Envelope,
    Exceptions,
    Guaranteed,
    Query,
    ReplayOffer,
    Subscribe,
    TxPublish,
)

__all__ = [
    "PublishingWrapper",
    "SubscribingWrapper",
    "composite_of",
    "publication_of",
    "reference",
    "subscription_of",
]

PublishingWrapper: TypeAlias = Guaranteed | TxPublish
"""Requests that publish the ``publication`` they carry, with a promise about it."""
SubscribingWrapper: TypeAlias = Subscribe | Durable
"""Requests that make the ``subscription`` they carry, with options."""


def publication_of(message: Envelope) -> Publication | None:
    """The publication ``message`` asks to publish, if it is a publishing request."""
    if type(message) is Publication:
        return message
    if isinstance(message, PublishingWrapper):
        return message.publication
    return None


def subscription_of(message: Envelope) -> Subscription | None:
    """The subscription ``message`` asks for, if it is a subscribing request (composite
    subscriptions are their own kind: ``composite_of``)."""
    if type(message) is Subscription:
        return message
    if isinstance(message, SubscribingWrapper) and isinstance(message.subscription, Subscription):
        return message.subscription
    return None


def composite_of(message: Envelope) -> CompositeSubscription | None:
    """The composite subscription ``message`` asks for, plain or durable, if it is one."""
    if isinstance(message, CompositeSubscription):
        return message
    if isinstance(message, Durable) and isinstance(message.subscription, CompositeSubscription):
        return message.subscription
    return None


def reference(message: Envelope) -> str:
    """The id an answer to ``message`` refers to (empty for a message without one; a query's
    is ``?<what>``)."""
    pub = publication_of(message)
    if pub is not None:
        return pub.id
    sub = subscription_of(message) or composite_of(message)
    if sub is not None:
        return sub.id
    match message:
        case Advertisement() | DeclareSchema() | DropSchema():
            return message.id
        case ReplayOffer():
            return message.advertisement.id
        case Unsubscribe():
            return message.subscription_id
        case Unadvertise():
            return message.advertisement_id
        case Query():
            return f"?{message.what}"
        case Exceptions():
            return message.ref
    return ""
