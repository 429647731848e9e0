"""Errors raised by the archive.

::

    PadresError
    └── ArchiveError          the archive cannot do what was asked
        ├── JavaMissing       Spark needs a Java runtime and none was found
        ├── InputError        an input is missing, unreadable or holds a bad line
        ├── AlreadyLoaded     a load's inputs or publications are in the archive already
        ├── UnknownLoad       no load of that id is in the archive
        └── CatalogError      the catalog database failed
"""

from __future__ import annotations

from padres.errors import PadresError

__all__ = [
    "AlreadyLoaded",
    "ArchiveError",
    "CatalogError",
    "InputError",
    "JavaMissing",
    "UnknownLoad",
]


class ArchiveError(PadresError):
    """The archive cannot do what was asked."""


class JavaMissing(ArchiveError):
    """Spark runs on the JVM: no ``java`` was found on PATH or under JAVA_HOME."""


class InputError(ArchiveError):
    """An input is missing or unreadable, or one of its lines is not a publication."""


class AlreadyLoaded(ArchiveError):
    """A load was refused, nothing written: earlier ``loads`` hold the same input files, or
    ``publications`` of its publications (the same publisher and id; 0 when the inputs were
    recognised before they were parsed)."""

    def __init__(self, message: str, loads: tuple[str, ...], publications: int = 0) -> None:
        super().__init__(message)
        self.loads = loads
        self.publications = publications


class UnknownLoad(ArchiveError):
    """No load of that id is in the archive's catalog."""

    def __init__(self, message: str, load: str) -> None:
        super().__init__(message)
        self.load = load


class CatalogError(ArchiveError):
    """The catalog database could not be read or written."""
