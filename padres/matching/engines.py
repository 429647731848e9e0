"""The matching engines a user can choose by name (``padres match --engine``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from padres.matching.experta_matcher import ExpertaMatcher
from padres.matching.matcher import Matcher
from padres.matching.reference import ReferenceMatcher
from padres.matching.rete_matcher import ReteMatcher
from rete.limits import CompositeLimits

__all__ = ["ENGINES", "make_engine"]

ENGINES: Final[dict[str, Callable[[CompositeLimits], Matcher]]] = {
    "naive": ReferenceMatcher,
    "rete": ReteMatcher,
    "experta": ExpertaMatcher,
}


def make_engine(name: str, limits: CompositeLimits | None = None) -> Matcher:
    try:
        factory = ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r} (one of {', '.join(ENGINES)})") from None
    return factory(limits or CompositeLimits())
