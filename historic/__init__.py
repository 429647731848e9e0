"""historic: publications stored in a database and queried with the language's filters
(database nodes answer historic subscriptions), and published from an application's own database
transaction (``historic.outbox``)."""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from historic.errors import OutboxError, StoreError, StoreUnavailable
    from historic.outbox import OutboxRelay, TransactionalOutbox
    from historic.store import Store

_HOMES = {
    "OutboxError": "errors",
    "StoreError": "errors",
    "StoreUnavailable": "errors",
    "OutboxRelay": "outbox",
    "TransactionalOutbox": "outbox",
    "Store": "store",
}
"""Where each public name lives: imported on first use, as SQLAlchemy takes a while to load,
and the command line, which imports ``historic.cli``, needs it only to run ``padres db``."""

__all__ = [
    "OutboxError",
    "OutboxRelay",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "TransactionalOutbox",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'historic' has no attribute {name!r}")
    return getattr(import_module(f"historic.{home}"), name)
