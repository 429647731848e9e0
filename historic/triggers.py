"""The SQL behind ``historic.rules``: what attribute type each kind of column gives, and the
triggers that write a change's publication into the outbox, for PostgreSQL and for SQLite.

Everything that reaches the SQL text from outside is made safe here: identifiers (tables,
columns, the outbox) are quoted by the database's own rules, after ``historic.rules`` found them
in its catalogue; strings (the class, the table's name, attribute names as JSON) are written as
SQL literals by the dialect, and the values of a condition by SQLAlchemy's literal rendering.
The statements are for the driver (``Connection.exec_driver_sql``): where its parameters are
written ``%s`` (psycopg), SQLAlchemy writes a ``%`` of a name or a literal as ``%%``, and the
driver reads it back as one; the text written here holds no ``%`` of its own for PostgreSQL.

A publication is written as the JSON the outbox stores (``padres.model.codec``), built in SQL as
text so that every value keeps its type: an integer as an integer, a float always with a
decimal point or an exponent (``120.0``), a string JSON-quoted. A NULL leaves its attribute out,
as does a value no attribute can hold (NaN, an infinity).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson
from sqlalchemy import Connection, String, and_, literal, literal_column, text
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ColumnElement, sqltypes
from sqlalchemy.types import TypeEngine

from historic.predicates import predicate_clause
from padres.model.classes import AttributeType
from padres.model.messages import Predicate

__all__ = [
    "Install",
    "TableColumn",
    "TriggerSQL",
    "attribute_type",
    "trigger_name",
    "trigger_sql",
]

OLD: Final = "old."
"""How a condition names a column's value before the change: ``old.price``."""
_MAX_FLOAT: Final = "1.7976931348623157e308"
_NUM_NULLS_ARGS: Final = 90
"""Columns per ``num_nulls`` call (PostgreSQL takes at most 100 arguments)."""


def attribute_type(sqltype: TypeEngine[Any]) -> AttributeType | None:
    """The attribute type of a column of type ``sqltype`` (as the database's catalogue
    reports it), or None when no attribute type holds its values (bytes, JSON, arrays,
    intervals, times of day, ...)."""
    if isinstance(sqltype, sqltypes.Boolean):
        return AttributeType.BOOLEAN
    if isinstance(sqltype, sqltypes.Integer):
        return AttributeType.INTEGER
    if isinstance(sqltype, sqltypes.Float | sqltypes.Numeric):
        return AttributeType.FLOAT
    if isinstance(sqltype, sqltypes.DateTime):
        return AttributeType.DATETIME
    if isinstance(sqltype, sqltypes.Date):
        return AttributeType.DATE
    if isinstance(sqltype, sqltypes.String | sqltypes.Uuid):
        return AttributeType.STRING
    return None


@dataclass(frozen=True, slots=True)
class TableColumn:
    """A column of the table a rule watches, as its catalogue describes it."""

    name: str
    type: AttributeType | None
    declared: str
    """Its type as the database names it, for messages."""
    timezone: bool = False
    """Of a timestamp: whether it is ``with time zone`` (PostgreSQL)."""


@dataclass(frozen=True, slots=True)
class Install:
    """Everything the triggers of one rule are made of, checked by ``historic.rules``."""

    rule: str
    table: str
    schema: str | None
    operations: tuple[str, ...]
    class_name: str
    columns: tuple[TableColumn, ...]
    """The columns published, in order."""
    condition: tuple[Predicate, ...]
    condition_columns: Mapping[str, TableColumn]
    """The columns the condition names, by name."""
    old_prefix: str | None
    outbox: str
    outbox_schema: str | None
    lock: int
    """The advisory lock (PostgreSQL) that puts the commits writing to this outbox in order."""


def trigger_name(rule: str, operation: str) -> str:
    return f"padres_rule_{rule}_{operation}"


def _function_name(rule: str) -> str:
    return f"padres_rule_{rule}"


def _json_key(name: str) -> str:
    return orjson.dumps(name).decode() + ":"


