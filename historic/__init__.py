"""historic: publications stored in a database and queried with the language's filters."""

from historic.store import Store

__all__ = ["Store"]
