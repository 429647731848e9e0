"""Errors raised by the padres package.

Hierarchy::

    PadresError                  base of every error raised on purpose here
    ├── InvalidMessage           a message breaks a rule of the language (also a ValueError)
    │   ├── ParseError           ... read from PADRES text (carries line, column, excerpt)
    │   └── DecodeError          ... read from the JSON wire format (carries the field path)
    ├── DuplicateId              an id is already in use (also a KeyError)
    ├── UnknownId                no such id (also a KeyError)
    ├── ConnectionLost           the connection to a broker is closed
    │   └── ConnectError         ... or was never made: the broker could not be reached
    ├── RequestFailed            a broker refused a request (carries the request's id)
    ├── StorageError             a database on disk failed (the driver's error is the cause)
    │   ├── JournalError         ... a broker's journal
    │   └── StoreError           ... a historic store
    │       └── StoreUnavailable ... unreachable or busy: the same write may work later
    └── CommandError             the command line was asked for something it cannot do
"""

from __future__ import annotations

__all__ = [
    "CommandError",
    "ConnectError",
    "ConnectionLost",
    "DecodeError",
    "DuplicateId",
    "InvalidMessage",
    "JournalError",
    "PadresError",
    "ParseError",
    "RequestFailed",
    "StorageError",
    "StoreError",
    "StoreUnavailable",
    "UnknownId",
]


class PadresError(Exception):
    """Base class of all errors raised by padres."""


class InvalidMessage(PadresError, ValueError):
    """A message does not follow the rules of the language (types, mandatory class, ...)."""


class ParseError(InvalidMessage):
    """PADRES text could not be parsed.

    ``line`` and ``column`` are 1-based; ``source`` is the offending line of text.
    """

    def __init__(
        self, reason: str, *, source: str, column: int, line: int = 1, origin: str = ""
    ) -> None:
        self.reason = reason
        self.source = source
        self.column = column
        self.line = line
        self.origin = origin
        super().__init__(self._render())

    def _render(self) -> str:
        where = f"{self.origin}:" if self.origin else ""
        excerpt = self.source.rstrip("\n")
        caret = " " * (self.column - 1) + "^"
        return (
            f"{where}line {self.line}, column {self.column}: {self.reason}\n  {excerpt}\n  {caret}"
        )

    def at_line(
        self, line: int, *, offset: int = 0, source: str = "", origin: str = ""
    ) -> ParseError:
        """The same error placed within a larger text (a file, a command line)."""
        return ParseError(
            self.reason,
            source=source or self.source,
            column=self.column + offset,
            line=line,
            origin=origin,
        )


class DecodeError(InvalidMessage):
    """A JSON wire message is malformed; ``path`` names the offending field (``$.attributes``)."""

    def __init__(self, reason: str, *, path: str = "$") -> None:
        self.reason = reason
        self.path = path
        super().__init__(f"{path}: {reason}")


class DuplicateId(PadresError, KeyError):
    """An id is already in use (adding a subscription twice, say)."""

    def __init__(self, ident: str, what: str = "subscription") -> None:
        self.id = ident
        self.what = what
        super().__init__(f"{what} {ident!r} already exists")

    def __str__(self) -> str:
        return str(self.args[0])


class UnknownId(PadresError, KeyError):
    """No such id (removing a subscription that is not there, say)."""

    def __init__(self, ident: str, what: str = "subscription") -> None:
        self.id = ident
        self.what = what
        super().__init__(f"no {what} {ident!r}")

    def __str__(self) -> str:
        return str(self.args[0])


class ConnectionLost(PadresError):
    """The connection to the broker is closed."""


class ConnectError(ConnectionLost):
    """The broker could not be reached (refused, unresolvable, timed out, not a broker)."""


class RequestFailed(PadresError):
    """The broker refused a request; ``ref`` is the request's id."""

    def __init__(self, text: str, ref: str = "") -> None:
        self.text = text
        self.ref = ref
        super().__init__(text)


class StorageError(PadresError):
    """A database on disk failed or refused (the driver's error is the cause)."""


class JournalError(StorageError):
    """A broker's journal failed."""


class StoreError(StorageError):
    """A historic store's database failed or refused."""


class StoreUnavailable(StoreError):
    """The database is unreachable or busy (locked, restarting): the same write may work later."""


class CommandError(PadresError):
    """A problem with what the user asked for (a missing file, say), reported without a trace."""
