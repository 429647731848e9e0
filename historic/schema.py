"""The tables of a historic store (SQLAlchemy Core): publications, and their attributes one
row each, typed, so every predicate of the language runs in SQL exactly.

``publications``: one row per stored publication, unique by (publisher, id), with its class and
time indexed, and the whole publication as JSON (what a replay sends back). ``attributes``: one
row per attribute value, in the column of its type: ``i`` (64-bit integers), ``f`` (floats),
``s`` (strings), ``b`` (booleans); ``kind`` says which. ``rejected``: the publications the
database refused, set aside whole (as JSON) with the reason, unique by (publisher, id).
``specs``: what the database node stores, so that it takes its specs up again after a restart.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

__all__ = ["attributes", "metadata", "publications", "rejected", "specs"]

metadata = MetaData()

publications = Table(
    "publications",
    metadata,
    Column("pk", Integer, primary_key=True, autoincrement=True),
    Column("id", String(256), nullable=False),
    Column("publisher", String(256), nullable=False),
    Column("class", String(256), nullable=False),
    Column("time", DateTime(timezone=True), nullable=False),
    Column("body", JSON, nullable=False),
    UniqueConstraint("publisher", "id", name="publication_identity"),
    Index("publications_class_time", "class", "time"),
    Index("publications_time", "time"),
)

attributes = Table(
    "attributes",
    metadata,
    Column("pub", Integer, ForeignKey("publications.pk", ondelete="CASCADE"), nullable=False),
    Column("name", String(256), nullable=False),
    Column("kind", String(1), nullable=False),
    Column("i", BigInteger),
    Column("f", Float(precision=53)),
    Column("s", Text),
    Column("b", Boolean),
    Index("attributes_pub_name", "pub", "name"),
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