class TriggerSQL(ABC):
    """The SQL of one database kind (see ``trigger_sql``)."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self._quote = dialect.identifier_preparer.quote

    def literal(self, value: str) -> str:
        """``value`` as an SQL string literal, escaped as this database reads it."""
        return str(
            literal(value, String()).compile(
                dialect=self.dialect, compile_kwargs={"literal_binds": True}
            )
        )

    def qualified(self, name: str, schema: str | None) -> str:
        quoted = self._quote(name)
        return f"{self._quote(schema)}.{quoted}" if schema else quoted

    def column(self, row: str, column: TableColumn) -> str:
        return f"{row}.{self._quote(column.name)}"

    def condition(self, install: Install, operation: str) -> str | None:
        """The condition of ``install`` for a change ``operation`` as SQL over ``NEW`` and
        ``OLD``, or None when it has none."""
        if not install.condition:
            return None
        row = "OLD" if operation == "delete" else "NEW"
        parts: list[ColumnElement[bool]] = []
        for p in install.condition:
            kinds: dict[str, ColumnElement[Any]]
            if p.attribute == "op":
                kinds = {"s": literal(operation, String())}
            elif p.attribute.startswith(OLD):
                column = install.condition_columns[p.attribute[len(OLD) :]]
                kinds = (
                    {} if operation == "insert" else self.kinds(self.column("OLD", column), column)
                )
            else:
                column = install.condition_columns[p.attribute]
                kinds = self.kinds(self.column(row, column), column)
            parts.append(predicate_clause(kinds, p, self.dialect.name))
        clause = and_(*parts)
        return str(clause.compile(dialect=self.dialect, compile_kwargs={"literal_binds": True}))

    @abstractmethod
    def kinds(self, value: str, column: TableColumn) -> dict[str, ColumnElement[Any]]:
        """The published value of ``column`` (SQL ``value``) by kind, for a condition: the same
        value the publication carries, NULL where it carries none."""

    @abstractmethod
    def install(self, install: Install) -> list[str]:
        """The statements that make the triggers (and what else they need)."""

    @abstractmethod
    def drop(self, rule: str, schema: str | None, present: Mapping[str, str]) -> list[str]:
        """The statements that remove ``rule``: its triggers ``present`` (name -> the table
        they are on now, see ``triggers``), and what else it has."""

    @abstractmethod
    def triggers(self, conn: Connection, schema: str | None) -> dict[str, str]:
        """The rule triggers present, by name, with the tables they are on."""


class _PostgreSQL(TriggerSQL):
    """A plpgsql function per rule, and a constraint trigger per operation, deferred to the
    commit: there it takes the outbox's advisory lock before writing, so that the outbox's row
    numbers follow the order in which the transactions commit."""

    def _float(self, value: str, column: TableColumn) -> str:
        """A float as a double precision, NULL for NaN and the infinities. A real goes through
        its text, so that the real 0.1 is the double 0.1, as its readers see it."""
        if column.declared.upper().startswith("REAL"):
            value = f"CAST({value} AS text)"
        v = f"CAST({value} AS double precision)"
        return f"NULLIF(NULLIF(NULLIF({v}, 'NaN'), 'Infinity'), '-Infinity')"

    def _text(self, value: str, column: TableColumn) -> str:
        if column.type is AttributeType.DATE:
            return f"CASE WHEN isfinite({value}) THEN to_char({value}, 'YYYY-MM-DD') END"
        if column.type is AttributeType.DATETIME:
            utc = f"({value} AT TIME ZONE 'UTC')" if column.timezone else value
            return (
                f"CASE WHEN isfinite({value}) "
                f"""THEN to_char({utc}, 'YYYY-MM-DD"T"HH24:MI:SS"Z"') END"""
            )
        return f"CAST({value} AS text)"

    def kinds(self, value: str, column: TableColumn) -> dict[str, ColumnElement[Any]]:
        match column.type:
            case AttributeType.INTEGER:
                return {"i": literal_column(value)}
            case AttributeType.FLOAT:
                return {"f": literal_column(self._float(value, column))}
            case AttributeType.BOOLEAN:
                return {"b": literal_column(value)}
            case _:
                return {"s": literal_column(self._text(value, column))}

    def _json(self, value: str, column: TableColumn) -> str:
        """``column``'s value as JSON text, NULL when it is left out."""
        match column.type:
            case AttributeType.INTEGER | AttributeType.BOOLEAN:
                return f"CAST({value} AS text)"
            case AttributeType.FLOAT:
                return (
                    f"regexp_replace(CAST({self._float(value, column)} AS text), "
                    r"'^(-?[0-9]+)$', '\1.0')"
                )
            case _:
                return f"CAST(to_json({self._text(value, column)}) AS text)"

    def install(self, install: Install) -> list[str]:
        table = self.qualified(install.table, install.schema)
        function = self.qualified(_function_name(install.rule), install.schema)
        fixed = [
            self.literal(_json_key("class") + orjson.dumps(install.class_name).decode()),
            self.literal(_json_key("table") + orjson.dumps(install.table).decode()),
            """'"op":"' || lower(TG_OP) || '"'""",
        ]
        values = [
            f"{self.literal(_json_key(c.name))} || {self._json(self.column('r', c), c)}"
            for c in install.columns
        ]
        old = ""
        if install.old_prefix is not None and "update" in install.operations:
            olds = [
                f"{self.literal(_json_key(install.old_prefix + c.name))} || "
                f"{self._json(self.column('OLD', c), c)}"
                for c in install.columns
            ]
            old = f"""
  IF TG_OP = 'UPDATE' THEN
    old_values := array_to_string(ARRAY[
      {_listed(olds, 6)}
    ], ',');
  END IF;"""
        # The rows are records, not of the table's type: the table may be renamed.
        body = f"""
DECLARE
  r record;
  old_values text;
  i text := {self.literal(install.rule + "-")} || replace(CAST(gen_random_uuid() AS text), '-', '');
BEGIN
  IF TG_OP = 'DELETE' THEN r := OLD; ELSE r := NEW; END IF;{old}
  PERFORM pg_advisory_xact_lock({install.lock});
  INSERT INTO {self.qualified(install.outbox, install.outbox_schema)} (id, body, created)
  VALUES (
    i,
    '{{"type":"publication","id":"' || i || '","timestamp":"'
      || to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
      || '","attributes":{{' || array_to_string(ARRAY[
        {_listed([*fixed, *values, "old_values"], 8)}
      ], ',') || '}}}}',
    extract(epoch FROM clock_timestamp()));
  RETURN NULL;
END
"""
        tag = _dollar_tag(body)
        statements = [
            f"CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql "
            f"SET extra_float_digits = 1 AS {tag}{body}{tag}"
        ]
        for operation in install.operations:
            row = "OLD" if operation == "delete" else "NEW"
            # Naming every published column in WHEN makes the database refuse to drop one, or
            # change its type, while the rule stands: a function's body records no dependency.
            when = [
                f"num_nulls({', '.join(self.column(row, c) for c in chunk)}) >= 0"
                for chunk in _chunks(install.columns, _NUM_NULLS_ARGS)
            ]
            condition = self.condition(install, operation)
            if condition is not None:
                when.append(f"({condition})")
            where = f" WHEN ({' AND '.join(when)})" if when else ""
            statements.append(
                f"CREATE CONSTRAINT TRIGGER {self._quote(trigger_name(install.rule, operation))} "
                f"AFTER {operation.upper()} ON {table} DEFERRABLE INITIALLY DEFERRED "
                f"FOR EACH ROW{where} EXECUTE FUNCTION {function}()"
            )
        return statements

    def drop(self, rule: str, schema: str | None, present: Mapping[str, str]) -> list[str]:
        return [
            *(
                f"DROP TRIGGER {self._quote(name)} ON {self.qualified(table, schema)}"
                for name, table in present.items()
            ),
            f"DROP FUNCTION IF EXISTS {self.qualified(_function_name(rule), schema)}()",
        ]

    def triggers(self, conn: Connection, schema: str | None) -> dict[str, str]:
        query = text(
            "SELECT t.tgname, c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = :schema AND t.tgname LIKE 'padres\\_rule\\_%'"
        )
        return {str(name): str(table) for name, table in conn.execute(query, {"schema": schema})}


