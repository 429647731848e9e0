"""Internal subscriptions of a database node (``padres db --execute``, ``historic.internal``),
with a real broker process and real node processes, on SQLite and on PostgreSQL (when a server
is reachable at 127.0.0.1:5432): statements run for the publications that match them, in
priority order; a failing statement leaves nothing behind and sends the publication to its
subscription's exception queue; a node killed (SIGKILL) in the middle of a stream and started
again applies each publication exactly once."""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy
from sqlalchemy.exc import OperationalError

from historic.internal import InternalSubscription, parse_internal, transient
from padres.cli import main
from padres.client.connection import Client
from padres.errors import InvalidMessage, ParseError
from padres.language.parser import parse_filter
from padres.model.protocol import Scope
from padres.testing.processes import BrokerProcess, DatabaseProcess
from tests.postgres import database_url, drop_schema
from tests.support import eventually, journalled_broker

pytestmark = pytest.mark.anyio

app = sqlalchemy.MetaData()
steps = sqlalchemy.Table(
    "steps",
    app,
    sqlalchemy.Column("row", sqlalchemy.Integer, primary_key=True, autoincrement=True),
    sqlalchemy.Column(
        "n", sqlalchemy.Integer, sqlalchemy.CheckConstraint("n >= 0"), nullable=False
    ),
    sqlalchemy.Column("sub", sqlalchemy.String(16), nullable=False),
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with journalled_broker(tmp_path_factory) as proc:
        yield proc


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The node's database, with the table its statements write to: its URL."""
    schema = f"padres_internal_{os.getpid()}"
    url = database_url(request.param, schema, tmp_path / "node.sqlite")
    engine = sqlalchemy.create_engine(url)
    app.create_all(engine)
    if request.param == "postgresql":
        with engine.begin() as conn:  # a stored function that writes two rows
            conn.execute(
                sqlalchemy.text(
                    "CREATE FUNCTION padres_big(m integer, k text) RETURNS void AS $$ "
                    "INSERT INTO steps (n, sub) VALUES ($1, 'big'), ($1 + 1000, $2) "
                    "$$ LANGUAGE sql"
                )
            )
    engine.dispose()
    yield url
    if request.param == "postgresql":
        drop_schema(schema)


def _kind(url: str) -> str:
    return url.split(":")[0].split("+")[0]


def _rows(url: str) -> list[tuple[int, str]]:
    """What the statements wrote, in the order they wrote it."""
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as conn:
            query = sqlalchemy.select(steps.c.n, steps.c.sub).order_by(steps.c.row)
            return [(int(n), str(sub)) for n, sub in conn.execute(query)]
    finally:
        engine.dispose()


def _subscriptions(kind: str, cls: str) -> list[str]:
    """Five internal subscriptions to ``cls``, given in this order, with these priorities:
    ``plain`` 0, ``checked`` 5 (two rows, the second one refused when ``check`` is
    negative), ``noted`` 5 (a parameter only some publications have), ``big`` 9 (for n > 6; a
    stored function on PostgreSQL), ``late`` -3."""
    big = (
        "EXECUTE FUNCTION padres_big(n, tag)"
        if kind == "postgresql"
        else "EXECUTE INSERT INTO steps (n, sub) VALUES (:n, 'big'), (:n + 1000, :tag)"
    )
    on = f"ON [class,eq,'{cls}']"
    return [
        f"plain {on} EXECUTE INSERT INTO steps (n, sub) VALUES (:n, 'plain')",
        f"checked {on} PRIORITY 5 EXECUTE "
        "INSERT INTO steps (n, sub) VALUES (:n, 'checked'), (:check, 'checked')",
        f"noted {on} priority 5 execute INSERT INTO steps (n, sub) VALUES (:n, :note)",
        f"big {on},[n,>,6] PRIORITY 9 {big}",
        f"late {on} PRIORITY -3 EXECUTE INSERT INTO steps (n, sub) VALUES (:n, 'late')",
    ]


def _publication(cls: str, n: int) -> dict[str, object]:
    attributes: dict[str, object] = {"class": cls, "n": n, "tag": "big+", "check": n + 1000}
    if n % 4 == 3:
        attributes["check"] = -1
    if n % 2 == 0:
        attributes["note"] = "noted"
    return attributes


def _expected(total: int) -> list[tuple[int, str]]:
    """The reference: per publication, the rows of each subscription in priority order."""
    rows: list[tuple[int, str]] = []
    for n in range(1, total + 1):
        if n > 6:
            rows += [(n, "big"), (n + 1000, "big+")]
        if n % 4 != 3:
            rows += [(n, "checked"), (n + 1000, "checked")]
        if n % 2 == 0:
            rows.append((n, "noted"))
        rows += [(n, "plain"), (n, "late")]
    return rows


async def test_statements_run_in_priority_order_and_failures_leave_nothing_behind(
    database: str, broker: BrokerProcess, tmp_path: Path
) -> None:
    kind = _kind(database)
    cls, node, total = f"Order{kind}", f"N-{kind}", 12
    log = (tmp_path / "node.log").open("wb")
    db = DatabaseProcess(node, broker.url, database, executes=_subscriptions(kind, cls), log=log)
    try:
        await asyncio.to_thread(db.start)
        async with Client(broker.url, f"shop-{kind}") as shop:
            await shop.advertise(f"[class,eq,'{cls}']")
            for n in range(1, total + 1):
                await shop.publish(_publication(cls, n), guaranteed=True)
            await shop.flush()
            expected = _expected(total)
            await eventually(lambda: len(_rows(database)) >= len(expected))

            async def queued(name: str, count: int) -> bool:
                report = await shop.exceptions(name, client=node)
                return len(report.entries) >= count

            await eventually(lambda: queued("checked", 3))
            await eventually(lambda: queued("noted", 6))
            assert _rows(database) == expected

            checked = (await shop.exceptions("checked", client=node)).entries
            assert [e.publication.attributes["n"] for e in checked] == [3, 7, 11]
            constraint = "CHECK constraint failed" if kind == "sqlite" else "check constraint"
            for entry in checked:
                assert entry.error.startswith("historic.errors.StatementFailed: ")
                assert "internal subscription 'checked'" in entry.error
                assert constraint in entry.error and entry.attempts == 1
            noted = (await shop.exceptions("noted", client=node)).entries
            assert [e.publication.attributes["n"] for e in noted] == [1, 3, 5, 7, 9, 11]
            assert "has no attribute 'note' for the statement's parameter :note" in noted[0].error
            for name in ("plain", "big", "late"):
                assert not (await shop.exceptions(name, client=node)).entries

            # started again without 'late': it ends at the broker, the others go on
            db.executes = [text for text in db.executes if not text.startswith("late")]
            await asyncio.to_thread(db.stop)
            await shop.publish(_publication(cls, 13), guaranteed=True)
            await shop.flush()
            await asyncio.to_thread(db.start)
            await eventually(lambda: len(_rows(database)) >= len(expected) + 3)
            await shop.publish(_publication(cls, 14), guaranteed=True)
            await shop.flush()
            more = [(13, "big"), (1013, "big+"), (13, "checked"), (1013, "checked"), (13, "plain")]
            more += [(14, "big"), (1014, "big+"), (14, "checked"), (1014, "checked")]
            more += [(14, "noted"), (14, "plain")]
            await eventually(lambda: len(_rows(database)) >= len(expected) + len(more))
            assert _rows(database) == expected + more
        engine = sqlalchemy.create_engine(database)
        with engine.connect() as conn:
            consumers = conn.execute(sqlalchemy.text("SELECT subscription FROM padres_inbox"))
            assert sorted(name for (name,) in consumers) == ["big", "checked", "noted", "plain"]
        engine.dispose()
    finally:
        db.stop()
        log.close()


async def test_a_node_killed_in_the_middle_of_a_stream_applies_each_publication_once(
    database: str, broker: BrokerProcess
) -> None:
    """Guaranteed publications stream in while the node, running two internal subscriptions,
    is killed (SIGKILL) at random moments and started again: in the end each publication
    was applied exactly once by each, each in publication order, the higher priority first.
    ``PADRES_TEST_KILLS``: how many times (3 by default); ``PADRES_TEST_SEED``: when."""
    kind = _kind(database)
    kills = int(os.environ.get("PADRES_TEST_KILLS", "3"))
    rng = random.Random(int(os.environ.get("PADRES_TEST_SEED", "11")))
    cls, total = f"Kill{kind}", 60 * (kills + 1)
    on = f"ON [class,eq,'{cls}']"
    db = DatabaseProcess(
        f"K-{kind}",
        broker.url,
        database,
        executes=[
            f"second {on} EXECUTE INSERT INTO steps (n, sub) VALUES (:n, 'second')",
            f"first {on} PRIORITY 1 EXECUTE INSERT INTO steps (n, sub) VALUES (:n, 'first')",
        ],
    )

    async def publish() -> None:
        async with Client(broker.url, f"stream-{kind}", reconnect=True) as shop:
            await shop.advertise(f"[class,eq,'{cls}'],[n,isPresent,0]")
            for n in range(1, total + 1):
                await shop.publish({"class": cls, "n": n}, guaranteed=True)
                await asyncio.sleep(0.02)
            await shop.flush(60)

    try:
        await asyncio.to_thread(db.start)
        publishing = asyncio.create_task(publish())
        applied: list[int] = []
        for _ in range(kills):
            await asyncio.sleep(rng.uniform(0.3, 1.2))
            db.kill()
            applied.append(len(_rows(database)))
            await asyncio.to_thread(db.start)
        await publishing
        await eventually(lambda: len(_rows(database)) >= 2 * total, timeout=60)
        await asyncio.sleep(0.5)  # anything applied twice would show now
        rows = _rows(database)
    finally:
        db.stop()
    assert 0 < applied[0] < 2 * total, applied  # killed mid-stream
    assert Counter(rows) == Counter(
        (n, sub) for n in range(1, total + 1) for sub in ("first", "second")
    )
    for sub in ("first", "second"):
        assert [n for n, s in rows if s == sub] == list(range(1, total + 1))
    where = {row: i for i, row in enumerate(rows)}
    assert all(where[n, "first"] < where[n, "second"] for n in range(1, total + 1))


async def test_a_database_that_drops_the_node_is_waited_for_not_blamed(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """PostgreSQL ends the node's sessions again and again (``pg_terminate_backend``) while
    publications stream in: each lost transaction is tried again, none goes to the exception
    queue, and each publication is applied once."""
    schema = f"padres_internal_drop_{os.getpid()}"
    url = database_url("postgresql", schema, tmp_path / "unused.sqlite")
    label = f"padres-node-{os.getpid()}"
    node_url = f"{url}&application_name={label}"
    engine = sqlalchemy.create_engine(url)
    app.create_all(engine)
    log_path = tmp_path / "node.log"
    log = log_path.open("wb")
    on = "ON [class,eq,'Dropped']"
    db = DatabaseProcess(
        "D-postgresql",
        broker.url,
        node_url,
        executes=[f"kept {on} EXECUTE INSERT INTO steps (n, sub) VALUES (:n, 'kept')"],
        log=log,
    )
    terminate = sqlalchemy.text(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = :a"
    )
    total, ended = 80, 0
    try:
        await asyncio.to_thread(db.start)
        async with Client(broker.url, "dropper") as shop:
            await shop.advertise("[class,eq,'Dropped'],[n,isPresent,0]")
            for n in range(1, total + 1):
                await shop.publish({"class": "Dropped", "n": n}, guaranteed=True)
                if n % 10 == 0:
                    with engine.begin() as conn:
                        ended += int(conn.execute(terminate, {"a": label}).scalar_one())
                await asyncio.sleep(0.02)
            await shop.flush()
            await eventually(lambda: len(_rows(url)) >= total, timeout=30)
            assert not (await shop.exceptions("kept", client="D-postgresql")).entries
        assert _rows(url) == [(n, "kept") for n in range(1, total + 1)]
    finally:
        db.stop()
        log.close()
        engine.dispose()
        drop_schema(schema)
    assert ended >= 3, ended  # sessions were ended under the node
    assert "trying again" in log_path.read_text()


def test_the_text_form_of_an_internal_subscription() -> None:
    sub = parse_internal(
        "  orders on [class,eq,'Order'],[note,eq,'say EXECUTE here'] Priority -4 SCOPE Local "
        "execute INSERT INTO t VALUES (:item, 'PRIORITY 9')"
    )
    assert sub == InternalSubscription(
        "orders",
        parse_filter("[class,eq,'Order'],[note,eq,'say EXECUTE here']"),
        "INSERT INTO t VALUES (:item, 'PRIORITY 9')",
        -4,
        Scope.LOCAL,
    )
    assert parse_internal(str(sub)) == sub
    called = parse_internal("f ON [class,eq,'T'] EXECUTE FUNCTION s.audit( item , price )")
    assert called.statement == "SELECT s.audit(:item, :price)" and called.priority == 0
    bare = parse_internal("g ON [class,eq,'T'] EXECUTE function tick()")
    assert bare.statement == "SELECT tick()"

    refused = [
        ("orders [class,eq,'T'] EXECUTE x", "expected NAME ON FILTER", 1),
        ("orders ON [class,eq,'T'],[n,>>,1] EXECUTE x", "operator", 30),
        ("orders ON [class,eq,'T'] LATER x", "expected PRIORITY N, SCOPE", 26),
        ("orders ON [class,eq,'T'] PRIORITY high EXECUTE x", "whole number", 35),
        ("orders ON [class,eq,'T'] PRIORITY 2147483648 EXECUTE x", "out of range", 35),
        ("orders ON [class,eq,'T'] SCOPE near EXECUTE x", "scope 'near' is not one of", 32),
        ("orders ON [class,eq,'T'] PRIORITY", "PRIORITY needs a value", 34),
        ("f ON [class,eq,'T'] EXECUTE FUNCTION f(a, 'b')", "attribute names, not \"'b'\"", 29),
    ]
    for text, words, column in refused:
        with pytest.raises(ParseError) as caught:
            parse_internal(text)
        assert words in caught.value.reason and caught.value.column == column, caught.value
    for text, words in [
        ("store-1 ON [class,eq,'T'] EXECUTE x", "is the node's own"),
        ("control ON [class,eq,'T'] EXECUTE x", "is the node's own"),
        ("a,b ON [class,eq,'T'] EXECUTE x", "invalid internal subscription name"),
        ("empty ON [class,eq,'T'] EXECUTE  ", "has no statement"),
        ("past ON [class,eq,'T'],[time,>=,now-1h] EXECUTE x", "no time window"),
    ]:
        with pytest.raises(InvalidMessage, match=words):
            parse_internal(text)


def test_what_is_no_fault_of_a_statement() -> None:
    """Tried again for as long as it lasts: the database unreachable, locked or busy, or a
    transaction rolled back for a conflict; anything else is the statement's failure."""

    def wrapped(error: Exception) -> OperationalError:
        return OperationalError("INSERT ...", {}, error)

    assert transient(wrapped(sqlite3.OperationalError("database is locked")))
    assert transient(wrapped(psycopg.OperationalError("connection refused")))
    assert transient(wrapped(psycopg.errors.SerializationFailure("conflict")))
    assert transient(wrapped(psycopg.errors.AdminShutdown("terminating")))
    assert not transient(wrapped(sqlite3.OperationalError("no such table: steps")))
    assert not transient(wrapped(psycopg.errors.UndefinedTable("no steps")))
    assert not transient(wrapped(psycopg.errors.QueryCanceled("statement timeout")))
    assert not transient(ValueError("no"))
    try:  # a failure raised from a transient one is transient too
        try:
            raise wrapped(sqlite3.OperationalError("database is busy"))
        except OperationalError as exc:
            raise RuntimeError("could not record it") from exc
    except RuntimeError as exc:
        assert transient(exc)


def test_the_command_line_refuses_bad_internal_subscriptions(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Refused before the node connects anywhere (nothing listens on port 1)."""
    base = ["db", "--id", "X", "--broker", "ws://127.0.0.1:1"]
    a = "a ON [class,eq,'T'] EXECUTE y"
    twice = ["--execute", a, "--execute", a.replace("'T'", "'U'")]
    cases = [
        (["--execute", "x ON [class,eq,'T'] EXECUTE"], "has no statement"),
        (["--execute", "x [class,eq,'T'] EXECUTE y"], "--execute: line 1, column 1: expected"),
        (twice, "internal subscription 'a' is given twice"),
        (["--broker", "ws://1.2.3.4:5", "--execute", a], "one --broker"),
    ]  # fmt: skip
    for options, words in cases:
        assert main([*base, *options]) == 1
        assert words in capsys.readouterr().err
