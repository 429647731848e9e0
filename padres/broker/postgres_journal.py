"""The journal in PostgreSQL: what a broker keeps where a loss of its machine does not take it.

See ``padres.broker.journal`` for what a journal holds and promises, and
``padres.broker.sql_journal`` for how a SQL database keeps it; this opens it in PostgreSQL
(``padres broker --journal postgresql://...``, with the ``postgres`` extra installed).

Each broker keeps its tables in a schema of its own, ``padres_<broker id>``, so brokers may
share a database. A broker whose machine is lost is replaced by a new process, anywhere, with
the same id and the same database URL: it finds the journal as the old one committed it.

Two live processes must never write one journal: the broker holds a session-level advisory
lock on its schema as long as it runs, and a second process with the same id is refused. The
lock goes with the old process's database session: at once when the process dies and its
machine closes the connection; when the machine itself is lost, once the server notices, which
the session's TCP keepalives (``KEEPALIVE``) bound to about 20 seconds.

Statements go to the server one at a time and a commit waits for it (and for its
``synchronous_commit``), so a guaranteed publication costs a few round trips more than with
SQLite; the broker waits for them (see docs/guarantees.md).
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

import psycopg
from psycopg import sql

from padres.broker.journal import RETENTION
from padres.broker.sql_journal import SqlJournal
from padres.errors import JournalError

__all__ = ["KEEPALIVE", "PostgresJournal", "drop_journal", "schema_name"]

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS log (
    pos BIGINT PRIMARY KEY, tree TEXT NOT NULL, publisher TEXT NOT NULL, id TEXT NOT NULL,
    at DOUBLE PRECISION NOT NULL, body BYTEA NOT NULL, tx TEXT NOT NULL DEFAULT '');
CREATE UNIQUE INDEX IF NOT EXISTS log_publication ON log (publisher, id);
CREATE INDEX IF NOT EXISTS log_tree ON log (tree, pos);
CREATE INDEX IF NOT EXISTS log_tx ON log (tx) WHERE tx != '';
CREATE TABLE IF NOT EXISTS trees (
    n BIGINT GENERATED ALWAYS AS IDENTITY, publisher TEXT NOT NULL,
    advertisement TEXT NOT NULL, tree TEXT NOT NULL, PRIMARY KEY (publisher, advertisement));
CREATE INDEX IF NOT EXISTS trees_n ON trees (n);
CREATE TABLE IF NOT EXISTS durables (
    owner TEXT NOT NULL, name TEXT NOT NULL, subscription BYTEA NOT NULL,
    cursors BYTEA NOT NULL, next BIGINT NOT NULL, acked BIGINT NOT NULL,
    discarded BIGINT NOT NULL, created DOUBLE PRECISION NOT NULL,
    visibility TEXT NOT NULL DEFAULT 'on_commit', producers BYTEA NOT NULL DEFAULT '{}',
    PRIMARY KEY (owner, name));
ALTER TABLE durables ADD COLUMN IF NOT EXISTS priority BIGINT NOT NULL DEFAULT 0;
ALTER TABLE durables ADD COLUMN IF NOT EXISTS scope TEXT NOT NULL DEFAULT 'global';
CREATE TABLE IF NOT EXISTS runs (
    owner TEXT NOT NULL, name TEXT NOT NULL, first BIGINT NOT NULL, last BIGINT NOT NULL,
    size BIGINT NOT NULL, sizes BYTEA NOT NULL, bodies BYTEA NOT NULL, tags BYTEA,
    PRIMARY KEY (owner, name, first));
CREATE TABLE IF NOT EXISTS partials (
    owner TEXT NOT NULL, name TEXT NOT NULL, state BYTEA NOT NULL, PRIMARY KEY (owner, name));
CREATE TABLE IF NOT EXISTS schemas (class TEXT PRIMARY KEY, body BYTEA NOT NULL);
CREATE TABLE IF NOT EXISTS exceptions (
    entry BIGINT PRIMARY KEY, owner TEXT NOT NULL,
    subscription TEXT NOT NULL, ref TEXT NOT NULL, body BYTEA NOT NULL, error TEXT NOT NULL,
    attempts BIGINT NOT NULL, at DOUBLE PRECISION NOT NULL, size BIGINT NOT NULL,
    replay INTEGER NOT NULL DEFAULT 0);
CREATE UNIQUE INDEX IF NOT EXISTS exceptions_ref ON exceptions (owner, subscription, ref);
CREATE TABLE IF NOT EXISTS exception_queues (
    owner TEXT NOT NULL, subscription TEXT NOT NULL, dropped BIGINT NOT NULL,
    PRIMARY KEY (owner, subscription));
CREATE TABLE IF NOT EXISTS parts (
    owner TEXT NOT NULL, tx TEXT NOT NULL, body BYTEA NOT NULL, PRIMARY KEY (owner, tx));
CREATE TABLE IF NOT EXISTS numbers (name TEXT PRIMARY KEY, last BIGINT NOT NULL);
INSERT INTO numbers VALUES ('exceptions', 0) ON CONFLICT DO NOTHING;
"""
"""``numbers`` gives exception entries their numbers in the transaction that adds them, so that
a rollback takes a number back with its entry (a sequence would not)."""
KEEPALIVE: Final[dict[str, Any]] = {
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
}
"""TCP keepalives, both ways: the broker notices a lost server, and the server a lost broker
(and lets go of its lock), in about 5 + 2 x 3 seconds, plus the server's own checks."""
_SERVER_KEEPALIVE: Final = "; ".join(
    [
        *(f"SET tcp_{name} = {value}" for name, value in KEEPALIVE.items()),
        "SET tcp_user_timeout = 20000",
    ]
)
"""The same on the server's side of the session (its settings are named as libpq's, with
``tcp_``), and a bound on unacknowledged sends."""
_MAX_ID: Final = 50
"""Bytes of a broker id that fit a schema name (PostgreSQL keeps 63)."""


