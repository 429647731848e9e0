"""Benchmark commands: each prints its figures and a same-run ratio against a baseline."""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

__all__ = ["machine", "median_seconds"]


def median_seconds(work: Callable[[], object], repeat: int) -> float:
    """Median wall time of ``repeat`` runs of ``work`` (the machines are shared and noisy)."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def machine() -> dict[str, Any]:
    import os

    return {
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
    }
