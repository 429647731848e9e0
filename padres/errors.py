"""Errors raised by the padres package.

Hierarchy::

    PadresError                  base of every error raised on purpose here
    ├── InvalidMessage           a message breaks a rule of the language (also a ValueError)
    │   ├── ParseError           ... read from PADRES text (carries line, column, excerpt)
    │   ├── DecodeError          ... read from the JSON wire format (carries the field path)
    │   └── SchemaViolation      ... breaks the schema of its class (carries class, attribute,
    │                                expected and found type)
    ├── DuplicateId              an id is already in use (also a KeyError)
    ├── UnknownId                no such id (also a KeyError)
    ├── ConnectionLost           the connection to a broker is closed
    │   └── ConnectError         ... or was never made: the broker could not be reached
    ├── SlowConsumer             a subscription's queue in the client was full: deliveries were
    │                            dropped (carries the subscription, what is pending, what was
    │                            dropped)
    ├── TLSError                 a certificate, key or CA file cannot be used
    ├── SchemaConflict           a class's schema declared again, not as a widening of the one
    │                            in force (carries the class and that one's version)
    ├── SchemaLimit              a schema declaration beyond a broker's limits: too many
    │                            schemas in the overlay, or attributes in one
    ├── RequestFailed            a broker refused a request (carries the request's id)
    │   └── TransactionError     ... about a transaction (carries its id): unknown, say
    │       ├── TransactionAborted   ... it was aborted (carries why), so it cannot commit
    │       │   └── TransactionLimit ... by a limit: too many open, or publications in one
    │       └── TransactionClosed    ... it is committed (or never begun, or a part that is
    │                                    done): it takes no more; or it may not join another
    ├── AuthenticationError      a user, password, token or name was not accepted
    ├── AccountsError            an accounts file cannot be read, or an edit of it is wrong
    ├── StorageError             a database on disk failed (the driver's error is the cause)
    │   └── JournalError         ... a broker's journal (``historic.errors`` adds the
    │                                historic store's and the outbox's)
    ├── HostsError               test hosts could not be made or changed (an ``ip`` or
    │                            ``tc`` command failed; ``padres.testing.hosts``)
    └── CommandError             the command line was asked for something it cannot do
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "EXTRAS",
    "AccountsError",
    "AuthenticationError",
    "CommandError",
    "ConnectError",
    "ConnectionLost",
    "DecodeError",
    "DuplicateId",
    "HostsError",
    "InvalidMessage",
    "JournalError",
    "PadresError",
    "ParseError",
    "RequestFailed",
    "SchemaConflict",
    "SchemaLimit",
    "SchemaViolation",
    "SlowConsumer",
    "StorageError",
    "TLSError",
    "TransactionAborted",
    "TransactionClosed",
    "TransactionError",
    "TransactionLimit",
    "UnknownId",
    "missing",
]


class PadresError(Exception):
    """Base class of all errors raised by padres."""


class InvalidMessage(PadresError, ValueError):
    """A message does not follow the rules of the language (types, mandatory class, ...)."""


_EXCERPT = 120
"""Characters of the offending line a ``ParseError`` shows, around its column."""


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
        column = self.column
        if len(excerpt) > _EXCERPT:  # a window of the line around the column, not all of it
            start = max(0, min(column - 1 - _EXCERPT // 2, len(excerpt) - _EXCERPT))
            excerpt = excerpt[start : start + _EXCERPT]
            column -= start
        caret = " " * (column - 1) + "^"
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


class SchemaViolation(InvalidMessage):
    """A message breaks the schema of its class: an unknown attribute, a value or a comparison
    of the wrong type, a required attribute missing. ``expected`` and ``found`` name the types
    (empty for an unknown or missing attribute)."""

    def __init__(
        self, reason: str, *, class_name: str, attribute: str, expected: str = "", found: str = ""
    ) -> None:
        self.class_name = class_name
        self.attribute = attribute
        self.expected = expected
        self.found = found
        super().__init__(reason)


class SchemaConflict(PadresError):
    """A class's schema was declared again in a way that does not widen the one in force."""

    def __init__(self, reason: str, *, class_name: str, version: int) -> None:
        self.class_name = class_name
        self.version = version
        super().__init__(reason)


