"""Internal subscriptions of a database node: a statement run in its database for each
publication it is sent, as PostgreSQL-PS runs a function (``CREATE SUBSCRIPTION ... EXECUTE``).

An internal subscription has a name, a filter, a priority, a scope and a SQL statement (or a
stored function) whose named parameters are the publication's attributes (``:price``) and its
timestamp (``:time``)::

    orders ON [class,eq,'Order'],[price,>,0] PRIORITY 10 EXECUTE
        INSERT INTO orders (item, price) VALUES (:item, :price)
    audit ON [class,eq,'Order'] EXECUTE FUNCTION audit_order(item, price)

(``parse_internal``; the words are read in any case, the statement as written; ``FUNCTION
f(a, b)`` is ``SELECT f(:a, :b)``). Each is a durable subscription of the node, by its name, made
through ``historic.inbox.AtomicConsumer``: the statement and the record of the delivery commit in
one transaction of the node's database, so that a node killed and started again applies each
publication exactly once. Deliveries are applied one at a time, in the order they arrive; the
broker sends a publication matching several of the node's subscriptions to them in priority
order, so their statements run in that order (``docs/transactions.md`` says when it holds).

A statement that fails (a SQL error, a parameter the publication has no attribute for) is rolled
back with the record, and the delivery goes to its subscription's exception queue at the broker
with the error (``StatementFailed``); the node goes on with the next. A database that is
unreachable, locked or that aborted the transaction for a conflict (``transient``) is no fault of
the publication: the delivery is tried again, with a backoff, for as long as that lasts, the
others waiting behind it.

Trust: the statements are the node's operator's, given on its command line, in its settings file
or in Python, and run with the node's database rights. Nothing a client sends can add or change
one: publications reach a statement only as bound parameters, never as SQL text.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import Connection, DateTime, Engine, TextClause, bindparam, text
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from historic.errors import InboxError, StatementFailed
from historic.inbox import AtomicConsumer, TransactionalInbox
from historic.store import reason
from padres.client.connection import Client
from padres.client.handling import Sequencer
from padres.errors import InvalidMessage, ParseError, RequestFailed
from padres.language.parser import parse_filter
from padres.model.messages import TIME, Filter, check_id
from padres.model.printer import format_filter
from padres.model.protocol import Notify, Scope, check_priority

__all__ = [
    "RESERVED",
    "Executor",
    "InternalSubscription",
    "distinct",
    "parse_internal",
    "transient",
]

log = logging.getLogger("padres.db")

RESERVED: Final = ("control", "control-padres", "store-")
"""Names (and a prefix) of the node's own durable subscriptions: no internal subscription
takes them."""
_FORM: Final = "NAME ON FILTER [PRIORITY N] [SCOPE local|global] EXECUTE STATEMENT"
_WORD: Final = re.compile(r"\s*([A-Za-z]+)\b\s*")
_FUNCTION: Final = re.compile(r"FUNCTION\s+([A-Za-z_][\w.]*)\s*\((.*)\)\s*;?\s*", re.I | re.S)
_PARAMETER: Final = re.compile(r"[A-Za-z_]\w*")
_TRANSIENT_STATES: Final = ("08", "40", "53", "57P", "58")
"""SQLSTATE classes of PostgreSQL errors that are no fault of the statement: connection
exceptions, transaction rollbacks (serialization failures, deadlocks), insufficient resources,
the server shutting down, system errors."""
_TRANSIENT_SQLITE: Final = ("locked", "busy", "unable to open", "disk i/o")


@dataclass(frozen=True)
class InternalSubscription:
    """A statement to run for each publication ``filter`` matches (see the module)."""

    name: str
    """Its durable subscription's name, and its exception queue's."""
    filter: Filter
    statement: str
    """SQL with named parameters: ``:attribute`` for each of the publication's attributes
    it uses, ``:time`` for its timestamp."""
    priority: int = 0
    scope: Scope = Scope.GLOBAL

    def __post_init__(self) -> None:
        check_id(self.name, "internal subscription name")
        if self.name.startswith(RESERVED[2]) or self.name in RESERVED:
            raise InvalidMessage(
                f"internal subscription name {self.name!r} is the node's own: not 'control', "
                f"'control-padres' or 'store-...'"
            )
        if not self.statement.strip():
            raise InvalidMessage(f"internal subscription {self.name!r} has no statement")
        if self.filter.window is not None:
            why = f"internal subscription {self.name!r} runs for live publications: no time window"
            raise InvalidMessage(why)
        check_priority(self.priority)
        object.__setattr__(self, "scope", Scope(self.scope))

    def __str__(self) -> str:
        options = f" PRIORITY {self.priority}" if self.priority else ""
        if self.scope is not Scope.GLOBAL:
            options += f" SCOPE {self.scope.value}"
        return f"{self.name} ON {format_filter(self.filter)}{options} EXECUTE {self.statement}"


def parse_internal(text: str) -> InternalSubscription:
    """An internal subscription from its text form (see the module); ``ParseError`` (or
    ``InvalidMessage``) saying what is wrong."""
    head = re.match(r"\s*(\S+)\s+ON\s+", text, re.I)
    if head is None:
        raise ParseError(f"expected {_FORM}", source=text, column=1)
    start = head.end()
    end = _filter_end(text, start)
    try:
        flt = parse_filter(text[start:end])
    except ParseError as exc:
        raise exc.at_line(1, offset=start, source=text) from None
    priority, scope = 0, Scope.GLOBAL
    at = end
    while True:
        word = _WORD.match(text, at)
        keyword = word.group(1).upper() if word else ""
        if word is None or keyword not in ("PRIORITY", "SCOPE", "EXECUTE"):
            column = at + 1 + (len(text[at:]) - len(text[at:].lstrip()))
            why = "expected PRIORITY N, SCOPE local|global or EXECUTE after the filter"
            raise ParseError(why, source=text, column=column)
        at = word.end()
        if keyword == "EXECUTE":
            break
        value = re.match(r"(\S+)", text[at:])
        if value is None:
            raise ParseError(f"{keyword} needs a value", source=text, column=at + 1)
        try:
            if keyword == "PRIORITY":
                priority = check_priority(int(value.group(1)))
            else:
                scope = Scope(value.group(1).lower())
        except ValueError as exc:
            why = str(exc) if isinstance(exc, InvalidMessage) else "a priority is a whole number"
            raise ParseError(why, source=text, column=at + 1) from None
        at += value.end()
    statement = _function_call(text[at:].strip(), text, at)
    return InternalSubscription(head.group(1), flt, statement, priority, scope)


def distinct(subscriptions: Sequence[InternalSubscription]) -> list[InternalSubscription]:
    """``subscriptions``, if no two share a name; ``InvalidMessage`` otherwise."""
    seen: set[str] = set()
    for sub in subscriptions:
        if sub.name in seen:
            raise InvalidMessage(f"internal subscription {sub.name!r} is given twice")
        seen.add(sub.name)
    return list(subscriptions)


def _filter_end(text: str, start: int) -> int:
    """Where the filter starting at ``start`` ends: at the first word outside its brackets
    (and the quoted strings in them)."""
    depth, quoted, i = 0, False, start
    while i < len(text):
        c = text[i]
        if quoted:
            if c == "\\":
                i += 1
            elif c == "'":
                quoted = False
        elif c == "'":
            quoted = True
        elif c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        elif depth == 0 and not c.isspace() and c != ",":
            return i
        i += 1
    return i


def _function_call(statement: str, text: str, at: int) -> str:
    """``statement``, or the ``SELECT`` that calls the function ``FUNCTION f(a, b)`` names."""
    call = _FUNCTION.fullmatch(statement)
    if call is None:
        return statement
    arguments = [a.strip() for a in call.group(2).split(",")] if call.group(2).strip() else []
    for argument in arguments:
        if not _PARAMETER.fullmatch(argument):
            why = f"FUNCTION takes attribute names, not {argument!r}"
            raise ParseError(why, source=text, column=at + 1)
    return f"SELECT {call.group(1)}({', '.join(':' + a for a in arguments)})"


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is no fault of the statement, so that the same
    statement may work later: the database is unreachable, locked or busy, or it aborted the
    transaction for a conflict with another."""
    while True:
        if isinstance(exc, PoolTimeout):
            return True
        if isinstance(exc, DBAPIError):
            if exc.connection_invalidated:
                return True
            original = exc.orig
            state = getattr(original, "sqlstate", None) or getattr(original, "pgcode", None)
            if isinstance(state, str):
                return state.startswith(_TRANSIENT_STATES)
            if isinstance(original, sqlite3.OperationalError):
                return any(word in str(original).lower() for word in _TRANSIENT_SQLITE)
            # A driver's operational error without a SQLSTATE: the server was not reached.
            return type(original).__name__ == "OperationalError"
        cause = exc.__cause__
        if cause is None:
            return False
        exc = cause


