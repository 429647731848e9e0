"""The historic store: every predicate in SQL gives exactly what the reference semantics give,
on SQLite and on PostgreSQL (when a server is reachable at 127.0.0.1:5432); a publication the
database refuses is set aside and costs no other; a busy database is not blamed on the data."""

from __future__ import annotations

import os
import random
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec.structs import force_setattr

from historic import Store
from historic.errors import StoreError, StoreUnavailable
from historic.store import Written
from padres.matching.matcher import matches
from padres.model.codec import to_dict
from padres.model.messages import Attributes, Filter, Predicate, Publication
from rete.operators import Op, OperandKind, Value, operand_kind
from tests.postgres import database_url, drop_schema
from tests.strategies import scaled

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


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Store]:
    schema = f"padres_test_{os.getpid()}"
    url = database_url(request.param, schema, tmp_path_factory.mktemp("db") / "history.sqlite")
    s = Store(url)
    assert s.add(POOL) == len(POOL)
    yield s
    s.close()
    if request.param == "postgresql":
        drop_schema(schema)


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


@pytest.fixture(params=["sqlite", "postgresql"])
def empty(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A new, empty store of each kind."""
    schema = f"padres_empty_{os.getpid()}"
    url = database_url(request.param, schema, tmp_path / "empty.sqlite")
    s = Store(url)
    yield s
    s.close()
    if request.param == "postgresql":
        drop_schema(schema)


def _unchecked(ident: str, stamp: str) -> Publication:
    """A publication with a timestamp that has no UTC equivalent: refused where publications
    are made, so made around the check, as a store must expect of input it did not make."""
    pub = Publication(ident, {"class": "T"}, START, "pub")
    force_setattr(pub, "timestamp", datetime.fromisoformat(stamp))
    return pub


def _unchecked_text(ident: str, text: str) -> Publication:
    """A publication with a string the language refuses (a lone surrogate, a NUL), made
    around the check in the same way."""
    pub = Publication(ident, {"class": "T"}, START, "pub")
    force_setattr(pub, "attributes", Attributes({"class": "T", "s": text}))
    return pub


def test_a_refused_publication_is_set_aside_and_the_rest_stored(empty: Store) -> None:
    good = [Publication(f"g{i}", {"class": "T", "n": i}, START, "pub") for i in range(20)]
    bad = [
        _unchecked("early", "0001-01-01T00:00:00+01:00"),
        _unchecked("late", "9999-12-31T23:59:59-01:00"),
        _unchecked_text("surrogate", "a\ud800b"),  # no UTF-8
    ]
    if empty.dialect == "postgresql":
        bad.append(_unchecked_text("nul", "a\x00b"))
    batch = [*good[:7], bad[0], *good[7:15], *bad[1:], *good[15:]]
    with pytest.raises(StoreError):
        empty.add(batch)  # one transaction: nothing stored
    assert empty.count() == 0

    assert empty.write(batch) == Written(stored=len(good), set_aside=len(bad))
    assert empty.query(Filter((Predicate("class", Op.EQ, "T"),))) == good
    kept = {r.id: r for r in empty.rejected()}
    assert sorted(kept) == sorted(p.id for p in bad)
    assert "surrogates not allowed" in kept["surrogate"].reason
    assert "OverflowError" in kept["early"].reason
    assert kept["late"].body["timestamp"] == "9999-12-31T23:59:59-01:00"  # kept whole
    assert empty.write(batch) == Written()  # written again: nothing new, nothing twice


def test_a_locked_database_is_unavailable_and_nothing_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "locked.sqlite"
    store = Store(f"sqlite:///{path}?timeout=0.05")
    lock = sqlite3.connect(path, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    pubs = [Publication(f"p{i}", {"class": "T"}, START, "pub") for i in range(5)]
    with pytest.raises(StoreUnavailable, match="locked"):
        store.write(pubs)
    lock.execute("ROLLBACK")
    lock.close()
    assert store.rejected() == []
    assert store.write(pubs) == Written(stored=5)
    store.close()


def _earlier_layout(url: str, pubs: list[Publication]) -> None:
    """A store of the earlier layout: the whole publication as JSON in a ``body`` column, and
    one ``attributes`` row per attribute value."""
    old = sqlalchemy.MetaData()
    publications = sqlalchemy.Table(
        "publications",
        old,
        sqlalchemy.Column("pk", sqlalchemy.Integer, primary_key=True),
        sqlalchemy.Column("id", sqlalchemy.String(256), nullable=False),
        sqlalchemy.Column("publisher", sqlalchemy.String(256), nullable=False),
        sqlalchemy.Column("class", sqlalchemy.String(256), nullable=False),
        sqlalchemy.Column("time", sqlalchemy.DateTime(timezone=True), nullable=False),
        sqlalchemy.Column("body", sqlalchemy.JSON, nullable=False),
        sqlalchemy.UniqueConstraint("publisher", "id", name="publication_identity"),
        sqlalchemy.Index("publications_class_time", "class", "time"),
    )
    sqlalchemy.Table(
        "attributes",
        old,
        sqlalchemy.Column("pub", sqlalchemy.ForeignKey("publications.pk"), nullable=False),
        sqlalchemy.Column("name", sqlalchemy.String(256), nullable=False),
    )
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as conn:
        old.create_all(conn)
        conn.execute(
            publications.insert(),
            [
                {
                    "id": p.id,
                    "publisher": p.publisher,
                    "class": p.class_name,
                    "time": p.timestamp,
                    "body": to_dict(p),
                }
                for p in pubs
            ],
        )
    engine.dispose()


def test_a_store_of_the_earlier_layout_is_migrated_whole(empty: Store) -> None:
    url = empty.url
    empty.close()
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as conn:
        for table in ("layout", "fields", "publications", "rejected", "specs"):
            conn.execute(sqlalchemy.text(f"DROP TABLE {table}"))
    engine.dispose()
    _earlier_layout(url, POOL[:120])
    store = Store(url)
    assert store.count() == 120
    flt = Filter((Predicate("class", Op.EQ, "T"), Predicate("x", Op.GT, 0)))
    assert store.query(flt) == [p for p in POOL[:120] if matches(flt, p)]
    assert store.add(POOL[:150]) == 30  # the migrated ones are known
    store.close()
    with pytest.raises(StoreError, match="padres did not make"):
        _other = sqlalchemy.create_engine(url)
        with _other.begin() as conn:
            conn.execute(sqlalchemy.text("DROP TABLE layout"))
        _other.dispose()
        Store(url)


def test_old_publications_are_read_and_removed_by_key(empty: Store) -> None:
    assert empty.add(POOL[:100]) == 100
    cut = START + timedelta(seconds=40)
    old = [pair for chunk in empty.older(cut, size=16) for pair in chunk]
    assert [p for _, p in old] == POOL[:40]
    assert empty.remove([key for key, _ in old]) == 40
    assert empty.count() == 60
    assert not list(empty.older(cut))
