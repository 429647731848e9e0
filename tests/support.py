"""What the tests with real processes share: waiting for a condition, a broker's status."""

from __future__ import annotations

import base64
import contextlib
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import orjson
import pytest

from padres.client.connection import Delivery
from padres.model.protocol import Notify, http_url
from padres.runtime.backoff import Backoff
from padres.testing.processes import BrokerProcess

__all__ = ["Numbers", "eventually", "health", "wait_linked"]


async def eventually(check: Callable[[], bool | Awaitable[bool]], timeout: float = 15.0) -> None:
    """Wait until ``check`` holds; ``AssertionError`` after ``timeout`` seconds.

    The checks come quickly at first and then a few times a second, which stays under a
    broker's limit on queries when ``check`` asks one."""
    deadline = time.monotonic() + timeout
    backoff = Backoff(first=0.02, most=0.25)
    while True:
        result = check()
        if result if isinstance(result, bool) else await result:
            return
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await backoff.wait()


def health(url: str, admin: tuple[str, str] | None = None) -> dict[str, Any]:
    """``/health`` of the broker at ``url`` (its ``ws://`` address); of a broker with accounts,
    the same figures from ``/api/v1/broker`` as the administrator ``admin`` (user, password)."""
    base = http_url(url)
    if admin is None:
        with urllib.request.urlopen(f"{base}/health") as r:
            return orjson.loads(r.read())  # type: ignore[no-any-return]
    request = urllib.request.Request(f"{base}/api/v1/broker")
    login = base64.b64encode(":".join(admin).encode()).decode()
    request.add_header("Authorization", f"Basic {login}")
    with urllib.request.urlopen(request) as r:
        return orjson.loads(r.read())["status"]  # type: ignore[no-any-return]


def wait_linked(
    links: Iterable[Sequence[str]], urls: Mapping[str, str], timeout: float = 15.0
) -> None:
    """Wait until the brokers at ``urls`` (by name) have each link of ``links`` up ("AB", or
    ("A", "B"): A and B are neighbours). A broker listens before its links are up: the
    neighbour it dials may have started after it, and it dials again after a backoff. Until
    then a publication is not routed across the missing link."""
    wanted: dict[str, set[str]] = {name: set() for name in urls}
    for link in links:
        wanted[link[0]].add(link[1])
        wanted[link[1]].add(link[0])
    deadline = time.monotonic() + timeout
    for name, url in urls.items():
        while set(health(url)["neighbours"]) != wanted[name]:
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} did not link to {sorted(wanted[name])} in time")
            time.sleep(0.05)


class Numbers:
    """A subscriber's callback keeping the ``n`` of each publication it gets, in order."""

    def __init__(self) -> None:
        self.got: list[int] = []

    def __call__(self, delivery: Delivery) -> None:
        assert isinstance(delivery, Notify)
        self.got.append(int(delivery.publication.attributes["n"]))


@contextlib.contextmanager
def journalled_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker ``B`` with its journal on disk, pinging its clients every second."""
    data = tmp_path_factory.mktemp("broker")
    proc = BrokerProcess("B", options=["--heartbeat", "1", "--data", str(data)])
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
