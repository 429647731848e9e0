"""What a benchmark's processes spend on a measured phase: CPU seconds and bytes sent.

CPU is read from ``/proc/<pid>/stat`` (user plus system time of every thread of the process,
in clock ticks, usually 10 ms); bytes are what the servers count themselves (a broker's
``sent_bytes`` in ``/health``, a nats-server's ``/connz``). A ``Meter`` takes both before and
after the phase; ``per_delivery`` divides the difference by the deliveries it made.
"""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

__all__ = ["Meter", "Usage", "cpu_seconds", "get_json", "per_delivery", "processes"]

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds process ``pid`` has used so far, all its threads."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()  # the name, in brackets, may hold spaces
    return (int(fields[11]) + int(fields[12])) / _TICKS


def processes(roles: Mapping[str, Sequence[int]]) -> Callable[[], dict[str, float]]:
    """Reads the CPU seconds of each role so far: the sum over its processes."""

    def read() -> dict[str, float]:
        return {role: sum(cpu_seconds(pid) for pid in pids) for role, pids in roles.items()}

    return read


def get_json(url: str) -> Any:
    """The JSON document at ``url`` (a monitoring endpoint on this machine)."""
    with urllib.request.urlopen(url, timeout=10) as response:
        return msgspec.json.decode(response.read())


class Usage(NamedTuple):
    """What a phase cost: CPU seconds by role, bytes sent by sender."""

    cpu: dict[str, float]
    sent: dict[str, int]


class Meter:
    """Takes ``cpu`` (CPU seconds by role) and ``sent`` (bytes sent by sender) at ``start`` and
    at ``stop``, which returns the difference."""

    def __init__(
        self, cpu: Callable[[], dict[str, float]], sent: Callable[[], dict[str, int]]
    ) -> None:
        self._cpu = cpu
        self._sent = sent
        self._before = Usage({}, {})

    def start(self) -> None:
        self._before = Usage(self._cpu(), self._sent())

    def stop(self) -> Usage:
        cpu, sent = self._cpu(), self._sent()
        return Usage(
            {k: v - self._before.cpu.get(k, 0.0) for k, v in cpu.items()},
            {k: v - self._before.sent.get(k, 0) for k, v in sent.items()},
        )


def per_delivery(usage: Usage, deliveries: int) -> dict[str, Any]:
    """``usage`` as it stands, and per delivery: CPU in microseconds, bytes (``total``: every
    sender's)."""
    n = max(deliveries, 1)
    return {
        "cpu_seconds": usage.cpu,
        "bytes_sent": usage.sent,
        "cpu_us_per_delivery": {k: v * 1e6 / n for k, v in usage.cpu.items()},
        "bytes_per_delivery": {
            **{k: v / n for k, v in usage.sent.items()},
            "total": sum(usage.sent.values()) / n,
        },
    }
