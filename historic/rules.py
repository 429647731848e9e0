"""Rules that publish a table's changes, as PostgreSQL-PS's ``CREATE RULE ... ON INSERT TO
orders PUBLISH ...``: database triggers that write a publication into the transactional outbox
(``historic.outbox``) in the very transaction that changes the table; the outbox's relay
publishes it once that commits::

    outbox = TransactionalOutbox(engine)
    rules = Rules(outbox)
    rules.add(Rule("big_orders", table="orders", class_name="Order",
                   where="[price,>,100]", old_prefix="old_"))
    with engine.begin() as conn:                  # any writer: the application, psql, ...
        conn.execute(orders.insert().values(id=7, price=120))
    async with OutboxRelay(outbox, url, "shop-outbox", advertisements=rules.advertisements()):
        ...

Each change the rule covers (``on``: insert, update, delete; a row at a time) whose row meets
the condition becomes a publication: ``[class,<class_name>],[table,<table>],[op,<operation>]``
and the row's columns (all, or those named) as attributes; an update's values before the change
too, under ``old_prefix`` (``old_price``); a delete's the deleted row. A NULL leaves its
attribute out.

**Trust.** Whoever adds a rule needs the right to create triggers on the table, and so is its
owner in practice; still nothing given to a rule reaches the database as SQL. Tables and columns
must be in the database's catalogue and are quoted; the condition is a conjunction of the
language's predicates (``padres.language.parser.parse_predicates``), checked against the columns'
types and translated to SQL with the engine's own semantics (``historic.predicates``), its
values written as SQL literals. The triggers run with the rights of whoever changes the table,
who therefore needs to be allowed to insert into the outbox.

**Order and exactly once.** Publications are written in the order the transactions commit
(every table whose rules share an outbox, in one order), and each change in a transaction in
the order it was made: on PostgreSQL the triggers are deferred to the commit and take the
outbox's advisory lock there, on SQLite one transaction writes at a time. The relay publishes in
that order, and exactly once (``historic.outbox``).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import orjson
from sqlalchemy import (
    Column,
    Connection,
    Float,
    MetaData,
    Row,
    String,
    Table,
    Text,
    delete,
    insert,
    inspect,
    select,
    text,
)
from sqlalchemy.exc import CompileError, IntegrityError, SQLAlchemyError

from historic.errors import RuleError
from historic.outbox import TransactionalOutbox
from historic.triggers import (
    OLD,
    Install,
    TableColumn,
    TriggerSQL,
    attribute_type,
    trigger_name,
    trigger_sql,
)
from padres.errors import InvalidMessage, ParseError
from padres.language.parser import parse_predicates
from padres.model.classes import AttributeType
from padres.model.messages import (
    MAX_ATTRIBUTES,
    MAX_PREDICATES,
    Filter,
    Predicate,
    check_name,
    check_value,
)
from padres.model.printer import format_filter, format_predicate
from rete.operators import Op, OperandKind, operand_kind

__all__ = ["OPERATIONS", "Rule", "Rules"]

OPERATIONS: Final = ("insert", "update", "delete")
"""The changes a rule may publish, in the order a rule lists them."""
RESERVED: Final = ("class", "table", "op", "time")
"""Attribute names a column cannot take: the publication's own, and its timestamp's."""
_RULE_NAME: Final = re.compile(r"[a-z][a-z0-9_]{0,39}")
_TEXTUAL: Final = (AttributeType.STRING, AttributeType.DATE, AttributeType.DATETIME)
_NUMERIC: Final = (AttributeType.INTEGER, AttributeType.FLOAT)


@dataclass(frozen=True, slots=True)
class Rule:
    """What to publish of a table's changes (see the module docstring)."""

    name: str
    """Lower-case letters, digits and ``_``, starting with a letter; at most 40 characters."""
    table: str
    class_name: str
    on: tuple[str, ...] = OPERATIONS
    columns: tuple[str, ...] | None = None
    """The columns published; None: all the columns the table has when the rule is added
    (an installed rule lists them)."""
    where: str | None = None
    """A condition: predicates over ``column`` (its value after an insert or update, the
    deleted one for a delete), ``old.column`` (before an update or delete) and ``op``."""
    old_prefix: str | None = None
    """Of an update, publish the values before it too, each under this prefix."""

    def advertisement(self) -> str:
        """An advertisement its publications conform to, for the relay."""
        predicates = [
            Predicate("class", Op.EQ, self.class_name),
            Predicate("table", Op.EQ, self.table),
            Predicate("op", Op.IS_PRESENT),
        ]
        names = list(self.columns or ())
        if self.old_prefix is not None:
            names += [self.old_prefix + name for name in names]
        if len(predicates) + len(names) <= MAX_PREDICATES:  # else: the rest are not checked
            predicates += [Predicate(name, Op.IS_PRESENT) for name in names]
        return format_filter(Filter(tuple(predicates)))


