"""The archive end to end with Spark: a load job, the catalog, pruned queries equal to an
unpruned scan and to the reference matcher, Spark's own evaluation of filters, bad inputs, and
a historic subscription answered through a broker from the archive and a database together.

One Spark session serves the whole module (each start costs seconds), on tiny data."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from historic.store import Store
from padres.cli import main
from padres.language.parser import parse_filter, parse_publication
from padres.matching.matcher import matches
from padres.matching.reference import ReferenceMatcher
from padres.matching.rete_matcher import ReteMatcher
from padres.model.codec import decode, encode
from padres.model.dates import date_value, timestamp_value
from padres.model.messages import Filter, Publication, Subscription
from rete.operators import Value
from spark.archive import Archive
from spark.errors import AlreadyLoaded, ArchiveError, InputError, JavaMissing, UnknownLoad
from spark.expression import expression
from spark.inputs import Bad, Format, Parsed, Period, Reading, parse_piece, pieces
from spark.load import load
from spark.query import spark_query
from spark.session import java
from tests.strategies import scaled
from tests.test_archive_plan import filters

try:
    java()
except JavaMissing as exc:
    pytest.skip(str(exc), allow_module_level=True)
pytest.importorskip("pyspark", reason="the archive needs pyspark: pip install 'padres[archive]'")
pytestmark = pytest.mark.timeout(600)  # JVMs start slowly on a busy machine

SAMPLE = Path(__file__).parent.parent / "padres" / "data" / "stockquotes-sample.txt"
BASE = datetime(2001, 1, 30, tzinfo=UTC)
POOL: list[Value] = [
    0, 1, -3, 7, 2**53, 2**53 + 1, 2**63 - 1, -(2**63),
    0.0, -0.0, 0.5, 7.0, -2.5, 9007199254740992.0, 1e300,
    "", "a", "ab", "b", "é", "😀", "a%_", "MSFT",
    True, False,
]  # fmt: skip


def _pubs(rng: random.Random, count: int, first: int) -> list[Publication]:
    out = []
    for i in range(first, first + count):
        attrs: dict[str, Value] = {"class": rng.choice(["C", "D"])}
        for name in rng.sample(["a", "b", "c"], rng.randint(0, 3)):
            attrs[name] = rng.choice(POOL)
        at = BASE + timedelta(hours=rng.randint(0, 24 * 60), microseconds=rng.randint(0, 9))
        out.append(Publication(f"p{i}", attrs, at, rng.choice(["x", "y"])))
    return out


READ = Reading(Format.JSON)


def _write(path: Path, pubs: list[Publication]) -> str:
    path.write_bytes(b"".join(encode(p) + b"\n" for p in pubs))
    return str(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Archive, list[Publication]]]:
    """An archive of two classes over three months, loaded twice (the second load adds files
    whose times overlap the first's, with a column the first did not have)."""
    tmp = tmp_path_factory.mktemp("archive")
    rng = random.Random(7)
    first, second = _pubs(rng, 240, 0), _pubs(rng, 60, 240)
    second.append(Publication("late", {"class": "C", "d": 4}, BASE + timedelta(days=3), "x"))
    root = tmp / "archive"
    json = Reading(Format.JSON, period=Period.MONTH)
    load([_write(tmp / "one.jsonl", first)], root, json)
    load([_write(tmp / "two.jsonl", second)], root, json)
    archive = Archive(root)
    yield archive, first + second
    archive.close()


def _key(p: Publication) -> tuple[datetime, str, str]:
    return (p.timestamp, p.publisher, p.id)


def _reference(flt: Filter, pubs: list[Publication]) -> list[Publication]:
    window = flt.window
    return sorted(
        (p for p in pubs if (window is None or p.timestamp in window) and matches(flt, p)),
        key=_key,
    )


def _ordered(found: list[Publication]) -> list[Publication]:
    times = [p.timestamp for p in found]
    assert times == sorted(times), "not in time order"
    return sorted(found, key=_key)


def test_the_load_writes_a_file_per_class_and_period_and_catalogs_it(
    data: tuple[Archive, list[Publication]],
) -> None:
    archive, pubs = data
    files = archive.files()
    assert sum(f.rows for f in files) == len(pubs)
    assert {(f.class_name, f.period) for f in files} == {
        (p.class_name, f"{p.timestamp:%Y-%m}") for p in pubs
    }
    for f in files:
        assert (archive.root / f.path).is_file()
        assert f.path.startswith(f"class={f.class_name}/period={f.period}/")
    late = [f for f in files if "d__int" in f.columns and f.columns["d__int"].nulls < f.rows]
    assert len(late) == 1 and late[0].columns["d__int"].low == 4
    held = {c.class_name: c.rows for c in archive.classes()}
    assert held == {c: sum(p.class_name == c for p in pubs) for c in ("C", "D")}


@settings(
    max_examples=scaled(150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.data())
def test_pruned_reads_equal_the_full_scan_and_the_reference(
    data: tuple[Archive, list[Publication]], draw: st.DataObject
) -> None:
    archive, pubs = data
    class_name = draw.draw(st.sampled_from(["C", "D"]))
    flt = draw.draw(filters([p for p in pubs if p.class_name == class_name], class_name))
    pruned = _ordered(archive.query(flt))
    full = _ordered(archive.full_scan(flt))
    assert pruned == full == _reference(flt, pubs)


@settings(
    max_examples=2,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.data())
def test_spark_evaluates_filters_as_the_reference_matcher(
    data: tuple[Archive, list[Publication]], draw: st.DataObject
) -> None:
    """Many filters in one Spark job: one boolean column each, over every file of a class."""
    from pyspark.sql import SparkSession

    archive, pubs = data
    spark = SparkSession.getActiveSession()
    assert spark is not None
    for class_name in ("C", "D"):
        mine = [p for p in pubs if p.class_name == class_name]
        flts = draw.draw(st.lists(filters(mine, class_name), min_size=40, max_size=40))
        frame = spark.read.option("mergeSchema", "true").parquet(
            *archive.paths(archive.files(class_name))
        )
        tests = [expression(f, frame.columns).alias(f"m{i}") for i, f in enumerate(flts)]
        rows = frame.select("_publisher", "_id", *tests).collect()
        for i, flt in enumerate(flts):
            got = sorted((r["_publisher"], r["_id"]) for r in rows if r[f"m{i}"])
            assert got == sorted((p.publisher, p.id) for p in _reference(flt, pubs)), flt


def test_a_spark_query_equals_the_reference_pruned_or_not(
    data: tuple[Archive, list[Publication]],
) -> None:
    archive, pubs = data
    flt = parse_filter("[class,eq,'C'],[a,>=,0],[time,>=,'2001-02-01'],[time,<,'2001-03-01']")
    pruned = spark_query(archive, flt)
    full = spark_query(archive, flt, prune=False)
    expected = _reference(flt, pubs)
    assert expected and pruned.publications == full.publications
    assert _ordered(pruned.publications) == expected
    assert pruned.files_read < full.files_read == len(archive.files("C"))


def _files_on_disk(root: Path) -> set[Path]:
    return {p for p in root.rglob("*.parquet") if "_staging" not in p.parts}


def test_a_missing_or_bad_input_leaves_the_archive_as_it_was(
    data: tuple[Archive, list[Publication]], tmp_path: Path
) -> None:
    archive, _ = data
    before = (_files_on_disk(archive.root), archive.files())
    json = Reading(Format.JSON)
    with pytest.raises(InputError, match=r"input .*nowhere\.jsonl does not exist"):
        load([str(tmp_path / "nowhere.jsonl")], archive.root, json)
    good = encode(Publication("ok", {"class": "C", "a": 1}, BASE, "x")).decode()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(f'{good}\n{good}\n{{"type": "publication"\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"1 bad line\(s\), nothing loaded: bad\.jsonl line 3"):
        load([str(bad)], archive.root, json)
    text = tmp_path / "quotes.txt"
    text.write_text("[class,'STOCK'],[date,'28-Dec-04']\n[class,'STOCK'],[date,'yesterday']\n")
    with pytest.raises(InputError, match=r"quotes\.txt line 2: time 'yesterday' of 'date'"):
        load([str(text)], archive.root, Reading(time_attribute="date", time_format="%d-%b-%y"))
    assert (_files_on_disk(archive.root), archive.files()) == before


def test_inputs_are_read_in_pieces_of_whole_lines_numbered_as_in_the_file(tmp_path: Path) -> None:
    """However small the pieces, each line is read once, numbered by its place in the file,
    and a line that is not UTF-8 is named by its number."""
    lines = [f"[class,'T'],[n,{i}],[time,'2026-01-0{1 + i % 9}']" for i in range(40)]
    path = tmp_path / "t.txt"
    path.write_bytes("\r\n".join(lines).encode() + b"\n\n# done\n\xff\xfe\n[class,'T'],[n,99]")
    reading = Reading()
    for size in (1, 7, 100, 1 << 20):
        cut = list(pieces(path, size))
        assert cut[0].start == 0 and cut[-1].end == path.stat().st_size
        assert all(a.end == b.start for a, b in pairwise(cut))
        parsed = [r for piece in cut for r in parse_piece(reading, piece)]
        good = [r for r in parsed if isinstance(r, Parsed)]
        assert [r.id for r in good] == [f"t.txt-{i + 1}" for i in range(40)], size
        assert [dict(r.values)["n"] for r in good] == list(range(40))
        assert [r for r in parsed if isinstance(r, Bad)] == [
            Bad("t.txt line 43", "not UTF-8: invalid start byte at byte 0"),
            Bad(
                "t.txt line 44",
                "no publication time: give the line a [time,'...'] or name an attribute",
            ),
        ]


def test_the_stock_quotes_answer_as_the_reference_matcher_finds(tmp_path: Path) -> None:
    reading = Reading(time_attribute="date", time_format="%d-%b-%y")
    report = load([str(SAMPLE)], tmp_path / "quotes", reading)
    assert report.rows == 1000
    archive = Archive(tmp_path / "quotes")
    content = "[class,eq,'STOCK'],[symbol,eq,'MSFT'],[close,>,28]"
    flt = parse_filter(f"{content},[time,>=,'2004-10-01'],[time,<,'2004-12-01']")
    matcher = ReferenceMatcher()
    matcher.add(Subscription("s", parse_filter(content)))
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    expected = set()
    for i, line in enumerate(lines):
        pub = parse_publication(line, id=f"{i}", timestamp=BASE)
        day = datetime.strptime(str(pub.attributes["date"]), "%d-%b-%y").replace(tzinfo=UTC)
        if flt.window is not None and day in flt.window and matcher.match(pub).subscriptions:
            expected.add(f"stockquotes-sample.txt-{i + 1}")
    plan = archive.plan(flt)
    assert [f.period for f in plan.read] == ["2004-10", "2004-11"]
    assert len(expected) > 5
    assert {p.id for p in archive.query(flt)} == expected
    archive.close()


def test_the_command_line_answers_a_query_and_names_a_missing_input(
    data: tuple[Archive, list[Publication]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive, pubs = data
    text = "[class,eq,'D'],[b,isPresent,''],[time,<,'2001-03-15']"
    args = ["archive", "query", text, "--archive", str(archive.root), "--local", "--json"]
    assert main(args) == 0
    out = capsys.readouterr()
    got = [decode(line) for line in out.out.splitlines()]
    assert _ordered(got) == _reference(parse_filter(text), pubs)  # type: ignore[arg-type]
    assert f"{len(got)} matches; read " in out.err
    assert main([*args[:-2], "--count"]) == 0  # small: read with pyarrow unless told otherwise
    assert capsys.readouterr().err.endswith(" files with pyarrow\n")
    missing = str(tmp_path / "nowhere.txt")
    assert main(["archive", "load", missing, "--archive", str(tmp_path / "new")]) == 1
    assert f"padres archive: input {missing} does not exist" in capsys.readouterr().err


def _rows(archive: Archive) -> int:
    return sum(f.rows for f in archive.files())


def test_a_second_load_is_refused_naming_the_first_unless_it_replaces_it(tmp_path: Path) -> None:
    """The same input again is refused before Spark starts (by its content); other inputs
    holding publications the archive has (by publisher and id) after they are parsed; with
    ``replace`` the new load takes the earlier one's place, whole."""
    root = tmp_path / "archive"
    pubs = _pubs(random.Random(11), 40, 0)
    first = load([_write(tmp_path / "in.jsonl", pubs)], root, READ)
    archive = Archive(root)
    try:
        with pytest.raises(
            AlreadyLoaded, match=r"holds this input already: .*in\.jsonl, by load"
        ) as e:
            load([str(tmp_path / "in.jsonl")], root, READ)
        assert e.value.loads == (first.load,) and first.load in str(e.value)
        again = [*pubs[30:], *_pubs(random.Random(12), 5, 100)]  # 10 of the first load's
        with pytest.raises(AlreadyLoaded, match=r"holds 10 of these publications already") as e:
            load([_write(tmp_path / "again.jsonl", again)], root, READ)
        assert (e.value.loads, e.value.publications) == ((first.load,), 10)
        assert _rows(archive) == 40 and {r.load for r in archive.loads()} == {first.load}
        (record,) = archive.loads()
        assert (record.rows, record.files) == (40, first.files)
        (given,) = record.inputs
        data = (tmp_path / "in.jsonl").read_bytes()
        assert (given.path, given.size) == (str(tmp_path / "in.jsonl"), len(data))
        assert given.sha256 == hashlib.sha256(data).hexdigest()
        old = _files_on_disk(root)

        second = load([str(tmp_path / "again.jsonl")], root, READ, replace=True)
        assert [r.load for r in second.replaced] == [first.load]
        assert [r.load for r in archive.loads()] == [second.load]
        assert _rows(archive) == 15 and not old & _files_on_disk(root)
        flt = parse_filter("[class,eq,'C'],[time,<,'2002-01-01']")
        assert _ordered(archive.query(flt)) == _reference(flt, again)
    finally:
        archive.close()


def test_a_removed_load_is_gone_from_queries_the_catalog_and_the_disk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "archive"
    kept, gone = _pubs(random.Random(13), 30, 0), _pubs(random.Random(14), 30, 30)
    load([_write(tmp_path / "kept.jsonl", kept)], root, READ)
    removed = load([_write(tmp_path / "gone.jsonl", gone)], root, READ)
    flt = parse_filter("[class,eq,'D'],[time,<,'2002-01-01']")
    archive = Archive(root)
    try:
        assert _ordered(archive.query(flt)) == _reference(flt, kept + gone)
        on_disk = _files_on_disk(root)
        assert main(["archive", "remove", removed.load, "--archive", str(root)]) == 0
        assert capsys.readouterr().out == (
            f"removed load {removed.load}: 30 rows in {removed.files} files\n"
        )
        assert _ordered(archive.query(flt)) == _reference(flt, kept)
        assert removed.load not in {r.load for r in archive.loads()} and _rows(archive) == 30
        assert on_disk - _files_on_disk(root) == {
            p for p in on_disk if p.name.startswith(removed.load)
        }
        assert main(["archive", "remove", removed.load, "--archive", str(root)]) == 1
        assert f"holds no load {removed.load} " in capsys.readouterr().err
        with pytest.raises(UnknownLoad, match="holds no load 'nope'"):
            archive.remove("nope")
    finally:
        archive.close()


def test_a_load_tells_its_rows_and_rate_as_it_goes_unless_quiet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "archive"
    pubs = _pubs(random.Random(15), 300, 0)
    said: list[str] = []
    # Pieces of 2 KiB: many tasks, each adding its rows to the count the lines show.
    load(
        [_write(tmp_path / "a.jsonl", pubs)],
        root,
        READ,
        progress=said.append,
        piece_bytes=2048,
        every=0.05,
    )
    going = [line for line in said if re.fullmatch(r"parsed [\d,]+ rows \([\d,]+ per s\)", line)]
    assert going, said
    assert re.fullmatch(
        r"parsed 300 publications of 2 class\(es\) in [\d.]+ s \([\d,]+ per s\)",
        said[said.index(going[-1]) + 1],
    )
    args = ["archive", "load", _write(tmp_path / "b.jsonl", _pubs(random.Random(16), 20, 300))]
    assert main([*args, "--archive", str(root), "--format", "json", "--quiet"]) == 0
    out = capsys.readouterr()
    assert out.err == "" and out.out.startswith("loaded 20 publications")


def test_a_plain_load_shows_progress_and_no_spark_warnings(tmp_path: Path) -> None:
    """In a process of its own, so that Spark starts as an operator's load starts it."""
    from spark.session import log4j2

    pubs = [
        Publication(f"q{i}", {"class": "C", "n": i}, BASE + timedelta(hours=i), "x")
        for i in range(20)
    ]
    source = _write(tmp_path / "in.jsonl", pubs)  # one class, one period: the fewest jobs
    command = [sys.executable, "-m", "padres.cli", "archive", "load", source, "--format", "json"]
    done = subprocess.run(
        [*command, "--archive", str(tmp_path / "archive"), "--master", "local[1]"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith("load ") and lines[-1].startswith("catalogued ")
    assert any(line.startswith("parsed 20 publications of 1 class(es) in ") for line in lines)
    assert not [line for line in lines if "WARN" in line or "Stage" in line], done.stderr
    assert "threshold.level = warn" in log4j2("warn")
    with pytest.raises(ArchiveError, match="Spark log level 'loud': one of off, error, warn"):
        log4j2("loud")


async def _past_and_live(broker: str, url: str, root: Path) -> tuple[list[str], list[str], Any]:
    """A hybrid subscription answered by a database node and an archive node together."""
    from historic.node import DatabaseNode
    from historic.store import Store
    from padres.client.connection import Client
    from padres.model.protocol import Notify
    from spark.node import ArchiveNode

    db_client = await Client(broker, "DB1").connect()
    store = Store(url)
    database = DatabaseNode("DB1", db_client, store)
    await database.start()
    await database.store_spec("[class,eq,'Order']")
    archive = Archive(root)
    archive_client = await Client(broker, "A1").connect()
    node = ArchiveNode("A1", archive_client, archive)
    await node.start()
    manager = await Client(broker, "manager").connect()
    shop = await Client(broker, "shop").connect()
    try:
        await shop.advertise("[class,eq,'Order'],[item,isPresent,''],[n,isPresent,0]")
        orders = await manager.subscribe(
            "[class,eq,'Order'],[item,eq,'shoes'],[time,>=,'2026-01-05T00:00']"
        )
        done = await orders.replayed(timeout=60)
        await shop.publish("[class,'Order'],[item,'shoes'],[n,20]", id="o20")
        await shop.publish("[class,'Order'],[item,'hats'],[n,21]", id="o21")
        got: list[Any] = []
        with contextlib.suppress(TimeoutError):
            while True:
                got.append(await orders.get(timeout=3.0))
        ids = [d.publication.id for d in got if isinstance(d, Notify)]
        times = [d.publication.timestamp for d in got if isinstance(d, Notify)]
        assert times == sorted(times)
        return ids[: done.count], ids[done.count :], done
    finally:
        for client in (shop, manager, archive_client, db_client):
            await client.close()
        await node.stop()
        await database.stop()
        archive.close()
        store.close()


async def test_a_hybrid_subscription_gets_moved_history_once_in_time_order(
    brokers: dict[str, Any], tmp_path: Path
) -> None:
    from historic.store import Store
    from padres.testing.processes import BrokerProcess
    from spark.move import move

    url = f"sqlite:///{tmp_path / 'db1.sqlite'}"
    base = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
    history = [
        Publication(
            f"o{i}",
            {"class": "Order", "item": "shoes" if i % 2 == 0 else "hats", "n": i},
            base + timedelta(minutes=i),
            "shop",
        )
        for i in range(20)
    ]
    store = Store(url)
    store.add(history)
    store.close()
    root = tmp_path / "archive"
    moved = move(url, root, base + timedelta(minutes=12), period=Period.DAY)
    assert (moved.exported, moved.removed) == (12, 12)
    store = Store(url)
    assert store.count() == 8
    store.close()
    # Between a load and its delete both hold the same publications: load two of them again.
    load([_write(tmp_path / "again.jsonl", history[12:14])], root, Reading(Format.JSON))
    brokers["B1"] = BrokerProcess("B1")
    past, live, done = await _past_and_live(brokers["B1"].start(), url, root)
    assert past == [f"o{i}" for i in range(0, 20, 2)]
    assert live == ["o20"]
    assert len(done.databases) == 2 and not done.failed


async def _asked(broker: str, root: Path, loads: list[list[Publication]]) -> list[list[str]]:
    """For each load in turn (the first before the node starts): who answered historic
    subscriptions to 2025 and to 2026, of classes Order and Refund."""
    from padres.client.connection import Client
    from spark.node import ArchiveNode

    root.mkdir()
    archive = Archive(root)
    archive_client = await Client(broker, "A1").connect()
    node = ArchiveNode("A1", archive_client, archive)
    manager = await Client(broker, "manager").connect()
    answered: list[list[str]] = []
    try:
        for n, pubs in enumerate(loads):
            await asyncio.to_thread(load, [_write(root.parent / f"{n}.jsonl", pubs)], root, READ)
            await node.start()  # what the node's watch does every few seconds
            found = []
            for kind, year in [(k, y) for k in ("Order", "Refund") for y in (2025, 2026)]:
                window = f"[time,>=,'{year}-01-01'],[time,<,'{year + 1}-01-01']"
                sub = await manager.subscribe(f"[class,eq,'{kind}'],{window}")
                done = await sub.replayed(timeout=60)
                found.append(f"{kind} {year}: {','.join(done.databases)} {done.count}")
            answered.append(found)
        return answered
    finally:
        for client in (manager, archive_client):
            await client.close()
        await node.stop()
        archive.close()


async def test_an_archive_is_asked_only_for_the_times_and_classes_it_holds(
    brokers: dict[str, Any], tmp_path: Path
) -> None:
    """Each class is offered with the time range the archive holds of it; what a later load
    adds (a class, a wider range) is offered again."""
    from padres.testing.processes import BrokerProcess

    def orders(kind: str, at: datetime, count: int) -> list[Publication]:
        return [
            Publication(f"{kind}{at.year}.{i}", {"class": kind, "n": i}, at, "shop")
            for i in range(count)
        ]

    loads = [
        orders("Order", datetime(2026, 3, 1, tzinfo=UTC), 3),
        orders("Refund", datetime(2026, 4, 1, tzinfo=UTC), 2),
        orders("Order", datetime(2025, 6, 1, tzinfo=UTC), 4),
    ]
    brokers["B1"] = BrokerProcess("B1")
    answered = await _asked(brokers["B1"].start(), tmp_path / "archive", loads)
    assert answered == [
        ["Order 2025:  0", "Order 2026: A1@B1 3", "Refund 2025:  0", "Refund 2026:  0"],
        ["Order 2025:  0", "Order 2026: A1@B1 3", "Refund 2025:  0", "Refund 2026: A1@B1 2"],
        ["Order 2025: A1@B1 4", "Order 2026: A1@B1 3", "Refund 2025:  0", "Refund 2026: A1@B1 2"],
    ]


def test_the_jobs_run_on_a_standalone_cluster(tmp_path: Path) -> None:
    """A master and a worker on loopback, started from the installed pyspark; the load and the
    query jobs run there (this test comes last: it ends the module's local session)."""
    from pyspark.sql import SparkSession

    from spark.cluster import LocalCluster

    pubs = _pubs(random.Random(3), 40, 0)
    with LocalCluster(tmp_path / "cluster") as master:
        assert master.startswith("spark://127.0.0.1:")
        try:
            report = load(
                [_write(tmp_path / "in.jsonl", pubs)],
                tmp_path / "archive",
                Reading(Format.JSON),
                master=master,
            )
            archive = Archive(tmp_path / "archive")
            flt = parse_filter("[class,eq,'C'],[a,isPresent,''],[time,<,'2001-03-01']")
            result = spark_query(archive, flt, master=master)
            archive.close()
        finally:
            active = SparkSession.getActiveSession()
            if active is not None:
                assert active.sparkContext.master == master
                active.stop()
    assert report.rows == len(pubs)
    assert _ordered(result.publications) == _reference(flt, pubs)


DATED_AT = datetime(2001, 1, 1, tzinfo=UTC)
DATED_OPS = {
    "number": ("<", "<=", ">", ">=", "=", "<>", "before", "after"),
    "text": ("str-lt", "str-le", "str-gt", "str-ge", "eq", "neq", "before", "after"),
}
"""The operators of a timestamp (a number) and of a date or datetime (text)."""


def _dated(n: int, at: datetime) -> Publication:
    """A publication with a datetime, a date and a timestamp of ``at`` (whole seconds)."""
    attrs: dict[str, Value] = {
        "class": "W",
        "at": date_value(at),
        "on": date_value(at.date()),
        "ts": timestamp_value(at),
    }
    return Publication(f"w{n}", attrs, DATED_AT + timedelta(days=n % 90), "x")


@pytest.fixture(scope="module")
def dated(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Archive, Store, list[Publication]]]:
    """The same publications with date and time attributes in an archive and a database."""
    tmp = tmp_path_factory.mktemp("dated")
    rng = random.Random(11)
    pubs = [
        _dated(n, DATED_AT + timedelta(seconds=rng.randint(0, 3 * 365 * 86400))) for n in range(300)
    ]
    root = tmp / "archive"
    load([_write(tmp / "dated.jsonl", pubs)], root, Reading(Format.JSON, period=Period.MONTH))
    archive, store = Archive(root), Store(f"sqlite:///{tmp / 'dated.sqlite'}")
    store.add(pubs)
    yield archive, store, pubs
    archive.close()
    store.close()


@settings(
    max_examples=scaled(100),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.data())
def test_dates_and_times_select_alike_live_in_history_and_in_the_archive(
    dated: tuple[Archive, Store, list[Publication]], draw: st.DataObject
) -> None:
    """Every operator on a datetime, a date and a timestamp: the Rete engine (live matching),
    the database's SQL (history) and the archive's pruned read (Parquet statistics) select
    exactly what the reference matcher does, and pruning reads no more than a full scan."""
    archive, store, pubs = dated
    attribute = draw.draw(st.sampled_from(["at", "on", "ts"]))
    op = draw.draw(st.sampled_from(DATED_OPS["number" if attribute == "ts" else "text"]))
    at = draw.draw(st.sampled_from(pubs)).attributes[attribute]
    if draw.draw(st.booleans()):  # an operand no publication holds, most likely
        span = draw.draw(st.integers(-86400 * 40, 3 * 365 * 86400 + 86400 * 40))
        moved = DATED_AT + timedelta(seconds=span)
        at = {"at": date_value(moved), "on": date_value(moved.date())}.get(
            attribute, timestamp_value(moved)
        )
    operand = repr(at) if isinstance(at, int | float) else f"'{at}'"
    flt = parse_filter(f"[class,eq,'W'],[{attribute},{op},{operand}]")
    expected = _reference(flt, pubs)
    rete = ReteMatcher()
    rete.add(Subscription("s", flt))
    assert sorted((p for p in pubs if rete.match(p).subscriptions), key=_key) == expected, flt
    assert _ordered(store.query(flt)) == expected, flt
    assert _ordered(archive.query(flt)) == _ordered(archive.full_scan(flt)) == expected, flt
