"""Rules that publish a table's changes (``historic.rules``), on SQLite and on PostgreSQL (when a
server is reachable at 127.0.0.1:5432). Against a log the test keeps itself: committed changes,
made by several connections at once, are published exactly once, in the order they committed;
changes rolled back (whole transactions, or to a savepoint) never are; a relay killed with
SIGKILL in the middle of the stream and started again loses nothing and doubles nothing. A
condition selects exactly the changes the language's own matcher selects, and bad rules are
refused with clear errors, leaving nothing behind."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
from sqlalchemy import (
    Boolean,
    Column,
    Connection,
    Date,
    DateTime,
    Engine,
    Float,
    Integer,
    LargeBinary,
    MetaData,
    Numeric,
    String,
    Table,
    Text,
)

from historic.errors import RuleError
from historic.outbox import OutboxRelay, TransactionalOutbox
from historic.rules import Rule, Rules
from historic.triggers import trigger_name, trigger_sql
from padres.cli import main
from padres.client.connection import Client, Delivery
from padres.language.parser import parse_predicates
from padres.model.protocol import Notify
from rete.operators import Op, Value, evaluate
from tests.postgres import database_url, drop_schema
from tests.support import eventually, journalled_broker

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent

app = MetaData()
accounts = Table(
    "accounts",
    app,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("owner", Text),
    Column("balance", Float),
    Column("active", Boolean),
    Column("opened", Date),
)
items = Table(
    "items",
    app,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("name", String(64), nullable=False),
    Column("qty", Integer, nullable=False),
)
odd = Table(  # columns no rule can publish whole
    "odd",
    app,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("data", LargeBinary),
    Column("op", Text),
)
TABLES = {"accounts": accounts, "items": items}

Row = dict[str, Any]
Attributes = dict[str, Value]
Expect = Callable[[str, str, Row, Row | None], Attributes | None]
"""What a change (table, operation, the row after it or the deleted one, the row before an
update) publishes, or None."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with journalled_broker(tmp_path_factory) as proc:
        yield proc.url


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The application's database with its tables: its URL."""
    schema = f"padres_rules_{os.getpid()}"
    url = database_url(request.param, schema, tmp_path / "app.sqlite")
    engine = sqlalchemy.create_engine(url)
    app.create_all(engine)
    engine.dispose()
    yield url
    if request.param == "postgresql":
        drop_schema(schema)


@pytest.fixture
def engine(database: str) -> Iterator[Engine]:
    engine = sqlalchemy.create_engine(database, pool_size=8)
    yield engine
    engine.dispose()


def _tag(request: pytest.FixtureRequest) -> str:
    """A tag of its own for each test, so that their publications stay apart."""
    return "".join(c for c in request.node.name if c.isalnum())[-40:]


# -- the application: random changes, and the test's own log of what they publish ---------------


def _published(row: Row) -> Attributes:
    """A row's values as attributes: NULL left out, floats as floats, dates as strings."""
    out: Attributes = {}
    for name, value in row.items():
        if value is None:
            continue
        if isinstance(value, date):
            out[name] = value.isoformat()
        elif name == "balance":
            out[name] = float(value)
        else:
            out[name] = value
    return out


def _new_row(table: str, ident: int, rng: random.Random) -> Row:
    if table == "items":
        return {
            "id": ident,
            "name": rng.choice(("b", "bolt", "bar's", "nut", "axe")) + rng.choice(("", "é", '"')),
            "qty": rng.randint(0, 10),
        }
    return {
        "id": ident,
        "owner": rng.choice((None, "ann", "bob's", 'q"uote', "ü\\n\n", "x" * rng.randint(0, 30))),
        "balance": rng.choice((None, float(rng.randint(-9, 9)), rng.uniform(-1e6, 1e6), 0.1, 1e20)),
        "active": rng.choice((None, True, False)),
        "opened": rng.choice((None, date(2020, 1, 1) + timedelta(days=rng.randint(0, 3000)))),
    }


