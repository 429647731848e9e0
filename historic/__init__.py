"""historic: publications stored in a database and queried with the language's filters."""

from historic.store import Store, StoreError

__all__ = ["Store", "StoreError"]