class _Statement:
    """One internal subscription's statement, compiled once, run for a delivery."""

    def __init__(self, sub: InternalSubscription) -> None:
        self.name = sub.name
        clause: TextClause = text(sub.statement)
        self.parameters = frozenset(clause.compile().params)
        if TIME in self.parameters:  # a timestamp, whatever the database makes of it
            clause = clause.bindparams(bindparam(TIME, type_=DateTime(timezone=True)))
        self.clause = clause

    def __call__(self, conn: Connection, note: Notify) -> None:
        pub = note.publication
        values: dict[str, Any] = dict(pub.attributes)
        values[TIME] = pub.timestamp
        missing = sorted(self.parameters - values.keys())
        if missing:
            raise StatementFailed(
                f"internal subscription {self.name!r}: publication {pub.id} has no attribute "
                f"{missing[0]!r} for the statement's parameter :{missing[0]}"
            )
        conn.execute(self.clause, values)


class _Consumer(AtomicConsumer):
    """The atomic consumer of one internal subscription: a failure of its transaction that is
    not ``transient`` is its statement's (``StatementFailed``), however far it got (a
    constraint checked at the commit, say)."""

    def _apply(self, note: Notify) -> bool:
        try:
            return super()._apply(note)
        except (SQLAlchemyError, InboxError) as exc:
            if transient(exc):
                raise
            why = f"internal subscription {self.subscription!r}: {reason(exc)}"
            raise StatementFailed(why) from exc