class Writer:
    """One connection making random changes in random transactions, some rolled back, some
    with a savepoint rolled back; what commits goes to ``log`` in commit order (the commits of
    all writers are taken one at a time, under ``commit_lock``, to know their order)."""

    def __init__(
        self,
        engine: Engine,
        tables: tuple[str, ...],
        expect: Expect,
        log: list[Attributes],
        commit_lock: threading.Lock,
        seed: int,
    ) -> None:
        self.engine = engine
        self.tables = tables
        self.expect = expect
        self.log = log
        self.commit_lock = commit_lock
        self.rng = random.Random(seed)
        self.next_id = seed * 1_000_000
        self.rows: dict[str, dict[int, Row]] = {table: {} for table in tables}
        """The rows this writer made, as committed."""

    def run(self, changes: int, pause: float = 0.0) -> None:
        done = 0
        with self.engine.connect() as conn:
            while done < changes:
                state = copy.deepcopy(self.rows)
                pending: list[Attributes] = []
                tx = conn.begin()
                for _ in range(self.rng.randint(1, 5)):
                    if self.rng.random() < 0.1:  # a savepoint, rolled back
                        before, kept = copy.deepcopy(state), len(pending)
                        savepoint = conn.begin_nested()
                        done += self._change(conn, state, pending)
                        savepoint.rollback()
                        state, pending = before, pending[:kept]
                    done += self._change(conn, state, pending)
                    time.sleep(self.rng.random() * pause)  # the other writers' changes between
                if self.rng.random() < 0.25:
                    tx.rollback()
                    continue
                with self.commit_lock:
                    tx.commit()
                    self.log.extend(pending)
                self.rows = state

    def _change(
        self, conn: Connection, state: dict[str, dict[int, Row]], out: list[Attributes]
    ) -> int:
        table = self.rng.choice(self.tables)
        t, rows = TABLES[table], state[table]
        op = self.rng.choice(("insert", "update", "update", "delete")) if rows else "insert"
        old: Row | None = None
        if op == "insert":
            row = _new_row(table, self.next_id, self.rng)
            self.next_id += 1
            conn.execute(t.insert().values(row))
            rows[row["id"]] = row
        elif op == "update":
            old = rows[self.rng.choice(sorted(rows))]
            fresh = _new_row(table, old["id"], self.rng)
            changed = {k: v for k, v in fresh.items() if k != "id" and self.rng.random() < 0.6}
            row = {**old, **changed}
            conn.execute(t.update().where(t.c.id == row["id"]).values(changed or {"id": row["id"]}))
            rows[row["id"]] = row
        else:
            row = rows.pop(self.rng.choice(sorted(rows)))
            conn.execute(t.delete().where(t.c.id == row["id"]))
        attributes = self.expect(table, op, row, old)
        if attributes is not None:
            out.append(attributes)
        return 1


class Received:
    """A subscriber's callback keeping each publication's attributes, in order."""

    def __init__(self) -> None:
        self.got: list[Attributes] = []

    def __call__(self, delivery: Delivery) -> None:
        assert isinstance(delivery, Notify)
        self.got.append(dict(delivery.publication.attributes))


# -- exactly once, in commit order ---------------------------------------------------------------


