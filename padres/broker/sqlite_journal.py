"""The journal in SQLite (WAL mode): what a broker keeps on disk across crashes and restarts.

See ``padres.broker.journal`` for what a journal holds and promises, and
``padres.broker.sql_journal`` for how a SQL database keeps it; this opens it in SQLite.

``sync`` is SQLite's ``synchronous`` setting: ``full`` (the default) survives a power failure
as well as a crash; ``normal`` survives a crash of the process (the operating system still has
the data) but may lose the last commits at a power failure; ``off`` leaves it to the operating
system. ``SqliteJournal()`` without a path keeps everything in memory; ``SqliteJournal("")`` in
a temporary file that goes when it is closed (its rollback journal in memory: the file does not
outlive the process, so nothing on disk needs to survive a crash), which bounds the memory a
long queue takes.
"""

from __future__ import annotations

import sqlite3
from enum import StrEnum
from typing import Final

from padres.broker.journal import RETENTION
from padres.broker.sql_journal import INSERT_RUN, Run, SqlJournal
from padres.errors import JournalError
from padres.model.protocol import Outcome
from padres.security.files import private_file

__all__ = ["SqliteJournal", "Sync"]

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS log (
    pos INTEGER PRIMARY KEY, tree TEXT NOT NULL, publisher TEXT NOT NULL, id TEXT NOT NULL,
    at REAL NOT NULL, body BLOB NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS log_publication ON log (publisher, id);
CREATE INDEX IF NOT EXISTS log_tree ON log (tree, pos);
CREATE TABLE IF NOT EXISTS trees (
    publisher TEXT NOT NULL, advertisement TEXT NOT NULL, tree TEXT NOT NULL,
    PRIMARY KEY (publisher, advertisement));
CREATE TABLE IF NOT EXISTS durables (
    owner TEXT NOT NULL, name TEXT NOT NULL, subscription BLOB NOT NULL, cursors BLOB NOT NULL,
    next INTEGER NOT NULL, acked INTEGER NOT NULL, discarded INTEGER NOT NULL,
    created REAL NOT NULL, PRIMARY KEY (owner, name));
CREATE TABLE IF NOT EXISTS runs (
    owner TEXT NOT NULL, name TEXT NOT NULL, first INTEGER NOT NULL, last INTEGER NOT NULL,
    size INTEGER NOT NULL, sizes BLOB NOT NULL, bodies BLOB NOT NULL, tags BLOB,
    PRIMARY KEY (owner, name, first)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS partials (
    owner TEXT NOT NULL, name TEXT NOT NULL, state BLOB NOT NULL, PRIMARY KEY (owner, name));
CREATE TABLE IF NOT EXISTS schemas (class TEXT PRIMARY KEY, body BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS exceptions (
    entry INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT NOT NULL, subscription TEXT NOT NULL,
    ref TEXT NOT NULL, body BLOB NOT NULL, error TEXT NOT NULL, attempts INTEGER NOT NULL,
    at REAL NOT NULL, size INTEGER NOT NULL, replay INTEGER NOT NULL DEFAULT 0);
CREATE UNIQUE INDEX IF NOT EXISTS exceptions_ref ON exceptions (owner, subscription, ref);
CREATE TABLE IF NOT EXISTS exception_queues (
    owner TEXT NOT NULL, subscription TEXT NOT NULL, dropped INTEGER NOT NULL,
    PRIMARY KEY (owner, subscription));
CREATE TABLE IF NOT EXISTS parts (
    owner TEXT NOT NULL, tx TEXT NOT NULL, body BLOB NOT NULL, PRIMARY KEY (owner, tx));
"""
_COLUMNS: Final = (
    ("log", "tx", "TEXT NOT NULL DEFAULT ''"),
    ("durables", "visibility", "TEXT NOT NULL DEFAULT 'on_commit'"),
    ("durables", "producers", "BLOB NOT NULL DEFAULT '{}'"),
    ("durables", "priority", "INTEGER NOT NULL DEFAULT 0"),
    ("durables", "scope", "TEXT NOT NULL DEFAULT 'global'"),
)
"""Columns added since the first schema: a journal written before gets them when opened."""


class Sync(StrEnum):
    """When SQLite waits for the disk (its ``synchronous`` setting); see the module docstring."""

    FULL = "full"
    NORMAL = "normal"
    OFF = "off"


class SqliteJournal(SqlJournal):
    """See the module docstring."""

    ERRORS = (sqlite3.Error,)
    TREE_ORDER = "rowid"
    TEXT_BYTES = "length(CAST({} AS BLOB))"

    def __init__(
        self, path: str = ":memory:", *, sync: Sync = Sync.FULL, retention: int = RETENTION
    ) -> None:
        """``retention``: guaranteed publications kept (``RETENTION``)."""
        try:
            if path not in ("", ":memory:"):
                private_file(path)
            db = sqlite3.connect(path, isolation_level="DEFERRED", check_same_thread=False)
            if path == "":  # see the module docstring
                db.execute("PRAGMA journal_mode=MEMORY")
            elif path != ":memory:":
                db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={sync.value.upper()}")
            db.executescript(_SCHEMA)
            for table, column, declaration in _COLUMNS:
                found = db.execute(f"PRAGMA table_info({table})").fetchall()
                if column not in {row[1] for row in found}:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
            db.execute("CREATE INDEX IF NOT EXISTS log_tx ON log (tx) WHERE tx != ''")
            _take_old_queue(db)
            super().__init__(db, path, retention)
        except (sqlite3.Error, OSError) as exc:
            raise JournalError(f"cannot open the journal {path}: {exc}") from exc
        self._sqlite = db

    def _begin(self) -> None:
        if not self._sqlite.in_transaction:
            self._sqlite.execute("BEGIN")


def _take_old_queue(db: sqlite3.Connection) -> None:
    """A journal written before runs holds its durable subscriptions' queues one row per
    delivery (table ``queue``): they become runs, and the table goes."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(queue)")}
    if not columns:
        return
    tags = "tx, outcome" if "tx" in columns else "'', ''"
    rows = db.execute(  # a row at a time: the queue may be larger than memory
        f"SELECT owner, name, seq, body, {tags} FROM queue ORDER BY owner, name, seq"
    )
    key: tuple[str, str] | None = None
    run = Run(0)
    for owner, name, seq, body, tx, outcome in rows:
        if (owner, name) != key or not run.takes(seq):
            if key is not None:
                db.execute(INSERT_RUN, run.row(*key))
            key, run = (owner, name), Run(seq)
        run.add(body, (tx, Outcome(outcome)) if tx else None)
    if key is not None:
        db.execute(INSERT_RUN, run.row(*key))
    db.execute("DROP TABLE queue")
    db.commit()
