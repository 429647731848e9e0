"""Errors raised by the historic package, below ``padres.errors.StorageError``.

Hierarchy::

    StorageError                 (padres.errors) a database on disk failed
    ├── OutboxError              an application's outbox table (publishing from its database
    │   │                        transaction, ``historic.outbox``)
    │   └── RuleError            a rule that publishes a table's changes through the outbox
    │                            was refused or could not be installed (``historic.rules``)
    ├── InboxError               an application's inbox table (consuming into its database
    │                            transaction, ``historic.inbox``)
    ├── StatementFailed          an internal subscription's statement failed for a
    │                            publication (``historic.internal``): what its exception
    │                            queue says
    └── StoreError               a historic store's database failed or refused
        └── StoreUnavailable     ... unreachable or busy: the same write may work later
"""

from __future__ import annotations

from padres.errors import StorageError

__all__ = [
    "InboxError",
    "OutboxError",
    "RuleError",
    "StatementFailed",
    "StoreError",
    "StoreUnavailable",
]


class OutboxError(StorageError):
    """An application's outbox table failed (``historic.outbox``)."""


class RuleError(OutboxError):
    """A rule that publishes a table's changes was refused (an unknown table or column, a
    condition that does not parse, a name in use) or could not be installed or removed
    (``historic.rules``)."""


class InboxError(StorageError):
    """An application's inbox table failed, or a consumer cannot resume (``historic.inbox``)."""


class StatementFailed(StorageError):
    """An internal subscription's statement failed for a publication (a SQL error, a
    parameter the publication has no attribute for): rolled back, and the publication goes to
    the subscription's exception queue with this error (``historic.internal``)."""


class StoreError(StorageError):
    """A historic store's database failed or refused."""


class StoreUnavailable(StoreError):
    """The database is unreachable or busy (locked, restarting): the same write may work later."""
