"""Progress of a long job, for the operator watching it: every few seconds, while a count
grows, one line with the count and its rate (``parsed 1,200,000 rows (85,000 per s)``), given
to the same ``progress`` callback as the job's other lines, which the command line prints on
standard error (and ``--quiet`` drops)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Final

__all__ = ["EVERY", "Ticker", "per_second", "size"]

EVERY: Final = 5.0
"""Seconds between two lines of a ticker."""


def per_second(count: float, seconds: float) -> str:
    """``count`` over ``seconds`` as an operator reads it: ``85,000 per s``."""
    return f"{count / seconds if seconds > 0 else 0.0:,.0f} per s"


def size(count: float) -> str:
    """A number of bytes, ``1.5 GiB``."""
    units = ("bytes", "KiB", "MiB", "GiB")
    n = 0
    while count >= 1024 and n < len(units) - 1:
        count /= 1024
        n += 1
    return f"{count:,.0f} bytes" if n == 0 else f"{count:,.1f} {units[n]}"


class Ticker:
    """While entered, calls ``progress(line(count(), seconds))`` every ``every`` seconds in
    which the count has grown (``seconds`` since it was entered). Nothing is shown of a step
    quicker than ``every``; the caller says how it ended."""

    def __init__(
        self,
        progress: Callable[[str], None],
        line: Callable[[int, float], str],
        count: Callable[[], int],
        every: float = EVERY,
    ) -> None:
        self._progress = progress
        self._line = line
        self._count = count
        self._every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)
        self._started = 0.0

    def _run(self) -> None:
        shown = 0
        while not self._stop.wait(self._every):
            count = self._count()
            if count > shown:
                self._progress(self._line(count, time.perf_counter() - self._started))
                shown = count

    def __enter__(self) -> Ticker:
        self._started = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