def schema_name(broker: str) -> str:
    """The schema that holds the journal of broker ``broker``."""
    return f"padres_{broker}"


@cache
def _dialect(statement: str) -> str:
    """``statement`` with psycopg's parameters for the journal's ``?`` (it holds no ``%``)."""
    return statement.replace("?", "%s")


class _Connection:
    """A psycopg connection that takes the journal's statements (``sql_journal.Database``);
    what fails is a ``JournalError``."""

    def __init__(self, connection: psycopg.Connection[Any], name: str) -> None:
        self.connection = connection
        self.name = name

    def execute(self, statement: str, parameters: Any = (), /) -> psycopg.Cursor[Any]:
        try:
            return self.connection.execute(_dialect(statement), parameters)
        except psycopg.Error as exc:
            raise JournalError(f"the journal {self.name}: {exc}") from exc

    def executemany(self, statement: str, rows: Any, /) -> None:
        try:
            with self.connection.cursor() as cursor:
                cursor.executemany(_dialect(statement), rows)
        except psycopg.Error as exc:
            raise JournalError(f"the journal {self.name}: {exc}") from exc

    def commit(self) -> None:
        if self.connection.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
            self.connection.rollback()  # a commit would roll back without a word
            raise JournalError(f"the journal {self.name}: a statement of the transaction failed")
        self.connection.commit()

    def rollback(self) -> None:
        self.connection.rollback()

    def close(self) -> None:
        self.connection.close()


class PostgresJournal(SqlJournal):
    """See the module docstring."""

    ERRORS = (psycopg.Error, JournalError)
    TREE_ORDER = "n"
    TEXT_BYTES = "octet_length({})"

    def __init__(self, url: str, broker: str, *, retention: int = RETENTION) -> None:
        """The journal of broker ``broker`` in the database at ``url`` (a libpq connection
        string or ``postgresql://`` URL); ``retention``: guaranteed publications kept."""
        if len(broker.encode()) > _MAX_ID:
            raise JournalError(
                f"a broker id of {len(broker.encode())} bytes does not fit a PostgreSQL schema "
                f"name; a broker with its journal in PostgreSQL takes an id of {_MAX_ID} at most"
            )
        schema = schema_name(broker)
        where = f"{_safe(url)} (schema {schema})"
        try:
            connection = psycopg.connect(
                url, connect_timeout=10, application_name=f"padres broker {broker}", **KEEPALIVE
            )
        except psycopg.Error as exc:
            raise JournalError(f"cannot open the journal at {where}: {exc}") from exc
        try:
            _claim(connection, schema, where)
            connection.execute(_SERVER_KEEPALIVE)
            name = sql.Identifier(schema)
            connection.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(name))
            connection.execute(sql.SQL("SET search_path TO {}").format(name))
            connection.execute(_SCHEMA)
            connection.commit()
            super().__init__(_Connection(connection, where), where, retention)
        except psycopg.Error as exc:
            connection.close()
            raise JournalError(f"cannot open the journal at {where}: {exc}") from exc
        except JournalError:
            connection.close()
            raise

    def _next_entry(self) -> int:
        (number,) = self._db.execute(
            "UPDATE numbers SET last = last + 1 WHERE name = 'exceptions' RETURNING last"
        ).fetchone()
        return int(number)


def drop_journal(url: str, broker: str) -> None:
    """Delete the journal of broker ``broker`` from the database at ``url``, if it has one."""
    with psycopg.connect(url, connect_timeout=10, autocommit=True) as connection:
        name = sql.Identifier(schema_name(broker))
        connection.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(name))


def _claim(connection: psycopg.Connection[Any], schema: str, where: str) -> None:
    """Take the schema's advisory lock for this session, or refuse: another process has it."""
    row = connection.execute(
        "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (schema,)
    ).fetchone()
    connection.commit()
    if row is None or not row[0]:
        raise JournalError(
            f"the journal at {where} is in use by another process of the same broker; "
            "two processes must not write one journal. If that process was lost with its "
            "machine, the database lets go of it within about 20 seconds: start again then"
        )


def _safe(url: str) -> str:
    """``url`` without its password, for messages."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<a connection string that does not parse>"
    info.pop("password", None)
    host, port, db = info.get("host", "localhost"), info.get("port", 5432), info.get("dbname", "")
    return f"postgresql://{host}:{port}/{db}"
