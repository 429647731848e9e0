"""historic: publications stored in a database and queried with the language's filters
(database nodes answer historic subscriptions), published from an application's own database
transaction (``historic.outbox``) or from its tables' changes (``historic.rules``), and consumed
into it (``historic.inbox``); a database node's internal subscriptions run SQL for what it is
sent (``historic.internal``)."""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from historic.errors import (
        InboxError,
        OutboxError,
        RuleError,
        StatementFailed,
        StoreError,
        StoreUnavailable,
    )
    from historic.inbox import AtomicConsumer, TransactionalInbox
    from historic.internal import InternalSubscription, parse_internal
    from historic.outbox import OutboxRelay, TransactionalOutbox
    from historic.rules import Rule, Rules
    from historic.store import Store

_HOMES = {
    "AtomicConsumer": "inbox",
    "InboxError": "errors",
    "TransactionalInbox": "inbox",
    "OutboxError": "errors",
    "Rule": "rules",
    "RuleError": "errors",
    "Rules": "rules",
    "InternalSubscription": "internal",
    "StatementFailed": "errors",
    "parse_internal": "internal",
    "StoreError": "errors",
    "StoreUnavailable": "errors",
    "OutboxRelay": "outbox",
    "TransactionalOutbox": "outbox",
    "Store": "store",
}
"""Where each public name lives: imported on first use, as SQLAlchemy takes a while to load,
and the command line, which imports ``historic.cli``, needs it only to run ``padres db``."""

__all__ = [
    "AtomicConsumer",
    "InboxError",
    "InternalSubscription",
    "OutboxError",
    "OutboxRelay",
    "Rule",
    "RuleError",
    "Rules",
    "StatementFailed",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "TransactionalInbox",
    "TransactionalOutbox",
    "parse_internal",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'historic' has no attribute {name!r}")
    return getattr(import_module(f"historic.{home}"), name)