class SchemaLimit(PadresError):
    """A schema declaration goes beyond a broker's limits (``padres.broker.quotas.Quotas``):
    one schema more than the overlay may hold, or more attributes than one may have."""


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


class SlowConsumer(PadresError):
    """Deliveries to a subscription came faster than its application took them: its queue in
    the client was full, and what came then was dropped (``padres.client.pending``). Raised
    once per episode of losses, where the first was dropped: ``pending`` and ``pending_bytes``
    say what is queued now, ``dropped`` and ``dropped_bytes`` what the subscription has lost in
    all so far."""

    def __init__(
        self,
        subscription: str,
        *,
        pending: int,
        pending_bytes: int,
        dropped: int,
        dropped_bytes: int,
    ) -> None:
        self.subscription = subscription
        self.pending = pending
        self.pending_bytes = pending_bytes
        self.dropped = dropped
        self.dropped_bytes = dropped_bytes
        super().__init__(
            f"subscription {subscription!r} is read too slowly: {dropped:,} deliveries "
            f"({dropped_bytes:,} bytes) dropped so far; {pending:,} deliveries "
            f"({pending_bytes:,} bytes) pending"
        )


class TLSError(PadresError):
    """A certificate, private key or CA file is missing or cannot be used."""


class RequestFailed(PadresError):
    """The broker refused a request; ``ref`` is the request's id."""

    def __init__(self, text: str, ref: str = "") -> None:
        self.text = text
        self.ref = ref
        super().__init__(text)


class TransactionError(RequestFailed):
    """A transaction could not begin, go on or end; ``tx`` is the client's id for it."""

    def __init__(self, text: str, tx: str) -> None:
        self.tx = tx
        super().__init__(text, tx)


class TransactionAborted(TransactionError):
    """The transaction was aborted (by its client, or by its broker: ``reason`` says why)."""

    def __init__(self, text: str, tx: str, reason: str = "") -> None:
        self.reason = reason
        super().__init__(text, tx)


class TransactionClosed(TransactionError):
    """The transaction is committed (nothing more can be published in it, nor can it be
    aborted), or was never begun, or is a part of another that is done (it ends as that one
    does); or the transaction it would join refused it (that one is over, or its commit has
    started). Using one that was aborted raises ``TransactionAborted``."""


class TransactionLimit(TransactionAborted):
    """A limit refused the transaction: open transactions per client, or publications (or
    bytes) in one."""


class AuthenticationError(PadresError):
    """Who is connecting could not be verified, or may not use the name it asked for."""


class AccountsError(PadresError):
    """An accounts file is missing, malformed or names a bad grant, or an edit of it is wrong
    (an account that does not exist, say)."""


class StorageError(PadresError):
    """A database on disk failed or refused (the driver's error is the cause)."""


class JournalError(StorageError):
    """A broker's journal failed."""


EXTRAS: Final = {
    "fastapi": "web",
    "starlette": "web",
    "prometheus_client": "web",
    "sqlalchemy": "history",
    "psycopg": "postgres",
    "pyspark": "archive",
    "pyarrow": "archive",
    "nats": "dev",
}
"""The extra of the ``padres`` distribution that brings each optional package."""


def missing(exc: ModuleNotFoundError) -> str:
    """What to install for a part whose optional packages are missing, in one line."""
    package = (exc.name or "").split(".")[0]
    extra = EXTRAS.get(package)
    hint = f"pip install 'padres[{extra}]'" if extra else "install padres with its extras"
    return f"it needs {package or 'a package'}, which is not installed ({hint})"


class HostsError(PadresError):
    """Test hosts could not be made or changed: an ``ip`` or ``tc`` command failed."""


class CommandError(PadresError):
    """A problem with what the user asked for (a missing file, say), reported without a trace."""
