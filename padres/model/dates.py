"""Dates and times as attribute values: the ``date``, ``datetime`` and ``timestamp`` types.

The language has four kinds of values (booleans, integers, floats, strings), and so do the
matchers; dates and times are written as values of those kinds, in a form whose order is the
order of time:

- a ``date`` is a string ``'YYYY-MM-DD'`` (``'2026-12-01'``);
- a ``datetime`` is a string ``'YYYY-MM-DDTHH:MM:SSZ'``, in UTC, to the second
  (``'2026-12-01T08:30:00Z'``);
- a ``timestamp`` is a number: seconds since 1970-01-01T00:00:00Z (``1795941000``, or a float).

Two dates (or two datetimes) in these forms compare as strings exactly as they compare in time,
so the string operators (``str-lt`` ... ``str-ge``, ``eq``, ``neq``) order them, ``str-prefix``
picks a year or a month (``'2026-12'``), and the covering and overlap relations of the router
hold unchanged; timestamps compare as numbers. ``before`` and ``after`` are the language's
spellings of "earlier than" and "later than" for all three (``padres.language.parser``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, date, datetime
from typing import Final

__all__ = [
    "DATETIME_FORM",
    "DATE_FORM",
    "date_value",
    "is_date",
    "is_datetime",
    "parse_value",
    "timestamp_value",
]

DATE_FORM: Final = "'YYYY-MM-DD'"
DATETIME_FORM: Final = "'YYYY-MM-DDTHH:MM:SSZ' (UTC)"

_DATE: Final = re.compile(r"\d{4}-\d{2}-\d{2}")
_DATETIME: Final = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")


def is_date(value: object) -> bool:
    """Whether ``value`` is a date in the canonical form, ``'YYYY-MM-DD'``, and a real day."""
    return _canonical(value, _DATE, date.fromisoformat)


def is_datetime(value: object) -> bool:
    """Whether ``value`` is a datetime in the canonical form, ``'YYYY-MM-DDTHH:MM:SSZ'``."""
    return _canonical(value, _DATETIME, datetime.fromisoformat)


def _canonical(value: object, form: re.Pattern[str], parse: Callable[[str], object]) -> bool:
    """Whether ``value`` is a string in ``form`` that ``parse`` takes (a real day and time)."""
    if type(value) is not str or not form.fullmatch(value):
        return False
    try:
        parse(value)
    except ValueError:
        return False
    return True


def date_value(at: date | datetime) -> str:
    """The attribute value of a date (``'YYYY-MM-DD'``) or of a datetime (in UTC, to the
    second: ``'YYYY-MM-DDTHH:MM:SSZ'``; a naive datetime is taken as UTC)."""
    if isinstance(at, datetime):
        utc = at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
        return f"{utc.replace(microsecond=0, tzinfo=None).isoformat()}Z"
    return at.isoformat()


def timestamp_value(at: datetime) -> float:
    """The attribute value of a ``timestamp``: seconds since the epoch (a naive datetime is
    taken as UTC)."""
    return (at.replace(tzinfo=UTC) if at.tzinfo is None else at).timestamp()


def parse_value(value: str) -> date | datetime:
    """The date or datetime a canonical value stands for; ``ValueError`` for anything else."""
    if is_date(value):
        return date.fromisoformat(value)
    if is_datetime(value):
        return datetime.fromisoformat(value)
    raise ValueError(f"{value!r} is neither a date {DATE_FORM} nor a datetime {DATETIME_FORM}")
