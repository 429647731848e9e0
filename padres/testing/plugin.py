"""A pytest plugin for programs built on padres (``pytest_plugins = ["padres.testing.plugin"]``
in a ``conftest.py``): coroutine tests run on asyncio through AnyIO's plugin, with no marker,
and the ``cluster`` fixture starts brokers in the test's process."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator

import pytest

from padres.testing.cluster import Cluster, cluster

__all__ = [
    "Cluster",
    "anyio_backend",
    "cluster_fixture",
    "pytest_collection_modifyitems",
    "pytest_configure",
]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cluster(n): how many brokers the cluster fixture starts")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Coroutine tests are async tests: run them on the event loop of ``anyio_backend``."""
    for item in items:
        if inspect.iscoroutinefunction(getattr(item, "function", None)):
            item.add_marker(pytest.mark.anyio)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(name="cluster")
async def cluster_fixture(request: pytest.FixtureRequest) -> AsyncIterator[Cluster]:
    """Brokers B1..Bn in a chain in the test's process (``padres.testing.cluster``): three, or
    as many as the test's ``@pytest.mark.cluster(n)`` says."""
    marker = request.node.get_closest_marker("cluster")
    size = marker.args[0] if marker is not None and marker.args else 3
    async with cluster(size) as started:
        yield started
