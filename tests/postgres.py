"""The PostgreSQL server the tests use when one is reachable, each test in a schema of its own."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Final

import pytest
import sqlalchemy

__all__ = [
    "LIBPQ",
    "POSTGRES",
    "database_url",
    "drop_schema",
    "postgres_or_skip",
    "reachable",
    "schema_url",
]

POSTGRES: Final = os.environ.get(
    "PADRES_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)

LIBPQ: Final = POSTGRES.replace("+psycopg", "")
"""The same server as a libpq URL (``padres broker --journal``)."""


@cache
def reachable() -> bool:
    """Whether the PostgreSQL server answers."""
    try:
        engine = sqlalchemy.create_engine(POSTGRES)
        with engine.connect():
            pass
        engine.dispose()
    except sqlalchemy.exc.OperationalError:
        return False
    return True


def postgres_or_skip() -> None:
    """Skip the test, saying why, when no PostgreSQL server answers."""
    if not reachable():
        pytest.skip(f"no PostgreSQL server reachable at {POSTGRES} (set PADRES_TEST_POSTGRES)")


def schema_url(schema: str) -> str | None:
    """A URL of the test database whose tables go to a new, empty ``schema``; None when no
    server answers."""
    try:
        engine = sqlalchemy.create_engine(POSTGRES)
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
            conn.execute(sqlalchemy.text(f"CREATE SCHEMA {schema}"))
        engine.dispose()
    except sqlalchemy.exc.OperationalError:
        return None
    return f"{POSTGRES}?options=-csearch_path%3D{schema}"


def drop_schema(schema: str) -> None:
    engine = sqlalchemy.create_engine(POSTGRES)
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
    engine.dispose()


def database_url(kind: str, schema: str, sqlite_file: Path) -> str:
    """The URL of a new, empty database of ``kind`` (``sqlite``, or ``postgresql`` in
    ``schema``); the test is skipped, saying why, when no PostgreSQL server answers."""
    if kind == "sqlite":
        return f"sqlite:///{sqlite_file}"
    postgres_or_skip()
    url = schema_url(schema)
    assert url is not None, f"the PostgreSQL server at {POSTGRES} stopped answering"
    return url
