"""historic: publications stored in a database and queried with the language's filters
(database nodes answer historic subscriptions), published from an application's own database
transaction (``historic.outbox``) or from its tables' changes (``historic.rules``), and consumed
into it (``historic.inbox``); a database node's internal subscriptions run SQL for what it is
sent (``historic.internal``)."""

from typing import TYPE_CHECKING, Final

from rete.lazy import lazy

if TYPE_CHECKING:  # what ``__getattr__`` loads, for type checkers: the same names and homes
    from historic.errors import InboxError as InboxError
    from historic.errors import OutboxError as OutboxError
    from historic.errors import RuleError as RuleError
    from historic.errors import StatementFailed as StatementFailed
    from historic.errors import StoreError as StoreError
    from historic.errors import StoreUnavailable as StoreUnavailable
    from historic.inbox import AtomicConsumer as AtomicConsumer
    from historic.inbox import TransactionalInbox as TransactionalInbox
    from historic.internal import InternalSubscription as InternalSubscription
    from historic.internal import parse_internal as parse_internal
    from historic.outbox import OutboxRelay as OutboxRelay
    from historic.outbox import TransactionalOutbox as TransactionalOutbox
    from historic.rules import Rule as Rule
    from historic.rules import Rules as Rules
    from historic.store import Store as Store

_HOMES: Final = {
    "InboxError": "historic.errors",
    "OutboxError": "historic.errors",
    "RuleError": "historic.errors",
    "StatementFailed": "historic.errors",
    "StoreError": "historic.errors",
    "StoreUnavailable": "historic.errors",
    "AtomicConsumer": "historic.inbox",
    "TransactionalInbox": "historic.inbox",
    "InternalSubscription": "historic.internal",
    "parse_internal": "historic.internal",
    "OutboxRelay": "historic.outbox",
    "TransactionalOutbox": "historic.outbox",
    "Rule": "historic.rules",
    "Rules": "historic.rules",
    "Store": "historic.store",
}
"""Where each public name lives: imported on first use, as SQLAlchemy takes a while to load,
and the command line, which imports ``historic.cli``, needs it only to run ``padres db``."""

__all__ = sorted(_HOMES)

__getattr__, __dir__ = lazy(globals(), _HOMES)
