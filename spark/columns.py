"""How a publication becomes a row of the archive, and back.

A file holds one class and one time period, so the class is in its path, not in its rows. Each
row has three header columns, ``_id``, ``_publisher`` and ``_time`` (UTC, microseconds), and one
typed column per attribute and value type: ``symbol__str``, ``close__float``,
``volume__int``, ``split__bool``. An attribute whose values have several types in one class
(integers and floats, say) has one column for each, and a row fills the one of its value; the
suffix keeps every column's type fixed however many loads add files to a class.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, Final

from padres.model.messages import Publication
from rete.operators import Value

__all__ = [
    "HEADER",
    "ID",
    "PUBLISHER",
    "SUFFIXES",
    "TIME",
    "attribute_of",
    "column_of",
    "publication",
    "type_of",
]

ID: Final = "_id"
PUBLISHER: Final = "_publisher"
TIME: Final = "_time"
HEADER: Final = (ID, PUBLISHER, TIME)

SUFFIXES: Final[dict[type, str]] = {bool: "bool", int: "int", float: "float", str: "str"}
"""The column suffix of each value type (``bool`` before ``int``: a type of its own here)."""
_TYPES: Final = {suffix: t for t, suffix in SUFFIXES.items()}


def column_of(attribute: str, value: Value) -> str:
    """The column that holds ``value`` of ``attribute``."""
    return _column(attribute, SUFFIXES[type(value)])


@lru_cache(maxsize=1 << 12)
def _column(attribute: str, suffix: str) -> str:
    return f"{attribute}__{suffix}"


def attribute_of(column: str) -> str:
    """The attribute a typed column holds."""
    return column.rpartition("__")[0]


def type_of(column: str) -> type:
    """The Python type of a typed column's values."""
    return _TYPES[column.rpartition("__")[2]]


def publication(class_name: str, row: Mapping[str, Any]) -> Publication:
    """The publication a row of a file of ``class_name`` holds (nulls are absent attributes)."""
    attrs: dict[str, Value] = {"class": class_name}
    for column, value in row.items():
        if value is not None and column not in HEADER:
            attrs[attribute_of(column)] = value
    at: datetime = row[TIME]
    return Publication(
        row[ID],
        attrs,
        at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC),
        row[PUBLISHER],
    )
