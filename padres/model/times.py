"""Time values of the language: absolute ISO 8601 times and times relative to ``now``.

``'2026-11-01T08:00'`` (no zone means UTC), ``'2026-11-01T08:00+01:00'``, ``now``, ``now-1h``,
``now+30m``; units ``s``, ``m``, ``h``, ``d``, ``w``. A relative time is resolved when the
message is read, so a subscription carries absolute bounds from then on.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Final

from padres.errors import InvalidMessage
from padres.model.messages import TimeWindow
from rete.operators import Op

__all__ = ["TIME_OPERATORS", "format_time", "narrow", "parse_time", "window_predicates"]

_RELATIVE: Final = re.compile(r"now(?:\s*([+-])\s*(\d+(?:\.\d+)?)\s*([smhdw]))?")
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_TICK: Final = timedelta(microseconds=1)
TIME_OPERATORS: Final = (Op.GT, Op.GE, Op.LT, Op.LE)
_YEARS: Final = (1900, 9000)


def parse_time(text: str, now: datetime | None = None) -> datetime:
    """An aware datetime for ``text`` (see the module docstring); ``InvalidMessage`` if bad."""
    text = text.strip()
    relative = _RELATIVE.fullmatch(text)
    try:
        if relative:
            at = now or datetime.now(UTC)
            sign, amount, unit = relative.groups()
            if sign is not None:
                delta = timedelta(seconds=float(amount) * _UNITS[unit])
                at = at + delta if sign == "+" else at - delta
        else:
            at = datetime.fromisoformat(text)
            at = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
        at = at.astimezone(UTC)
    except ValueError:
        raise InvalidMessage(
            f"not a time: {text!r} (use '2026-11-01T08:00', now, now-1h, now+30m)"
        ) from None
    except OverflowError:
        at = datetime.min.replace(tzinfo=UTC)  # reported as out of range below
    if not _YEARS[0] <= at.year <= _YEARS[1]:
        raise InvalidMessage(f"time {text!r} is out of range (years {_YEARS[0]} to {_YEARS[1]})")
    return at


def format_time(at: datetime) -> str:
    return at.astimezone(UTC).isoformat()


def narrow(window: TimeWindow | None, op: Op, at: datetime) -> TimeWindow:
    """``window`` with the bound ``[time, op, at]`` added; timestamps are whole microseconds,
    so ``> t`` is ``>= t + 1 us`` and ``<= t`` is ``< t + 1 us``."""
    start = window.start if window else None
    end = window.end if window else None
    if op is Op.GT or op is Op.GE:
        low = at + _TICK if op is Op.GT else at
        start = low if start is None else max(start, low)
    elif op is Op.LT or op is Op.LE:
        high = at + _TICK if op is Op.LE else at
        end = high if end is None else min(end, high)
    else:
        allowed = ", ".join(str(o) for o in TIME_OPERATORS)
        raise InvalidMessage(f"the time can be compared with {allowed}, not {op}")
    return TimeWindow(start, end)


def window_predicates(window: TimeWindow | None) -> list[tuple[str, Op, str]]:
    """The window as time predicates, ``[time,>=,...]`` and ``[time,<,...]``."""
    if window is None:
        return []
    out = []
    if window.start is not None:
        out.append(("time", Op.GE, format_time(window.start)))
    if window.end is not None:
        out.append(("time", Op.LT, format_time(window.end)))
    return out