class Rules:
    """The rules that publish into one outbox: they live in its database, in a table named
    after it (``padres_outbox_rules``), with their triggers and the outbox in its schema."""

    def __init__(self, outbox: TransactionalOutbox) -> None:
        self.outbox = outbox
        self.engine = outbox.engine
        self.metadata = MetaData(schema=outbox.metadata.schema)
        self.table = Table(
            f"{outbox.table.name}_rules",
            self.metadata,
            Column("name", String(64), primary_key=True),
            Column("table_name", String(256), nullable=False),
            Column("operations", String(32), nullable=False),
            Column("class_name", Text, nullable=False),
            Column("columns", Text, nullable=False),
            Column("condition", Text, nullable=True),
            Column("old_prefix", String(256), nullable=True),
            Column("created", Float, nullable=False),
        )

    def add(self, rule: Rule, transaction: Connection | None = None) -> Rule:
        """Install ``rule`` (its triggers, its entry, and the outbox and rules tables if they
        are not there), all or nothing; returns it with its columns listed. ``RuleError`` when
        it is refused: a name in use or not allowed, an unknown table or column, a column no
        attribute type holds, a condition that does not parse or does not fit the columns.
        In an open ``transaction`` of the database if one is given (on PostgreSQL, a
        migration may remove a rule, change the table and add the rule again in one)."""
        rule = _checked(rule)
        condition = _condition(rule.where)
        sql = self._sql()
        with self._storage(f"add rule {rule.name!r}"), self._begin(transaction) as conn:
            self.outbox.metadata.create_all(conn)
            self.metadata.create_all(conn)
            if self._rule(conn, rule.name) is not None:
                raise RuleError(f"a rule named {rule.name!r} exists already")
            schema = self._schema(conn)
            columns = self._columns(conn, rule.table, schema)
            published = _published(rule, columns)
            installed = replace(rule, columns=tuple(c.name for c in published))
            outbox_schema = self.outbox.metadata.schema or schema
            install = Install(
                rule=rule.name,
                table=rule.table,
                schema=schema,
                operations=rule.on,
                class_name=rule.class_name,
                columns=tuple(published),
                condition=condition,
                condition_columns=_condition_columns(condition, columns, rule.table),
                old_prefix=rule.old_prefix,
                outbox=self.outbox.table.name,
                outbox_schema=outbox_schema,
                lock=_lock_key(outbox_schema, self.outbox.table.name),
            )
            try:  # first: on SQLite it opens the transaction the triggers are made in
                conn.execute(insert(self.table).values(_row(installed)))
            except IntegrityError as exc:
                raise RuleError(f"a rule named {rule.name!r} exists already") from exc
            try:
                statements = sql.install(install)
            except CompileError as exc:
                raise RuleError(f"rule {rule.name!r}: cannot write its condition: {exc}") from exc
            for statement in statements:
                conn.exec_driver_sql(statement)
        return installed

    def remove(self, name: str, transaction: Connection | None = None) -> None:
        """Remove the rule ``name`` and its triggers (``RuleError`` if there is none), in an
        open ``transaction`` if one is given."""
        sql = self._sql()
        with self._storage(f"remove rule {name!r}"), self._begin(transaction) as conn:
            rule = self._rule(conn, name)
            if rule is None:
                raise RuleError(f"no rule named {name!r}")
            conn.execute(delete(self.table).where(self.table.c.name == name))
            schema = self._schema(conn)
            present = sql.triggers(conn, schema)
            mine = {trigger_name(name, op) for op in rule.on}
            ours = {trigger: table for trigger, table in present.items() if trigger in mine}
            for statement in sql.drop(name, schema, ours):
                conn.exec_driver_sql(statement)

    def installed(self) -> list[Rule]:
        """Every rule, by name."""
        with self._storage("read the rules"), self.engine.connect() as conn:
            if not inspect(conn).has_table(self.table.name, schema=self.metadata.schema):
                return []
            rows = conn.execute(select(self.table).order_by(self.table.c.name)).all()
        return [_rule(row) for row in rows]

    def problems(self) -> dict[str, str]:
        """What became of the rules whose table was dropped or renamed since they were added,
        by name (see ``docs/transactions.md`` on schema changes)."""
        rules = self.installed()
        if not rules:
            return {}
        sql = self._sql()
        with self._storage("read the rules"), self.engine.connect() as conn:
            present = sql.triggers(conn, self._schema(conn))
        out = {}
        for rule in rules:
            tables = {present.get(trigger_name(rule.name, op)) for op in rule.on}
            if tables == {None}:
                out[rule.name] = f"its table {rule.table!r} is gone: it publishes nothing"
            elif None in tables:
                out[rule.name] = "some of its triggers are gone: remove it and add it again"
            elif tables != {rule.table}:
                now = ", ".join(sorted(map(repr, tables)))
                out[rule.name] = (
                    f"its table {rule.table!r} is now named {now}; "
                    f"its publications still say [table,{rule.table!r}]"
                )
        return out

    def advertisements(self) -> list[str]:
        """The advertisements of every rule's publications (``Rule.advertisement``)."""
        return [rule.advertisement() for rule in self.installed()]

    def _sql(self) -> TriggerSQL:
        sql = trigger_sql(self.engine.dialect)
        if sql is None:
            raise RuleError(
                f"rules need PostgreSQL or SQLite, not {self.engine.dialect.name}: "
                "publish with TransactionalOutbox.add instead"
            )
        if self.engine.dialect.name == "sqlite" and self.metadata.schema is not None:
            raise RuleError("on SQLite, rules work in the main database: an outbox without schema")
        return sql

    def _schema(self, conn: Connection) -> str | None:
        """The schema of the tables (PostgreSQL): the outbox's, or the connection's own."""
        if self.metadata.schema is not None or conn.dialect.name != "postgresql":
            return self.metadata.schema
        return str(conn.execute(text("SELECT current_schema()")).scalar_one())

    def _columns(self, conn: Connection, table: str, schema: str | None) -> list[TableColumn]:
        inspector = inspect(conn)
        where = f" in schema {schema!r}" if schema else ""
        if table in (self.outbox.table.name, self.table.name):
            raise RuleError(f"table {table!r} is the outbox's own: a rule on it would never end")
        if table not in inspector.get_table_names(schema=schema):
            raise RuleError(f"no table {table!r}{where}")
        columns = []
        for info in inspector.get_columns(table, schema=schema):
            sqltype = info["type"]
            try:
                declared = str(sqltype.compile(dialect=conn.dialect))
            except CompileError:
                declared = "no type"
            columns.append(
                TableColumn(
                    info["name"],
                    attribute_type(sqltype),
                    declared,
                    bool(getattr(sqltype, "timezone", False)),
                )
            )
        return columns

    @contextlib.contextmanager
    def _begin(self, transaction: Connection | None) -> Iterator[Connection]:
        if transaction is not None:
            yield transaction
            return
        with self.engine.begin() as conn:
            yield conn

    def _rule(self, conn: Connection, name: str) -> Rule | None:
        if not inspect(conn).has_table(self.table.name, schema=self.metadata.schema):
            return None
        row = conn.execute(select(self.table).where(self.table.c.name == name)).first()
        return None if row is None else _rule(row)

    @contextlib.contextmanager
    def _storage(self, doing: str) -> Iterator[None]:
        try:
            yield
        except SQLAlchemyError as exc:
            raise RuleError(f"cannot {doing}: {exc}") from exc