class Executor:
    """Runs a database node's internal subscriptions against its database (see the module).

    ``start`` makes (or resumes) their durable subscriptions, the highest priority first, and
    ends the ones an earlier run had that are no longer given (all of them, when none is
    given); ``stop`` stops applying (the subscriptions stay at the broker, what they match
    waits there)."""

    def __init__(
        self,
        client: Client,
        engine: Engine,
        subscriptions: Sequence[InternalSubscription],
        *,
        backoff: float = 0.1,
    ) -> None:
        """``client``: the node's, made with ``reconnect=True`` and one broker's URL;
        ``backoff``: the first wait before a delivery is tried again after a transient
        failure."""
        self.client = client
        self.inbox = TransactionalInbox(engine)
        self.subscriptions = sorted(distinct(subscriptions), key=lambda sub: -sub.priority)
        self.backoff = backoff
        self.consumers: dict[str, AtomicConsumer] = {}
        self._sequencer = Sequencer()

    @property
    def applied(self) -> int:
        """Deliveries applied by this run (each once: not those found applied already)."""
        return sum(c.applied for c in self.consumers.values())

    @property
    def failed(self) -> int:
        """Deliveries put into the exception queues by this run."""
        return sum(
            c.handle.handler.failed
            for c in self.consumers.values()
            if c.handle is not None and c.handle.handler is not None
        )

    async def start(self) -> None:
        if not self.subscriptions and not await asyncio.to_thread(self.inbox.exists):
            return  # never had any
        await asyncio.to_thread(self.inbox.create)
        await self._end_forgotten()
        for sub in self.subscriptions:
            consumer = _Consumer(
                self.client,
                self.inbox,
                sub.name,
                sub.filter,
                _Statement(sub),
                retries=0,
                backoff=self.backoff,
                priority=sub.priority,
                scope=sub.scope,
                transient=transient,
                sequencer=self._sequencer,
            )
            try:
                await consumer.start()
            except RequestFailed as exc:
                raise RequestFailed(
                    f"internal subscription {sub.name!r}: {exc.text} (a changed filter or "
                    "scope needs a new name: the old one ends when the node starts without it)",
                    exc.ref,
                ) from None
            self.consumers[sub.name] = consumer
            log.info("%s: running internal subscription %s", self.client.name, sub)

    async def _end_forgotten(self) -> None:
        """End, at the broker and in the inbox, the internal subscriptions of an earlier run
        that are not given now (their queues go with them)."""
        given = {sub.name for sub in self.subscriptions}
        name = self.client.name
        for old in await asyncio.to_thread(self.inbox.subscriptions, name):
            if old in given:
                continue
            with contextlib.suppress(RequestFailed):  # not at this broker: nothing to end there
                await self.client.unsubscribe(old)
            await asyncio.to_thread(self.inbox.forget, name, old)
            log.info("%s: ended internal subscription %s (no longer given)", name, old)

    async def stop(self) -> None:
        if not self.consumers:
            return
        applied, failed = self.applied, self.failed
        for consumer in self.consumers.values():
            await consumer.stop()
        log.info(
            "%s: internal subscriptions applied %d publications, %d failed",
            self.client.name,
            applied,
            failed,
        )
