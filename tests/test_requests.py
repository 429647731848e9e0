"""One accessor per request shape: every publishing and subscribing request is read the same
way by the guard, schemas, quotas and replies, and a new wrapper cannot be forgotten."""

from __future__ import annotations

import types
import typing

import msgspec

from padres.language.parser import (
    parse_advertisement,
    parse_composite,
    parse_publication,
    parse_subscription,
)
from padres.model import protocol
from padres.model.messages import Publication, Subscription
from padres.model.protocol import (
    CompositeNotify,
    Durable,
    Envelope,
    ExceptionEntry,
    Failed,
    Guaranteed,
    Notify,
    Query,
    Recover,
    ReplayRequest,
    Retry,
    RoutePublish,
    RouteSubscribe,
    RouteTxPublish,
    Subscribe,
    TxNotify,
    TxPublish,
)
from padres.model.requests import (
    PublishingWrapper,
    SubscribingWrapper,
    composite_of,
    publication_of,
    reference,
    subscription_of,
)

PUB = parse_publication("[class,'stock'],[price,80]", id="p7")
SUB = parse_subscription("[class,eq,'stock'],[price,<,100]", id="s3")
NOT_REQUESTS: frozenset[type] = frozenset(
    {
        Notify,
        TxNotify,
        CompositeNotify,
        Failed,
        ExceptionEntry,
        Retry,
        ReplayRequest,
        RoutePublish,
        RouteTxPublish,
        RouteSubscribe,
        Recover,
    }
)
"""Messages that carry a publication or a subscription without asking to publish or make it:
deliveries, exception-queue entries, and what brokers send each other."""


def test_every_publishing_form_yields_its_publication_and_reference() -> None:
    for message in (PUB, Guaranteed(PUB), TxPublish("t1", PUB)):
        assert publication_of(message) is PUB
        assert subscription_of(message) is None
        assert reference(message) == "p7"


def test_every_subscribing_form_yields_its_subscription_and_reference() -> None:
    for message in (SUB, Subscribe(SUB), Durable(SUB, acked=4)):
        assert subscription_of(message) is SUB
        assert publication_of(message) is None
        assert reference(message) == "s3"


def test_every_composite_form_yields_its_composite_and_reference() -> None:
    composite = parse_composite("{[class,eq,'stock']} ; {[class,eq,'trade']} within 5s", id="c2")
    for message in (composite, Durable(composite)):
        assert composite_of(message) is composite
        assert subscription_of(message) is None and publication_of(message) is None
        assert reference(message) == "c2"
    assert composite_of(Durable(SUB)) is None


def test_other_messages_are_neither_and_keep_their_own_reference() -> None:
    adv = parse_advertisement("[class,eq,'stock'],[price,isPresent,0]", id="a1")
    assert publication_of(adv) is None and subscription_of(adv) is None
    assert reference(adv) == "a1"
    assert reference(Query("subscriptions")) == "?subscriptions"
    assert publication_of(Notify(PUB, ("s3",))) is None


def _carrying(kind: type) -> set[type]:
    """The protocol structs with a field of type ``kind`` (or of a union holding it)."""
    found = set()
    for value in vars(protocol).values():
        if isinstance(value, type) and issubclass(value, msgspec.Struct):
            hints = typing.get_type_hints(value)
            if any(kind in _alternatives(hint) for hint in hints.values()):
                found.add(value)
    return found


def _alternatives(hint: object) -> tuple[object, ...]:
    """The types a field's hint allows: those of a union, or the hint itself."""
    if isinstance(hint, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def test_a_new_wrapper_must_be_declared_a_request_or_not() -> None:
    publishing = set(typing.get_args(PublishingWrapper))
    subscribing = set(typing.get_args(SubscribingWrapper))
    assert _carrying(Publication) - NOT_REQUESTS == publishing
    assert _carrying(Subscription) - NOT_REQUESTS == subscribing
    for wrapper in publishing | subscribing:
        assert wrapper in typing.get_args(Envelope), wrapper
