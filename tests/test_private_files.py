"""Files that hold publications, journals or credentials are readable by their owner only,
whatever the umask; an existing one that others may read is reported."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from historic.store import Store
from padres.broker.sqlite_journal import SqliteJournal
from padres.model.messages import Publication
from padres.security.files import private_directory
from padres.testing.processes import BrokerProcess


@pytest.fixture(autouse=True)
def open_umask() -> Iterator[None]:
    """The most permissive umask a user may have: every file would be readable by all."""
    old = os.umask(0)
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _pub(n: int) -> Publication:
    return Publication(f"p{n}", {"class": "T", "n": n}, datetime(2026, 1, 1, tzinfo=UTC), "c@B")


def test_a_journal_and_the_files_beside_it_are_for_their_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    journal = SqliteJournal(str(path))
    journal.append("t", _pub(1), 0.0)
    journal.commit()
    beside = [path, *tmp_path.glob("journal.sqlite-*")]
    assert len(beside) == 3  # the database, its WAL and its shared memory
    assert {p.name: _mode(p) for p in beside} == {p.name: 0o600 for p in beside}
    journal.close()


def test_a_database_nodes_store_is_for_its_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "db1.sqlite"
    store = Store(f"sqlite:///{path}")
    store.close()
    assert [(p.name, _mode(p)) for p in tmp_path.iterdir()] == [("db1.sqlite", 0o600)]


def test_an_existing_file_others_may_read_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "journal.sqlite"
    path.touch(mode=0o644)
    with caplog.at_level(logging.WARNING, "padres.security"):
        SqliteJournal(str(path)).close()
    assert "may be read by other users of this machine (mode 644)" in caplog.text
    assert _mode(private_directory(tmp_path / "a" / "b")) == 0o700


def test_padres_broker_data_is_for_its_owner_only(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = BrokerProcess("B", options=["--data", str(data)])
    try:
        broker.start()
    finally:
        broker.stop()
    assert _mode(data) == 0o700
    assert {p.name: _mode(p) for p in data.iterdir()} == {p.name: 0o600 for p in data.iterdir()}
