"""Fixtures shared by the test modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from padres.testing.processes import BrokerProcess

pytest_plugins = ["padres.testing.plugin"]


@pytest.fixture
def brokers() -> Iterator[dict[str, BrokerProcess]]:
    """Broker processes a test starts (by name); every one is stopped afterwards."""
    started: dict[str, BrokerProcess] = {}
    yield started
    for proc in started.values():
        proc.stop()
