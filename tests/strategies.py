"""Hypothesis strategies for messages of the language."""

from __future__ import annotations

import os
from datetime import UTC, datetime

from hypothesis import strategies as st

from padres.model.messages import (
    AllOf,
    AnyOf,
    CompositeSubscription,
    Expression,
    Filter,
    Predicate,
    Publication,
    Subscription,
    Variable,
    VarType,
)
from rete.operators import NUMERIC, Op, OperandKind, Value, operand_kind

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def scaled(examples: int) -> int:
    """Example counts times ``$PADRES_HYPOTHESIS_SCALE`` (default 1), for thorough runs."""
    return examples * int(os.environ.get("PADRES_HYPOTHESIS_SCALE", "1"))


names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.\-]{0,8}", fullmatch=True).filter(
    lambda n: n != "class"
)
strings = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=10)
ints = st.integers(-(2**63), 2**63 - 1)
floats = st.floats(allow_nan=False, allow_infinity=False)
values: st.SearchStrategy[Value] = st.one_of(strings, ints, floats, st.booleans())


def operand(op: Op) -> st.SearchStrategy[Value | None]:
    kind = operand_kind(op)
    if kind is OperandKind.NUMBER:
        return st.one_of(ints, floats)
    if kind is OperandKind.STRING:
        return strings
    if kind is OperandKind.STRING_OR_BOOLEAN:
        return st.one_of(strings, st.booleans())
    return st.none()


@st.composite
def predicates(draw: st.DrawFn, attributes: st.SearchStrategy[str] = names) -> Predicate:
    op = draw(st.sampled_from(list(Op)))
    return Predicate(draw(attributes), op, draw(operand(op)))


@st.composite
def filters(draw: st.DrawFn, variables: bool = False) -> Filter:
    preds = [Predicate("class", Op.EQ, draw(strings))]
    preds += draw(st.lists(predicates(), max_size=4))
    if variables:
        for name in draw(st.lists(st.sampled_from("XYZ"), max_size=2)):
            numeric = name == "Y"  # keep each variable's operator family fixed
            var = Variable(name, VarType.ANY)
            preds.append(Predicate(draw(names), Op.EQ_NUM if numeric else Op.EQ, var))
    order = draw(st.permutations(preds))
    return Filter(tuple(order))


@st.composite
def publications(draw: st.DrawFn) -> Publication:
    attrs: dict[str, Value] = {"class": draw(strings)}
    attrs.update(draw(st.dictionaries(names, values, max_size=6)))
    items = draw(st.permutations(list(attrs.items())))
    return Publication("p1", dict(items), NOW, "pub1")


@st.composite
def subscriptions(draw: st.DrawFn) -> Subscription:
    return Subscription("s1", draw(filters()))


def expressions() -> st.SearchStrategy[Expression]:
    leaves = filters(variables=True)
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, min_size=2, max_size=3).map(lambda ps: AllOf(tuple(ps))),
            st.lists(inner, min_size=2, max_size=3).map(lambda ps: AnyOf(tuple(ps))),
        ),
        max_leaves=6,
    )


composites = st.builds(CompositeSubscription, st.just("s9"), expressions())

__all__ = [
    "NOW",
    "NUMERIC",
    "composites",
    "filters",
    "predicates",
    "publications",
    "scaled",
    "subscriptions",
    "values",
]
