"""What a benchmark's processes spend on a measured phase: CPU seconds, bytes sent and received.

CPU is read from ``/proc/<pid>/stat`` (user plus system time of every thread of the process,
in clock ticks, usually 10 ms); bytes sent are what the servers count themselves (a broker's
``sent_bytes`` in ``/health``, the messages' bytes before any compression; a nats-server's
``/connz``, the payloads' bytes); bytes received are what the kernel counts on the TCP
connections of some processes (``tcp_received``: everything on the wire above TCP, the
WebSocket's or NATS' framing and compression included), the same way on every side. A
``Meter`` takes them before and after the phase; ``per_delivery`` divides the difference by
the deliveries it made.
"""

from __future__ import annotations

import os
import re
import subprocess
import urllib.request
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

__all__ = [
    "Meter",
    "Usage",
    "cpu_seconds",
    "get_json",
    "per_delivery",
    "processes",
    "received",
    "tcp_received",
]

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


def tcp_received(pids: Collection[int]) -> int:
    """Bytes the open TCP connections of processes ``pids`` have received so far, as the
    kernel counts them (``ss``'s ``bytes_received``: what TCP carried, without its headers)."""
    listing = subprocess.run(
        ["ss", "--tcp", "--info", "--processes", "--no-header"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    total, owned = 0, False
    for line in listing.splitlines():
        if not line[:1].isspace():  # a socket's line; its details follow, indented
            owned = any(int(pid) in pids for pid in re.findall(r"pid=(\d+)", line))
        elif owned and (found := re.search(r"\bbytes_received:(\d+)", line)):
            total += int(found.group(1))
    return total


def received(roles: Mapping[str, Sequence[int]]) -> Callable[[], dict[str, int]]:
    """Reads the bytes each role's processes have received on TCP so far (``tcp_received``)."""

    def read() -> dict[str, int]:
        return {role: tcp_received(set(pids)) for role, pids in roles.items()}

    return read


def get_json(url: str) -> Any:
    """The JSON document at ``url`` (a monitoring endpoint on this machine)."""
    with urllib.request.urlopen(url, timeout=10) as response:
        return msgspec.json.decode(response.read())


class Usage(NamedTuple):
    """What a phase cost: CPU seconds by role, bytes sent by sender, bytes received by role."""

    cpu: dict[str, float]
    sent: dict[str, int]
    received: dict[str, int]


def _nothing() -> dict[str, int]:
    return {}


class Meter:
    """Takes ``cpu`` (CPU seconds by role), ``sent`` (bytes sent by sender) and ``received``
    (bytes received by role, if given) at ``start`` and at ``stop``, which returns the
    difference."""

    def __init__(
        self,
        cpu: Callable[[], dict[str, float]],
        sent: Callable[[], dict[str, int]],
        received: Callable[[], dict[str, int]] = _nothing,
    ) -> None:
        self._cpu = cpu
        self._sent = sent
        self._received = received
        self._before = Usage({}, {}, {})

    def start(self) -> None:
        self._before = Usage(self._cpu(), self._sent(), self._received())

    def stop(self) -> Usage:
        before = self._before
        cpu, sent, got = self._cpu(), self._sent(), self._received()
        return Usage(
            {k: v - before.cpu.get(k, 0.0) for k, v in cpu.items()},
            {k: v - before.sent.get(k, 0) for k, v in sent.items()},
            {k: v - before.received.get(k, 0) for k, v in got.items()},
        )


def per_delivery(usage: Usage, deliveries: int) -> dict[str, Any]:
    """``usage`` as it stands, and per delivery: CPU in microseconds, bytes sent (``total``:
    every sender's), bytes received by role (if metered)."""
    n = max(deliveries, 1)
    out: dict[str, Any] = {
        "cpu_seconds": usage.cpu,
        "bytes_sent": usage.sent,
        "cpu_us_per_delivery": {k: v * 1e6 / n for k, v in usage.cpu.items()},
        "bytes_per_delivery": {
            **{k: v / n for k, v in usage.sent.items()},
            "total": sum(usage.sent.values()) / n,
        },
    }
    if usage.received:
        out["bytes_received"] = usage.received
        out["bytes_received_per_delivery"] = {k: v / n for k, v in usage.received.items()}
    return out
