"""Errors raised by the historic package, below ``padres.errors.StorageError``.

Hierarchy::

    StorageError                 (padres.errors) a database on disk failed
    ├── OutboxError              an application's outbox table (publishing from its database
    │                            transaction, ``historic.outbox``)
    ├── InboxError               an application's inbox table (consuming into its database
    │                            transaction, ``historic.inbox``)
    └── StoreError               a historic store's database failed or refused
        └── StoreUnavailable     ... unreachable or busy: the same write may work later
"""

from __future__ import annotations

from padres.errors import StorageError

__all__ = ["InboxError", "OutboxError", "StoreError", "StoreUnavailable"]


class OutboxError(StorageError):
    """An application's outbox table failed (``historic.outbox``)."""


class InboxError(StorageError):
    """An application's inbox table failed, or a consumer cannot resume (``historic.inbox``)."""


class StoreError(StorageError):
    """A historic store's database failed or refused."""


class StoreUnavailable(StoreError):
    """The database is unreachable or busy (locked, restarting): the same write may work later."""
