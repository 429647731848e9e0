"""Errors raised by the padres package.

Hierarchy::

    PadresError                  base of every error raised on purpose here
    ├── InvalidMessage           a message breaks a rule of the language (also a ValueError)
    │   ├── ParseError           ... read from PADRES text (carries line, column, excerpt)
    │   └── DecodeError          ... read from the JSON wire format (carries the field path)
    ├── DuplicateId              an id is already in use (also a KeyError)
    └── UnknownId                no such id (also a KeyError)
"""

from __future__ import annotations

__all__ = [
    "DecodeError",
    "DuplicateId",
    "InvalidMessage",
    "PadresError",
    "ParseError",
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
