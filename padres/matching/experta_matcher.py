"""experta as a matching engine: an independent Rete implementation to check ours against.

Each subscription becomes an experta rule; each publication a fact, declared and run. experta
builds its network when the engine is reset, so subscriptions are fixed once matching starts,
and it keeps every fact: only the consume-and-remain policy without bounds is offered. It is
slow; it serves as a referee in tests and as a baseline in benchmarks.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from datetime import datetime
from typing import Any

from padres.errors import DuplicateId, PadresError, UnknownId
from padres.matching.matcher import CompositeMatch, MatchResult
from padres.model.messages import CompositeSubscription, Filter, Publication, Subscription
from rete.conditions import Bind
from rete.limits import CompositeLimits, Policy
from rete.operators import NUMERIC, Op, Value, evaluate

__all__ = ["ExpertaMatcher"]

_ID = "_pid"


def _keyword_function(names: list[str], body: Callable[..., bool]) -> Callable[..., bool]:
    """A function experta can call by keyword: it reads parameter names from the signature."""

    def function(**kwargs: Any) -> bool:
        return body(**kwargs)

    params = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in names]
    function.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return function


class ExpertaMatcher:
    def __init__(self, limits: CompositeLimits | None = None) -> None:
        limits = limits or CompositeLimits()
        if (
            limits.policy is not Policy.CONSUME_AND_REMAIN
            or limits.window is not None
            or not limits.distinct
        ):
            raise PadresError(
                "the experta engine offers only consume-and-remain, distinct parts, without window"
            )
        self._subs: dict[str, Subscription | CompositeSubscription] = {}
        self._engine: Any = None
        self._fired: list[tuple[str, list[str], dict[str, Value]]] = []
        self._pubs: dict[str, Publication] = {}

    def add(self, subscription: Subscription | CompositeSubscription) -> None:
        if self._engine is not None:
            raise PadresError("the experta engine takes no new subscriptions once matching started")
        if subscription.id in self._subs:
            raise DuplicateId(subscription.id)
        if isinstance(subscription, CompositeSubscription) and subscription.timing is not None:
            raise PadresError(
                f"the experta engine matches in arrival order: {subscription.id!r} has a "
                "sequence or a window (use the rete or naive engine)"
            )
        self._subs[subscription.id] = subscription

    def remove(self, subscription_id: str) -> None:
        if self._engine is not None:
            raise PadresError(
                "the experta engine cannot remove subscriptions once matching started"
            )
        if self._subs.pop(subscription_id, None) is None:
            raise UnknownId(subscription_id)

    # -- building rules ----------------------------------------------------------------------

    def _pattern(self, flt: Filter, alias: str) -> Any:
        from experta import AS, MATCH, Fact, P, W
        from experta.fieldconstraint import ANDFC

        # Constraints are gathered per attribute and joined once: experta 1.9.4 fails on
        # ANDFC & ANDFC (fieldconstraint.py uses itertools.chain without importing it).
        terms: dict[str, list[Any]] = {}
        for p in flt.predicates:
            var = p.variable
            found = terms.setdefault(p.attribute, [])
            if var is not None:
                bind = Bind(p.attribute, var.name, p.op in NUMERIC, var.type.value)
                found.append(getattr(MATCH, f"v_{var.name}"))
                found.append(P(bind.accepts))
            elif p.op is Op.IS_PRESENT:
                found.append(W())
            else:
                found.append(P(lambda v, op=p.op, x=p.value: evaluate(op, x, v)))
        fields = {a: t[0] if len(t) == 1 else ANDFC(*t) for a, t in terms.items()}
        return getattr(AS, alias) << Fact(**fields)

    def _rules(self) -> dict[str, Any]:
        from experta import TEST, Rule

        rules: dict[str, Any] = {}
        for sid, sub in self._subs.items():
            patterns = (
                [(sub.filter,)]
                if isinstance(sub, Subscription)
                else [tuple(sub.filters[i] for i in pattern) for pattern in sub.patterns]
            )
            for parts in patterns:
                aliases = [f"f_{i}" for i in range(len(parts))]
                conditions = [self._pattern(f, a) for f, a in zip(parts, aliases, strict=True)]
                if len(parts) > 1:
                    conditions.append(TEST(_keyword_function(aliases, _distinct)))
                rules[f"rule_{len(rules)}"] = Rule(*conditions)(self._action(sid, aliases))
        return rules

    def _action(self, sid: str, aliases: list[str]) -> Callable[..., None]:
        fired = self._fired

        def action(engine: Any, **context: Any) -> None:
            pubs = [context[a][_ID] for a in aliases]
            bindings = {k[2:]: v for k, v in context.items() if k.startswith("v_")}
            fired.append((sid, pubs, bindings))

        return action

    # -- matching ----------------------------------------------------------------------------

    def advance(self, now: datetime) -> tuple[CompositeMatch, ...]:
        """Nothing waits for time here: composites in timestamp order are refused."""
        return ()

    def match(self, publication: Publication) -> MatchResult:
        from experta import Fact, KnowledgeEngine

        if self._engine is None:
            self._engine = type("Subscriptions", (KnowledgeEngine,), self._rules())()
            self._engine.reset()
        self._pubs[publication.id] = publication
        self._engine.declare(Fact(**publication.attributes, **{_ID: publication.id}))
        self._engine.run()
        fired, self._fired[:] = list(self._fired), []
        atomic = tuple(sid for sid, _, _ in fired if isinstance(self._subs[sid], Subscription))
        seen: set[object] = set()
        composites = []
        for sid, pids, bindings in fired:
            if isinstance(self._subs[sid], Subscription):
                continue
            match = CompositeMatch(sid, tuple(self._pubs[p] for p in pids), bindings)
            if match.key() not in seen:
                seen.add(match.key())
                composites.append(match)
        return MatchResult(atomic, tuple(composites))


def _distinct(**facts: Any) -> bool:
    ids = [f[_ID] for f in facts.values()]
    return len(set(ids)) == len(ids)