def _checked(rule: Rule) -> Rule:
    """``rule`` with its operations in order, or ``RuleError`` saying what is wrong."""
    if not isinstance(rule.name, str) or not _RULE_NAME.fullmatch(rule.name):
        raise RuleError(
            f"invalid rule name {rule.name!r}: 1 to 40 lower-case letters, digits and '_', "
            "starting with a letter"
        )
    unknown = [op for op in rule.on if op not in OPERATIONS]
    if unknown or not rule.on:
        raise RuleError(
            f"rule {rule.name!r}: on {', '.join(map(repr, unknown)) or 'nothing'}: "
            f"a rule publishes {', '.join(OPERATIONS)}, or some of them"
        )
    try:
        check_value(rule.class_name, "class")
    except InvalidMessage as exc:
        raise RuleError(f"rule {rule.name!r}: {exc}") from None
    if type(rule.class_name) is not str or not rule.class_name:
        raise RuleError(f"rule {rule.name!r}: the class is a string: class_name='Order'")
    if rule.old_prefix is not None and "update" not in rule.on:
        raise RuleError(
            f"rule {rule.name!r}: old_prefix names the values before an update, "
            "and the rule publishes no update"
        )
    return replace(rule, on=tuple(op for op in OPERATIONS if op in rule.on))


def _condition(where: str | None) -> tuple[Predicate, ...]:
    if where is None or not where.strip():
        return ()
    try:
        return parse_predicates(where)
    except ParseError as exc:
        raise RuleError(f"the condition does not parse: {exc}") from None