class _SQLite(TriggerSQL):
    """A trigger per operation, writing in the changing transaction. SQLite has one writer at
    a time, so the outbox's row numbers follow the order of the commits.

    A value is published as SQLite holds it: an integer as an integer, a real as a float, text
    as a string (a blob is left out), except in columns declared with a float type (their
    integers are floats), BOOLEAN, DATE and DATETIME or TIMESTAMP (read as SQLite's date
    functions read them)."""

    def _text(self, value: str, column: TableColumn) -> str | None:
        if column.type is AttributeType.DATE:
            return f"strftime('%Y-%m-%d', {value})"
        if column.type is AttributeType.DATETIME:
            return f"strftime('%Y-%m-%dT%H:%M:%SZ', {value})"
        return None

    def _real(self, value: str, column: TableColumn) -> str:
        """The types of values published as floats: reals, and integers too in a column
        declared REAL, FLOAT, DOUBLE, NUMERIC or DECIMAL."""
        if column.type is AttributeType.FLOAT:
            return f"typeof({value}) IN ('integer', 'real') AND abs({value}) <= {_MAX_FLOAT}"
        return f"typeof({value}) = 'real' AND abs({value}) <= {_MAX_FLOAT}"

    def kinds(self, value: str, column: TableColumn) -> dict[str, ColumnElement[Any]]:
        if column.type is AttributeType.BOOLEAN:
            return {"b": literal_column(f"CASE WHEN {value} THEN 1 WHEN NOT {value} THEN 0 END")}
        converted = self._text(value, column)
        if converted is not None:
            return {"s": literal_column(converted)}
        kinds: dict[str, ColumnElement[Any]] = {
            "f": literal_column(
                f"CASE WHEN {self._real(value, column)} THEN CAST({value} AS REAL) END"
            ),
            "s": literal_column(f"CASE WHEN typeof({value}) = 'text' THEN {value} END"),
        }
        if column.type is not AttributeType.FLOAT:
            kinds["i"] = literal_column(f"CASE WHEN typeof({value}) = 'integer' THEN {value} END")
        return kinds

    def _json(self, value: str, column: TableColumn) -> str:
        if column.type is AttributeType.BOOLEAN:
            return f"CASE WHEN {value} THEN 'true' WHEN NOT {value} THEN 'false' END"
        converted = self._text(value, column)
        if converted is not None:
            return f"""'"' || {converted} || '"'"""
        return (
            f"CASE WHEN {self._real(value, column)} THEN printf('%!.17g', CAST({value} AS REAL)) "
            f"WHEN typeof({value}) = 'integer' THEN CAST({value} AS TEXT) "
            f"WHEN typeof({value}) = 'text' THEN json_quote({value}) END"
        )

    def install(self, install: Install) -> list[str]:
        table = self._quote(install.table)
        outbox = self._quote(install.outbox)
        statements = []
        for operation in install.operations:
            row = "OLD" if operation == "delete" else "NEW"
            fixed = {"class": install.class_name, "table": install.table, "op": operation}
            parts = [self.literal(orjson.dumps(fixed).decode()[1:-1])]
            for column in install.columns:
                value = self._json(self.column(row, column), column)
                parts.append(
                    f"coalesce({self.literal(',' + _json_key(column.name))} || {value}, '')"
                )
            if install.old_prefix is not None and operation == "update":
                for column in install.columns:
                    key = self.literal("," + _json_key(install.old_prefix + column.name))
                    value = self._json(self.column("OLD", column), column)
                    parts.append(f"coalesce({key} || {value}, '')")
            condition = self.condition(install, operation)
            when = f" WHEN {condition}" if condition is not None else ""
            statements.append(
                f"CREATE TRIGGER {self._quote(trigger_name(install.rule, operation))} "
                f"AFTER {operation.upper()} ON {table} FOR EACH ROW{when}\n"
                f"BEGIN\n"
                f"  INSERT INTO {outbox} (id, body, created)\n"
                f"""  SELECT i, '{{"type":"publication","id":"' || i || '","timestamp":"'\n"""
                f"""    || strftime('%Y-%m-%dT%H:%M:%fZ', 'now') || '","attributes":{{'\n"""
                f"    || {_concatenated(parts)} || '}}}}',\n"
                f"    (julianday('now') - 2440587.5) * 86400.0\n"
                f"  FROM (SELECT {self.literal(install.rule + '-')} "
                f"|| lower(hex(randomblob(16))) AS i);\n"
                f"END"
            )
        return statements

    def drop(self, rule: str, schema: str | None, present: Mapping[str, str]) -> list[str]:
        return [f"DROP TRIGGER {self._quote(name)}" for name in present]

    def triggers(self, conn: Connection, schema: str | None) -> dict[str, str]:
        query = text("SELECT name, tbl_name FROM sqlite_master WHERE type = 'trigger'")
        return {str(name): str(table) for name, table in conn.execute(query)}


def trigger_sql(dialect: Dialect) -> TriggerSQL | None:
    """The SQL of rules for ``dialect``'s database; None for databases other than
    PostgreSQL and SQLite."""
    kinds: dict[str, type[TriggerSQL]] = {"postgresql": _PostgreSQL, "sqlite": _SQLite}
    kind = kinds.get(dialect.name)
    return kind(dialect) if kind is not None else None


def _dollar_tag(body: str) -> str:
    """A dollar quote that does not occur in ``body``."""
    n = 0
    while f"$padres{n}$" in body:
        n += 1
    return f"$padres{n}$"


def _listed(items: Sequence[str], indent: int) -> str:
    return f",\n{' ' * indent}".join(items)


def _chunks(items: Sequence[TableColumn], size: int) -> list[Sequence[TableColumn]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _concatenated(parts: Sequence[str]) -> str:
    """``parts`` joined with ``||`` as a balanced tree: SQLite limits an expression's depth."""
    if len(parts) == 1:
        return parts[0]
    half = len(parts) // 2
    return f"({_concatenated(parts[:half])} || {_concatenated(parts[half:])})"
