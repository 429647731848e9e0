"""The historic store: every predicate in SQL gives exactly what the reference semantics give,
on SQLite and on PostgreSQL (when a server is reachable at 127.0.0.1:5432)."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from historic import Store, StoreError
from padres.matching import matches
from padres.messages import Filter, Predicate, Publication
from rete.operators import Op, OperandKind, Value, operand_kind
from tests.strategies import scaled

POSTGRES = os.environ.get(
    "PADRES_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
START = datetime(2026, 11, 1, 8, 0, tzinfo=UTC)

_BIG = 2**53
NUMBERS: list[int | float] = [
    0,
    1,
    -1,
    2,
    7,
    2.5,
    -0.5,
    1e-300,
    3.0,
    1e300,
    -1e300,
    _BIG,
    _BIG + 1,
    _BIG - 1,
    float(_BIG),
    float(_BIG + 2),
    2**63 - 1,
    -(2**63),
    2**63 * 1.0,
    -(2.0**63),
    2.0**64,
]
STRINGS = ["", "a", "ab", "abc", "b", "ba", "A", "é", "ä", "日本", "x%y", "x_y", "a\\b", "Ab"]
VALUES: list[Value] = [*NUMBERS, *STRINGS, True, False]
ATTRIBUTES = ["x", "y", "s"]


def _pool() -> list[Publication]:
    rng = random.Random(7)
    out = []
    for i in range(400):
        attrs: dict[str, Value] = {"class": rng.choice(["T", "U"])}
        for name in ATTRIBUTES:
            if rng.random() < 0.8:
                attrs[name] = rng.choice(VALUES)
        out.append(Publication(f"p{i}", attrs, START + timedelta(seconds=i), "pub"))
    return out


POOL = _pool()


def _postgres_url(schema: str) -> str | None:
    try:
        engine = sqlalchemy.create_engine(POSTGRES)
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
            conn.execute(sqlalchemy.text(f"CREATE SCHEMA {schema}"))
        engine.dispose()
    except sqlalchemy.exc.OperationalError:
        return None
    return f"{POSTGRES}?options=-csearch_path%3D{schema}"


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Store]:
    schema = f"padres_test_{os.getpid()}"
    if request.param == "sqlite":
        url: str | None = f"sqlite:///{tmp_path_factory.mktemp('db') / 'history.sqlite'}"
    else:
        url = _postgres_url(schema)
        if url is None:
            pytest.skip(f"no PostgreSQL server reachable at {POSTGRES} (set PADRES_TEST_POSTGRES)")
    assert url is not None
    s = Store(url)
    assert s.add(POOL) == len(POOL)
    yield s
    s.close()
    if request.param == "postgresql":
        engine = sqlalchemy.create_engine(POSTGRES)
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        engine.dispose()


def _operand(op: Op) -> st.SearchStrategy[Value | None]:
    kind = operand_kind(op)
    if kind is OperandKind.NUMBER:
        return st.sampled_from(NUMBERS)
    if kind is OperandKind.STRING:
        return st.sampled_from(STRINGS)
    if kind is OperandKind.STRING_OR_BOOLEAN:
        return st.sampled_from([*STRINGS, True, False])
    return st.none()


@st.composite
def _filters(draw: st.DrawFn) -> Filter:
    preds = [Predicate("class", Op.EQ, draw(st.sampled_from(["T", "U"])))]
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(list(Op)))
        preds.append(Predicate(draw(st.sampled_from(ATTRIBUTES)), op, draw(_operand(op))))
    return Filter(tuple(preds))


@settings(
    max_examples=scaled(300),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(flt=_filters())
def test_every_predicate_runs_in_sql_exactly(store: Store, flt: Filter) -> None:
    expected = [p.id for p in POOL if matches(flt, p)]
    assert [p.id for p in store.query(flt)] == expected


@pytest.mark.parametrize("op", list(Op))
def test_each_operator_selects_something_and_agrees(store: Store, op: Op) -> None:
    """Every operator, on every attribute and every operand of its kind, at least once."""
    for attribute in ATTRIBUTES:
        for operand in _operands(op):
            flt = Filter((Predicate("class", Op.EQ, "T"), Predicate(attribute, op, operand)))
            expected = [p.id for p in POOL if matches(flt, p)]
            assert [p.id for p in store.query(flt)] == expected, (attribute, op, operand)


def _operands(op: Op) -> list[Value | None]:
    kind = operand_kind(op)
    if kind is OperandKind.NUMBER:
        return list(NUMBERS)
    if kind is OperandKind.STRING:
        return list(STRINGS)
    if kind is OperandKind.STRING_OR_BOOLEAN:
        return [*STRINGS, True, False]
    return [None]


def test_stored_once_and_returned_whole_in_time_order(store: Store) -> None:
    assert store.add(POOL[:50]) == 0  # already there
    assert store.count() == len(POOL)
    flt = Filter((Predicate("class", Op.EQ, "U"),))
    window = store.query(
        flt, since=START + timedelta(seconds=100), until=START + timedelta(seconds=200)
    )
    assert window == [p for p in POOL[100:200] if p.class_name == "U"]  # whole publications
    assert store.query(flt, limit=3) == [p for p in POOL if p.class_name == "U"][:3]


def test_an_unusable_url_is_a_clear_error(tmp_path: pytest.TempPathFactory) -> None:
    with pytest.raises(StoreError, match="cannot open the store"):
        Store("sqlite:////nonexistent-dir/x/y.sqlite")