async def test_committed_changes_are_published_once_in_commit_order_and_rolled_back_ones_never(
    engine: Engine, broker: str, request: pytest.FixtureRequest
) -> None:
    tag = _tag(request)
    outbox = TransactionalOutbox(engine)
    rules = Rules(outbox)
    account, item = f"Account{tag}", f"Item{tag}"
    rules.add(Rule("accounts_changed", table="accounts", class_name=account, old_prefix="old_"))
    rules.add(
        Rule(
            "b_items",
            table="items",
            class_name=item,
            columns=("id", "qty"),
            where="[qty,>,5],[name,str-prefix,'b']",  # a column it does not publish
        )
    )

    def expect(table: str, op: str, row: Row, old: Row | None) -> Attributes | None:
        if table == "items":
            if not (row["qty"] > 5 and row["name"].startswith("b")):
                return None
            return {"class": item, "table": "items", "op": op, "id": row["id"], "qty": row["qty"]}
        attributes = {"class": account, "table": "accounts", "op": op, **_published(row)}
        if old is not None:
            attributes |= {f"old_{k}": v for k, v in _published(old).items()}
        return attributes

    log: list[Attributes] = []
    lock = threading.Lock()
    concurrent = engine.dialect.name == "postgresql"  # SQLite has one writer at a time
    writers = [
        Writer(engine, ("accounts", "items"), expect, log, lock, seed)
        for seed in range(1, 5 if concurrent else 2)
    ]
    started = time.monotonic()
    threads = [threading.Thread(target=w.run, args=(1000 // len(writers), 0.002)) for w in writers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert time.monotonic() - started < 20
    assert len(log) > 300
    # The outbox holds them in commit order, across the two tables.
    assert [dict(p.attributes) for _, p in outbox.pending(10_000)] == log

    by_class: dict[str, Received] = {account: Received(), item: Received()}
    async with Client(broker, f"audit-{tag}") as auditor:
        for number, (name, received) in enumerate(by_class.items()):
            await auditor.subscribe(f"[class,eq,'{name}']", received, durable=f"changes{number}")
        relay = OutboxRelay(
            outbox, broker, f"relay-{tag}", advertisements=rules.advertisements(), interval=0.1
        )
        async with relay:
            await eventually(lambda: outbox.count() == 0, timeout=20)
            wanted = {name: [a for a in log if a["class"] == name] for name in by_class}
            await eventually(
                lambda: all(len(by_class[n].got) >= len(wanted[n]) for n in by_class), timeout=20
            )
            await asyncio.sleep(0.3)
    for name, received in by_class.items():
        assert received.got == wanted[name], name
    assert outbox.refused() == []


def test_rows_appear_in_the_outbox_in_the_order_of_their_numbers(engine: Engine) -> None:
    """Commits that race (no lock of the test's own here): a reader never finds a row behind
    one it has already seen, so the relay never publishes a change before one committed
    earlier."""
    if engine.dialect.name != "postgresql":
        pytest.skip("SQLite has one writing transaction at a time: commits cannot race")
    outbox = TransactionalOutbox(engine)
    Rules(outbox).add(Rule("stock", table="items", class_name="Item"))
    behind: list[int] = []
    writing = threading.Event()
    writing.set()

    def watch() -> None:
        known: set[int] = set()
        query = sqlalchemy.select(outbox.table.c.seq)
        with engine.connect() as conn:
            while writing.is_set():
                rows = {seq for (seq,) in conn.execute(query)}
                conn.rollback()  # a new snapshot each time
                behind.extend(seq for seq in rows - known if seq < max(known, default=0))
                known |= rows

    def write(worker: int) -> None:
        with engine.connect() as conn:
            for n in range(250):
                with conn.begin():
                    conn.execute(items.insert().values(id=worker * 1000 + n, name="x", qty=n))

    watcher = threading.Thread(target=watch)
    watcher.start()
    writers = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join()
    writing.clear()
    watcher.join()
    assert behind == []
    assert outbox.count() == 1000


async def test_a_relay_killed_mid_stream_loses_nothing_and_doubles_nothing(
    engine: Engine, database: str, broker: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The relay (a process of its own) is killed with SIGKILL twice while it publishes, once
    while the application goes on changing the table; each is started again."""
    tag = _tag(request)
    outbox = TransactionalOutbox(engine)
    rules = Rules(outbox)
    stock = f"Stock{tag}"
    rule = rules.add(Rule("stock", table="items", class_name=stock, old_prefix="was_"))

    def expect(table: str, op: str, row: Row, old: Row | None) -> Attributes:
        attributes = {"class": stock, "table": "items", "op": op, **_published(row)}
        return attributes | {f"was_{k}": v for k, v in _published(old or {}).items()}

    log: list[Attributes] = []
    writer = Writer(engine, ("items",), expect, log, threading.Lock(), seed=7)
    writer.run(200)
    first = len(log)
    received = Received()
    relays: list[subprocess.Popen[bytes]] = []

    def relay() -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "tests.rules_relay_app", database, broker]
        command += [f"relay-{tag}", "5", rule.advertisement()]
        with open(tmp_path / "relay.log", "ab") as log_file:
            relays.append(subprocess.Popen(command, cwd=ROOT, stdout=log_file, stderr=log_file))
        return relays[-1]

    async def kill_at(process: subprocess.Popen[bytes], count: int) -> None:
        deadline = time.monotonic() + 20
        while len(received.got) < count:
            assert time.monotonic() < deadline, (tmp_path / "relay.log").read_text()
            await asyncio.sleep(0.002)
        process.send_signal(signal.SIGKILL)
        process.wait()

    try:
        async with Client(broker, f"stock-{tag}") as client:
            await client.subscribe(f"[class,eq,'{stock}']", received, durable="stock")
            await kill_at(relay(), first // 3)
            assert len(received.got) < first, "the relay was not killed in the middle"
            writer.run(100)  # the application goes on meanwhile
            await kill_at(relay(), len(log) * 2 // 3)
            assert len(received.got) < len(log), "the relay was not killed in the middle"
            relay()
            await eventually(lambda: len(received.got) >= len(log), timeout=20)
            await eventually(lambda: outbox.count() == 0)
            await asyncio.sleep(0.5)
    finally:
        for process in relays:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait()
    assert [a.get("id") for a in received.got] == [a.get("id") for a in log]
    assert received.got == log


# -- what a rule publishes -----------------------------------------------------------------------


CONDITIONS = {
    "lt": "[n,<,5]",
    "int_above_half": "[n,>,2.5]",
    "int_not": "[n,<>,3]",
    "float_le": "[x,<=,2.5]",
    "float_eq_int": "[x,=,3]",
    "float_above_tenth": "[x,>,0.1]",
    "present": "[x,isPresent]",
    "str_eq": "[s,eq,'b']",
    "str_neq": "[s,neq,'b']",
    "str_lt": "[s,str-lt,'b']",
    "prefix": "[s,str-prefix,'a']",
    "postfix": "[s,str-postfix,'c']",
    "contains_percent": "[s,str-contains,'%']",
    "contains_underscore": "[s,str-contains,'_']",
    "quote": "[s,eq,'it\\'s']",
    "bool": "[ok,eq,true]",
    "after": "[d,after,'2026-06-01']",
    "crossing": "[old.n,<,5],[n,>=,5]",
    "deleted": "[op,eq,'delete']",
    "both": "[n,>=,2],[s,str-prefix,'b'],[op,neq,'insert']",
}

conditions_table = Table(
    "measures",
    MetaData(),
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("n", Integer),
    Column("x", Float),
    Column("s", Text),
    Column("ok", Boolean),
    Column("d", Date),
)


def _measure(rng: random.Random, ident: int) -> Row:
    return {
        "id": ident,
        "n": rng.choice((None, *range(10))),
        "x": rng.choice(
            (None, 0.1, 2.5, 3.0, -1.0, 0.30000000000000004, 1e300, 2.4999999999999996)
        ),
        "s": rng.choice((None, "", "a", "b", "B", "ab", "a%c", "a_c", "abc", "é", "bé", "it's")),
        "ok": rng.choice((None, True, False)),
        "d": rng.choice((None, date(2026, 6, 1), date(2026, 6, 2), date(2025, 12, 31))),
    }


def _holds(where: str, op: str, row: Row, old: Row | None) -> bool:
    """The condition as the language's matcher reads it, over the row's published values."""
    values: dict[str, Value] = {"op": op, **_published(row)}
    values |= {f"old.{k}": v for k, v in _published(old or {}).items()}
    return all(
        p.attribute in values
        and (p.op is Op.IS_PRESENT or evaluate(p.op, p.value, values[p.attribute]))  # type: ignore[arg-type]
        for p in parse_predicates(where)
    )


def test_a_condition_selects_the_changes_the_matcher_selects(engine: Engine) -> None:
    conditions_table.create(engine)
    rules = Rules(TransactionalOutbox(engine))
    for name, where in CONDITIONS.items():
        rules.add(Rule(name, table="measures", class_name="Measure", columns=("id",), where=where))
    rng = random.Random(3)
    expected: dict[str, list[tuple[str, int]]] = {name: [] for name in CONDITIONS}
    rows: dict[int, Row] = {}
    t = conditions_table
    with engine.begin() as conn:
        for ident in range(150):
            change: tuple[str, Row, Row | None]
            if ident < 60 or rng.random() < 0.3:
                rows[ident] = _measure(rng, ident)
                conn.execute(t.insert().values(rows[ident]))
                change = ("insert", rows[ident], None)
            elif rng.random() < 0.7:
                old = rows[rng.choice(sorted(rows))]
                rows[old["id"]] = _measure(rng, old["id"])
                conn.execute(t.update().where(t.c.id == old["id"]).values(rows[old["id"]]))
                change = ("update", rows[old["id"]], old)
            else:
                gone = rows.pop(rng.choice(sorted(rows)))
                conn.execute(t.delete().where(t.c.id == gone["id"]))
                change = ("delete", gone, gone)
            for name, where in CONDITIONS.items():
                if _holds(where, *change):
                    expected[name].append((change[0], change[1]["id"]))
    got: dict[str, list[tuple[str, int]]] = {name: [] for name in CONDITIONS}
    for _, pub in rules.outbox.pending(100_000):
        got[pub.id.split("-")[0]].append((str(pub.attributes["op"]), int(pub.attributes["id"])))
    assert all(expected.values())  # each condition selects some changes, and leaves some
    assert all(len(e) < 150 for e in expected.values())
    assert got == expected


def test_column_types_become_attribute_types(engine: Engine) -> None:
    postgres = engine.dialect.name == "postgresql"
    kinds = Table(
        "kinds",
        MetaData(),
        Column("id", Integer, primary_key=True, autoincrement=False),
        Column("big", sqlalchemy.BigInteger),
        Column("f", Float),
        Column("money", Numeric(10, 2)),
        Column("note", String(20)),
        Column("ok", Boolean),
        Column("day", Date),
        Column("at", DateTime),
        Column("at_utc", DateTime(timezone=True)),
    )
    kinds.create(engine)
    outbox = TransactionalOutbox(engine)
    Rules(outbox).add(Rule("kinds", table="kinds", class_name="Kinds", on=("insert",)))
    full = {
        "id": 1,
        "big": 2**62 + 1,
        "f": 120.0,
        "money": 12.5,
        "note": 'say "hi"\n',
        "ok": False,
        "day": date(2026, 12, 1),
        "at": datetime(2026, 12, 1, 8, 30, 15, 500_000),
        "at_utc": datetime.fromisoformat("2026-12-01T10:30:15+02:00"),
    }
    with engine.begin() as conn:
        conn.execute(kinds.insert().values(full))
        conn.execute(kinds.insert().values(id=2))  # every other column NULL
        if postgres:  # a float no attribute holds is left out, as NULL is
            conn.execute(kinds.insert().values(id=3, f=float("nan"), day=date.max))
    published = [dict(p.attributes) for _, p in outbox.pending(10)]
    head: dict[str, Value] = {"class": "Kinds", "table": "kinds", "op": "insert"}
    values: dict[str, Value] = {
        "id": 1,
        "big": 2**62 + 1,
        "f": 120.0,
        "money": 12.5,
        "note": 'say "hi"\n',
        "ok": False,
        "day": "2026-12-01",
        "at": "2026-12-01T08:30:15Z",  # to the second
        # SQLite keeps no time zone: SQLAlchemy writes the time as given, read as UTC.
        "at_utc": "2026-12-01T08:30:15Z" if postgres else "2026-12-01T10:30:15Z",
    }
    wanted: list[dict[str, Value]] = [head | values, head | {"id": 2}]
    if postgres:
        wanted.append(head | {"id": 3, "day": "9999-12-31"})
    assert published == wanted
    assert [type(v) for v in published[0].values()] == [type(v) for v in wanted[0].values()]


def test_a_change_no_publication_can_hold_is_refused_and_holds_back_nothing(
    engine: Engine,
) -> None:
    outbox = TransactionalOutbox(engine)
    Rules(outbox).add(Rule("owners", table="accounts", class_name="Account"))
    with engine.begin() as conn:
        conn.execute(accounts.insert().values(id=1, owner="x" * (1 << 20) + "y"))
        conn.execute(accounts.insert().values(id=2, owner="fine"))
    ((_, pub),) = outbox.pending(10)
    assert pub.attributes["id"] == 2
    ((ident, publication, why),) = outbox.refused()
    assert ident.startswith("owners-") and publication is None
    assert "not a valid publication" in why and "1,048,576 bytes" in why
    assert outbox.count() == 1


# -- schema changes, bad input -------------------------------------------------------------------


def test_schema_changes_refused_followed_or_made_with_the_rule_in_one_transaction(
    engine: Engine,
) -> None:
    outbox = TransactionalOutbox(engine)
    rules = Rules(outbox)
    rules.add(Rule("stock", table="items", class_name="Item", columns=("id", "qty")))

    def published() -> list[Attributes]:
        return [dict(p.attributes) for _, p in outbox.pending(100)]

    def insert(conn: Connection, ident: int, column: str = "qty") -> None:
        conn.exec_driver_sql(f"INSERT INTO {table} (id, {column}) VALUES ({ident}, {ident})")

    table = "items"
    with pytest.raises(sqlalchemy.exc.DBAPIError), engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE items DROP COLUMN qty")  # published: refused
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE items DROP COLUMN name")  # not published: dropped
        insert(conn, 1)
    with engine.begin() as conn:  # the rule goes on under the table's new name
        conn.exec_driver_sql("ALTER TABLE items RENAME TO stock")
        table = "stock"
        insert(conn, 2)
    assert rules.problems() == {
        "stock": "its table 'items' is now named 'stock'; its publications still say "
        "[table,'items']"
    }
    # A published column renamed, and a change made: rolled back.
    if engine.dialect.name == "postgresql":  # the rule's function names it: the commit fails
        failed = pytest.raises(sqlalchemy.exc.DBAPIError, match='has no field "qty"')
        with failed, engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE stock RENAME COLUMN qty TO amount")
            insert(conn, 3, "amount")
    else:  # SQLite renames it in the triggers: the attribute keeps its name
        with contextlib.suppress(LookupError), engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM stock WHERE id < 0")  # Python's sqlite3 begins
            conn.exec_driver_sql("ALTER TABLE stock RENAME COLUMN qty TO amount")
            insert(conn, 3, "amount")
            body = conn.execute(sqlalchemy.select(outbox.table.c.body)).all()[-1][0]
            assert '"qty":3' in body
            raise LookupError("rolled back")
    with engine.begin() as conn:  # a migration: the rule removed and added again around it
        rules.remove("stock", conn)
        conn.exec_driver_sql("ALTER TABLE stock RENAME COLUMN qty TO amount")
        rules.add(Rule("stock", table="stock", class_name="Item", columns=("id", "amount")), conn)
        insert(conn, 4, "amount")
    item = {"class": "Item", "op": "insert"}
    assert published() == [
        item | {"table": "items", "id": 1, "qty": 1},
        item | {"table": "items", "id": 2, "qty": 2},
        item | {"table": "stock", "id": 4, "amount": 4},
    ]
    rules.remove("stock")
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE stock DROP COLUMN amount")
    # A table dropped takes its rules' triggers with it: the rule says so.
    rules.add(Rule("accounts_changed", table="accounts", class_name="Account"))
    assert rules.problems() == {}
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE accounts")
    assert rules.problems() == {
        "accounts_changed": "its table 'accounts' is gone: it publishes nothing"
    }
    rules.remove("accounts_changed")
    assert rules.installed() == []


def test_bad_rules_are_refused_with_clear_errors_and_leave_nothing(
    engine: Engine, database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rules = Rules(TransactionalOutbox(engine))
    rules.add(Rule("good", table="items", class_name="Item", columns=("id",)))
    injection = 'x"; DROP TABLE items; --'
    refused = [
        (Rule("x", table="nope", class_name="C"), "no table 'nope'"),
        (Rule("x", table=injection, class_name="C"), f"no table {injection!r}"),
        (Rule("x", table="items", class_name="C", columns=("id", "colour")), "no column 'colour'"),
        (Rule("x", table="items", class_name="C", columns=(injection,)), "has no column"),
        (Rule("x", table="items", class_name="C", where="[colour,eq,'red']"), "no column 'colour'"),
        (Rule("x", table="items", class_name="C", where="[qty,>,"), "does not parse"),
        (Rule("x", table="items", class_name="C", where="qty > 1"), "does not parse"),
        (Rule("x", table="items", class_name="C", where="[qty,eq,$X]"), "no variables"),
        (
            Rule("x", table="items", class_name="C", where="[name,>,5]"),
            "'name' is a string value; operator > takes a number",
        ),
        (
            Rule("x", table="items", class_name="C", where="[qty,str-prefix,'1']"),
            "'qty' is a integer value; operator str-prefix takes a string",
        ),
        (Rule("good", table="items", class_name="C"), "a rule named 'good' exists already"),
        (Rule("Good", table="items", class_name="C"), "invalid rule name 'Good'"),
        (Rule(injection, table="items", class_name="C"), "invalid rule name"),
        (Rule("x", table="items", class_name="C", on=("upsert",)), "on 'upsert'"),
        (Rule("x", table="items", class_name="C", on=("insert",), old_prefix="o_"), "no update"),
        (Rule("x", table="items", class_name=""), "the class is a string"),
        (Rule("x", table="odd", class_name="C"), "column(s) 'data' ("),
        (Rule("x", table="odd", class_name="C", columns=("data",)), "no attribute type holds"),
        (Rule("x", table="odd", class_name="C", columns=("id", "op")), "'op' would be published"),
        (Rule("x", table="items", class_name="C", old_prefix=""), "'id' would be published twice"),
        (Rule("x", table="padres_outbox", class_name="C"), "the outbox's own"),
    ]
    for rule, message in refused:
        with pytest.raises(RuleError, match=re.escape(message)):
            rules.add(rule)
            pytest.fail(f"{rule} was added")
    with pytest.raises(RuleError, match="no rule named 'x'"):
        rules.remove("x")
    if engine.dialect.name == "sqlite":
        elsewhere = Rules(TransactionalOutbox(engine, schema="aux"))
        with pytest.raises(RuleError, match="in the main database"):
            elsewhere.add(Rule("x", table="items", class_name="C"))
    assert [rule.name for rule in rules.installed()] == ["good"]
    sql = trigger_sql(engine.dialect)
    assert sql is not None
    with engine.connect() as conn:
        triggers = sql.triggers(conn, _schema(conn))
        assert sqlalchemy.inspect(conn).has_table("items")
    assert triggers == {trigger_name("good", op): "items" for op in ("insert", "update", "delete")}
    # The command line says the same, and fails.
    assert (
        main(["db", "rule", "add", "x", "--url", database, "--table", "nope", "--class", "C"]) == 1
    )
    assert "padres db: no table 'nope'" in capsys.readouterr().err


def _schema(conn: Connection) -> str | None:
    if conn.dialect.name != "postgresql":
        return None
    return str(conn.execute(sqlalchemy.text("SELECT current_schema()")).scalar_one())


def test_the_command_line_adds_lists_and_removes_rules(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    add = ["db", "rule", "add", "big_stock", "--url", database, "--table", "items"]
    add += ["--class", "Item", "--on", "insert,update", "--columns", "id,qty"]
    assert main([*add, "--where", "[qty,>,5]", "--old-prefix", "old_"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "rule big_stock: insert, update on items where [qty,>,5] publish class 'Item' "
        "with id, qty, old values as old_*",
        "advertise: [class,eq,'Item'],[table,eq,'items'],[op,isPresent],[id,isPresent],"
        "[qty,isPresent],[old_id,isPresent],[old_qty,isPresent]",
    ]
    assert main(["db", "rule", "list", "--url", database]) == 0
    listed = capsys.readouterr()
    assert listed.out.splitlines()[0].startswith("big_stock: insert, update on items")
    assert listed.err == "1 rule\n"
    assert main(["db", "rule", "remove", "big_stock", "--url", database]) == 0
    assert main(["db", "rule", "list", "--url", database, "--json"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "[]"
    assert main(["db", "rule", "remove", "big_stock", "--url", database]) == 1
    assert "no rule named 'big_stock'" in capsys.readouterr().err
