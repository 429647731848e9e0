"""historic: publications stored in a database and queried with the language's filters
(database nodes answer historic subscriptions), and published from an application's own database
transaction (``historic.outbox``)."""

from historic.errors import OutboxError, StoreError, StoreUnavailable
from historic.outbox import OutboxRelay, TransactionalOutbox
from historic.store import Store

__all__ = [
    "OutboxError",
    "OutboxRelay",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "TransactionalOutbox",
]
