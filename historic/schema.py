"""The tables of a historic store (SQLAlchemy Core): one row per publication, its attributes in
typed columns, so every predicate of the language runs in SQL exactly, on the row itself.

``publications``: one row per stored publication, unique by (publisher, id), indexed by class
and time. ``time`` is the timestamp in microseconds since 1970-01-01 UTC (what queries filter
and order on); ``stamp`` is the timestamp as published (ISO 8601, with its zone) and
``attributes`` the attributes as published (a JSON object): with ``id`` and ``publisher``, what a
replay gives back, whole. Each attribute value is also in a *field column* of its type: ``i<n>``
(64-bit integers), ``f<n>`` (floats), ``s<n>`` (strings), ``b<n>`` (booleans). Field columns are
shared by the classes: ``fields`` says which column holds which attribute of which class with a
value of which kind (an attribute whose values have several types has several columns), and a
column is added when an attribute appears that no column holds yet (the class itself is the
``class`` column). ``rejected``: the publications the database refused, set aside whole (their
wire form, as JSON) with the reason, unique by (publisher, id). ``specs``: what the database
node stores, so that it takes its specs up again after a restart.

``LAYOUT`` names this layout; ``layout`` holds the name a store was made with.
"""

from __future__ import annotations

from typing import Final

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
)

__all__ = [
    "KINDS",
    "LAYOUT",
    "column_type",
    "fields",
    "layout",
    "metadata",
    "publications",
    "rejected",
    "specs",
]

LAYOUT: Final = "publications-2"
"""The layout of this module's tables (``publications-1``: a ``body`` column and one
``attributes`` row per attribute value)."""

KINDS: Final[dict[type, str]] = {int: "i", float: "f", str: "s", bool: "b"}
"""The kind of a field column, by the Python type of the values it holds."""

_COLUMN_TYPES: Final = {
    "sqlite": {"i": "INTEGER", "f": "REAL", "s": "TEXT", "b": "BOOLEAN"},
    "postgresql": {"i": "BIGINT", "f": "DOUBLE PRECISION", "s": "TEXT", "b": "BOOLEAN"},
}


def column_type(dialect: str, kind: str) -> str:
    """The SQL type of a field column of ``kind`` (one of ``KINDS``' values)."""
    return _COLUMN_TYPES[dialect][kind]


metadata = MetaData()

publications = Table(
    "publications",
    metadata,
    Column("pk", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("publisher", String(256), nullable=False),
    Column("id", String(256), nullable=False),
    Column("class", String(256), nullable=False),
    Column("time", BigInteger, nullable=False),
    Column("stamp", String(64), nullable=False),
    Column("attributes", Text, nullable=False),
    UniqueConstraint("publisher", "id", name="publications_identity"),
    Index("publications_by_class_time", "class", "time"),
)

fields = Table(
    "fields",
    metadata,
    Column("class", String(256), nullable=False),
    Column("name", String(256), nullable=False),
    Column("kind", String(1), nullable=False),
    Column("column", String(16), nullable=False),
    PrimaryKeyConstraint("class", "name", "kind", name="fields_key"),
)

rejected = Table(
    "rejected",
    metadata,
    Column("pk", Integer, primary_key=True, autoincrement=True),
    Column("id", String(256), nullable=False),
    Column("publisher", String(256), nullable=False),
    Column("reason", Text, nullable=False),
    Column("body", JSON, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("publisher", "id", name="rejected_identity"),
)

specs = Table(
    "specs",
    metadata,
    Column("spec", Text, primary_key=True),
)

layout = Table(
    "layout",
    metadata,
    Column("name", String(64), primary_key=True),
)