def _published(rule: Rule, columns: Sequence[TableColumn]) -> list[TableColumn]:
    """The columns ``rule`` publishes, checked: each has an attribute type and a name that is
    an attribute name, none clashes with another attribute."""
    by_name = {c.name: c for c in columns}
    if rule.columns is None:
        chosen = list(columns)
        bad = [c for c in chosen if c.type is None or not _attribute_name(c.name)]
        if bad:
            what = ", ".join(f"{c.name!r} ({c.declared})" for c in bad)
            raise RuleError(
                f"table {rule.table!r}: column(s) {what} cannot be published (no attribute "
                "type holds their values, or their name is not an attribute name): "
                "name the columns to publish"
            )
    else:
        chosen = []
        for name in rule.columns:
            column = by_name.get(name)
            if column is None:
                raise RuleError(f"table {rule.table!r} has no column {name!r}")
            if column in chosen:
                raise RuleError(f"column {name!r} is named twice")
            if column.type is None:
                raise RuleError(
                    f"column {name!r} of {rule.table!r} is {column.declared}: no attribute type "
                    "holds its values"
                )
            if not _attribute_name(name):
                raise RuleError(f"column {name!r} of {rule.table!r} is not an attribute name")
            chosen.append(column)
    names = [c.name for c in chosen]
    if rule.old_prefix is not None:
        old = [rule.old_prefix + name for name in names]
        bad_names = [name for name in old if not _attribute_name(name)]
        if bad_names:
            raise RuleError(f"old_prefix {rule.old_prefix!r} makes {bad_names[0]!r}: no name")
        names += old
    seen = set(RESERVED)
    for name in names:
        if name in seen:
            raise RuleError(
                f"table {rule.table!r}: attribute {name!r} would be published twice "
                f"({', '.join(RESERVED)} are the publication's own): leave its column out"
            )
        seen.add(name)
    if len(names) + 3 > MAX_ATTRIBUTES:
        raise RuleError(f"a publication holds at most {MAX_ATTRIBUTES:,} attributes")
    return chosen


def _attribute_name(name: str) -> bool:
    try:
        check_name(name)
    except InvalidMessage:
        return False
    return True


def _condition_columns(
    condition: Sequence[Predicate], columns: Sequence[TableColumn], table: str
) -> dict[str, TableColumn]:
    """The columns ``condition`` names, by name, checked against their types."""
    by_name = {c.name: c for c in columns}
    used = {}
    for p in condition:
        if p.attribute == "op":
            kind = AttributeType.STRING
        else:
            name = p.attribute.removeprefix(OLD)
            column = by_name.get(name)
            if column is None:
                raise RuleError(
                    f"condition {format_predicate(p)}: table {table!r} has no column {name!r}"
                )
            if column.type is None:
                raise RuleError(
                    f"condition {format_predicate(p)}: column {name!r} is {column.declared}, "
                    "which no attribute type holds"
                )
            kind = column.type
            used[name] = column
        if not _fits(p, kind):
            raise RuleError(
                f"condition {format_predicate(p)}: {p.attribute!r} is a {kind} value; "
                f"operator {p.op} takes a {operand_kind(p.op)}"
                + (" (a boolean)" if type(p.value) is bool else "")
            )
    return used


def _fits(p: Predicate, kind: AttributeType) -> bool:
    """Whether ``p`` can hold for values of ``kind``."""
    match operand_kind(p.op):
        case OperandKind.NONE:
            return True
        case OperandKind.NUMBER:
            return kind in _NUMERIC
        case OperandKind.STRING:
            return kind in _TEXTUAL
        case _:
            return kind is AttributeType.BOOLEAN if type(p.value) is bool else kind in _TEXTUAL


def _lock_key(schema: str | None, outbox: str) -> int:
    """The advisory lock of an outbox, the same for every rule writing to it."""
    digest = hashlib.sha256(f"padres outbox {schema}.{outbox}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _row(rule: Rule) -> dict[str, object]:
    return {
        "name": rule.name,
        "table_name": rule.table,
        "operations": ",".join(rule.on),
        "class_name": rule.class_name,
        "columns": orjson.dumps(list(rule.columns or ())).decode(),
        "condition": rule.where,
        "old_prefix": rule.old_prefix,
        "created": time.time(),
    }


def _rule(row: Row[Any]) -> Rule:
    r = row._mapping
    return Rule(
        name=r["name"],
        table=r["table_name"],
        class_name=r["class_name"],
        on=tuple(r["operations"].split(",")),
        columns=tuple(orjson.loads(r["columns"])),
        where=r["condition"],
        old_prefix=r["old_prefix"],
    )
