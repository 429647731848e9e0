"""What a matcher is and what it returns, and the meaning of one filter against one publication."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, Protocol

from padres.matching.relations import satisfiable
from padres.model.messages import CompositeSubscription, Filter, Publication, Subscription, Variable
from rete.operators import NUMERIC, Op, Value, evaluate, predicate_test

__all__ = [
    "Checks",
    "CompositeMatch",
    "Conformity",
    "MatchResult",
    "Matcher",
    "checks",
    "conformity",
    "conforms",
    "conforms_to",
    "filter_bindings",
    "matches",
    "passes",
]


@dataclass(frozen=True, slots=True)
class CompositeMatch:
    """A composite subscription completed by ``publications`` (one per part of the pattern)."""

    subscription_id: str
    publications: tuple[Publication, ...]
    bindings: Mapping[str, Value]

    def key(self) -> tuple[str, frozenset[str], tuple[tuple[str, Value], ...]]:
        """Identity of the match: the same publications and bindings are one match."""
        return (
            self.subscription_id,
            frozenset(p.id for p in self.publications),
            tuple(sorted(self.bindings.items())),
        )


@dataclass(frozen=True, slots=True)
class MatchResult:
    """What one publication matched: atomic subscription ids and completed composites."""

    subscriptions: tuple[str, ...] = ()
    composites: tuple[CompositeMatch, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.subscriptions or self.composites)


class Matcher(Protocol):
    """A set of subscriptions that publications are matched against, in arrival order."""

    def add(self, subscription: Subscription | CompositeSubscription) -> None:
        """Add a subscription; its id must be new (``DuplicateId`` otherwise)."""

    def remove(self, subscription_id: str) -> None:
        """Remove a subscription and its partial composite state (``UnknownId`` if absent)."""

    def match(self, publication: Publication) -> MatchResult:
        """Match the next publication of the stream."""

    def advance(self, now: datetime) -> tuple[CompositeMatch, ...]:
        """Time passes with no publication: composites matched in timestamp order close the
        windows that end before ``now`` less their lateness; the matches that completes."""


def filter_bindings(
    flt: Filter, pub: Publication, bound: Mapping[str, Value] | None = None
) -> dict[str, Value] | None:
    """The variable bindings under which ``pub`` satisfies ``flt``, or None if it does not.

    ``bound`` holds bindings made by other parts; a variable already bound must see an equal
    value. A variable with ``eq`` binds strings and booleans, with ``=`` numbers; its type prefix
    narrows that further (``$S`` string, ``$I`` integer, ``$F`` any number).
    """
    attrs = pub.attributes
    out = dict(bound) if bound else {}
    for p in flt.predicates:
        value = attrs.get(p.attribute)
        if value is None:
            return None
        var = p.value
        if not isinstance(var, Variable):
            if not evaluate(p.op, var, value):
                return None
            continue
        numeric = type(value) is int or type(value) is float
        if numeric != (p.op in NUMERIC) or not var.accepts(value):
            return None
        previous = out.get(var.name)
        if previous is None:
            out[var.name] = value
        elif previous != value:
            return None
    return out


def matches(flt: Filter, pub: Publication) -> bool:
    """Whether ``pub`` satisfies a filter without variables."""
    return filter_bindings(flt, pub) is not None


def checks(flt: Filter) -> Checks:
    """The tests ``passes`` makes for a filter without variables: each predicate's attribute,
    test and operand, as the Rete network tests them."""
    return tuple((p.attribute, predicate_test(p.op), p.value) for p in flt.predicates)


def passes(tests: Checks, pub: Publication) -> bool:
    """Whether ``pub`` satisfies the filter of ``tests`` (``checks``): ``matches``, faster."""
    attrs = pub.attributes
    for attribute, test, operand in tests:
        value = attrs.get(attribute)
        if value is None or not test(value, operand):
            return False
    return True


def conforms(advertisement: Filter, pub: Publication) -> bool:
    """Whether ``pub`` is a publication ``advertisement`` announces, as PADRES checks it.

    Each attribute the publication carries satisfies the advertisement's predicates on it; an
    advertised attribute may be left out (``[class,'stock'],[price,80]`` conforms to
    ``[class,eq,'stock'],[price,<,100],[amount,>,100]``), and attributes the advertisement does
    not name are not checked. An advertisement that no publication can satisfy whole (``[x,>,5],
    [x,<,3]``) announces nothing, so that routing, which asks whether a subscription overlaps
    an advertisement, never misses a publication that conforms.
    """
    return conforms_to(_conformity(advertisement), pub)


Check = tuple[str, Callable[[Any, Any], bool], Any]


def conforms_to(checks: Conformity, pub: Publication) -> bool:
    """``conforms``, with the advertisement's ``conformity`` made beforehand."""
    if checks is None:
        return False
    attrs = pub.attributes
    for attribute, check, operand in checks:
        value = attrs.get(attribute)
        if value is not None and not check(value, operand):
            return False
    return True


def conformity(advertisement: Filter) -> Conformity:
    """The tests ``conforms`` makes for ``advertisement`` (``isPresent`` needs none), or
    None if it announces nothing: for a caller that keeps them as long as the advertisement
    (``conforms`` keeps the latest few thousand)."""
    if not satisfiable(advertisement):
        return None
    return tuple(
        (p.attribute, predicate_test(p.op), p.value)
        for p in advertisement.predicates
        if p.op is not Op.IS_PRESENT
    )


Checks = tuple[Check, ...]
Conformity = Checks | None
_conformity = lru_cache(maxsize=1 << 12)(conformity)
