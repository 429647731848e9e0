"""Errors raised by the archive.

::

    PadresError
    └── ArchiveError          the archive cannot do what was asked
        ├── JavaMissing       Spark needs a Java runtime and none was found
        ├── InputError        an input is missing, unreadable or holds a bad line
        └── CatalogError      the catalog database failed
"""

from __future__ import annotations

from padres.errors import PadresError

__all__ = ["ArchiveError", "CatalogError", "InputError", "JavaMissing"]


class ArchiveError(PadresError):
    """The archive cannot do what was asked."""


class JavaMissing(ArchiveError):
    """Spark runs on the JVM: no ``java`` was found on PATH or under JAVA_HOME."""


class InputError(ArchiveError):
    """An input is missing or unreadable, or one of its lines is not a publication."""


class CatalogError(ArchiveError):
    """The catalog database could not be read or written."""
