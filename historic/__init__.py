"""historic: publications stored in a database and queried with the language's filters, and
published from an application's own database transaction (``transactional``)."""

from historic.store import Store
from historic.transactional import OutboxRelay, TransactionalOutbox

__all__ = ["OutboxRelay", "Store", "TransactionalOutbox"]
