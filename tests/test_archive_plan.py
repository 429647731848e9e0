"""The archive's pruning decision, without Spark: a file is skipped only when no publication it
holds can match, for random filters over every operator, with files whose statistics sit
exactly on a filter's bound."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from padres.language.parser import parse_filter
from padres.matching.matcher import matches
from padres.model.messages import Filter, Predicate, Publication, TimeWindow
from rete.operators import Op, OperandKind, Value, operand_kind
from spark.columns import column_of
from spark.plan import may_match
from spark.stats import ColumnStats, FileStats
from tests.strategies import scaled

START = datetime(2001, 3, 1, tzinfo=UTC)
ATTRIBUTES = ("a", "b", "c")
"""Publications carry some of these; filters also name ``z``, which none carries."""

ints = st.one_of(
    st.integers(-5, 5),
    st.sampled_from([2**53, 2**53 + 1, -(2**53) - 1, 2**63 - 1, -(2**63)]),
)
floats = st.one_of(
    st.sampled_from([0.0, -0.0, 0.5, -2.5, 3.0, 9007199254740992.0, 1e300]),
    st.floats(-10, 10, allow_nan=False),
)
strings = st.text(
    st.characters(codec="utf-8", max_codepoint=0x1F600, exclude_characters="\0"), max_size=3
)
values: st.SearchStrategy[Value] = st.one_of(strings, ints, floats, st.booleans())
times = st.integers(0, 4 * 24 * 3600).map(lambda s: START + timedelta(seconds=s))


@st.composite
def publications(draw: st.DrawFn, class_name: str = "C") -> Publication:
    names = draw(st.lists(st.sampled_from(ATTRIBUTES), unique=True, max_size=3))
    attrs: dict[str, Value] = {"class": class_name}
    attrs.update({name: draw(values) for name in names})
    ident = draw(st.uuids()).hex
    return Publication(ident, attrs, draw(times), "pub")


def _operand(op: Op, seen: Sequence[Value]) -> st.SearchStrategy[Value | None]:
    """An operand for ``op``, often one of the values the data holds (a file's bound)."""
    kind = operand_kind(op)
    if kind is OperandKind.NONE:
        return st.none()
    if kind is OperandKind.NUMBER:
        fits: list[Value] = [v for v in seen if type(v) in (int, float)]
        fresh: st.SearchStrategy[Value] = st.one_of(ints, floats)
    elif kind is OperandKind.STRING:
        fits = [v for v in seen if type(v) is str]
        fresh = strings
    else:
        fits = [v for v in seen if type(v) in (str, bool)]
        fresh = st.one_of(strings, st.booleans())
    return st.one_of(st.sampled_from(fits), fresh) if fits else fresh


@st.composite
def filters(draw: st.DrawFn, data: Sequence[Publication], class_name: str = "C") -> Filter:
    """A filter of ``class_name`` over the attributes ``data`` uses, and one it never does."""
    seen: dict[str, list[Value]] = defaultdict(list)
    for pub in data:
        for name, value in pub.attributes.items():
            seen[name].append(value)
    predicates = [Predicate("class", Op.EQ, class_name)]
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from([*ATTRIBUTES, "z"]))
        op = draw(st.sampled_from(list(Op)))
        predicates.append(Predicate(name, op, draw(_operand(op, seen[name]))))
    stamps = [p.timestamp for p in data] or [START]
    bound = st.one_of(st.none(), st.sampled_from(stamps), times)
    start, end = draw(bound), draw(bound)
    window = None
    if (start or end) and (start is None or end is None or start < end):
        window = TimeWindow(start, end)
    return Filter(tuple(predicates), window)


def stats_of(pubs: Sequence[Publication], class_name: str = "C") -> FileStats:
    """What a file holding ``pubs`` records in the catalog."""
    columns: dict[str, list[Value]] = defaultdict(list)
    for pub in pubs:
        for name, value in pub.attributes.items():
            if name != "class":
                columns[column_of(name, value)].append(value)
    stamps = [p.timestamp for p in pubs]
    return FileStats(
        "f.parquet",
        class_name,
        "2001-03",
        min(stamps),
        max(stamps),
        len(pubs),
        0,
        {
            name: ColumnStats(min(found), max(found), len(pubs) - len(found))
            for name, found in columns.items()
        },
    )


def _holds(flt: Filter, pub: Publication) -> bool:
    return (flt.window is None or pub.timestamp in flt.window) and matches(flt, pub)


@settings(max_examples=scaled(200), deadline=None)
@given(st.data())
def test_a_file_holding_a_match_is_never_skipped(data: st.DataObject) -> None:
    pubs = data.draw(st.lists(publications(), min_size=1, max_size=5))
    flt = data.draw(filters(pubs))
    if any(_holds(flt, pub) for pub in pubs):
        assert may_match(flt, stats_of(pubs)), flt


def _file(**columns: tuple[Value, Value]) -> FileStats:
    return FileStats(
        "f.parquet",
        "STOCK",
        "1999-12",
        datetime(1999, 12, 1, tzinfo=UTC),
        datetime(1999, 12, 31, tzinfo=UTC),
        20,
        0,
        {column_of(n, lo): ColumnStats(lo, hi, 0) for n, (lo, hi) in columns.items()},
    )


def test_a_file_is_skipped_just_past_its_bounds_and_read_on_them() -> None:
    f = _file(close=(10.5, 20), symbol=("IBM", "MSFT"), volume=(2**53 + 1, 2**53 + 1))
    read = {
        "[close,<=,10.5]": True,
        "[close,<,10.5]": False,
        "[close,>=,20]": True,
        "[close,>,20]": False,
        "[close,=,15]": True,
        "[symbol,eq,'MSFT']": True,
        "[symbol,str-gt,'MSFT']": False,
        "[symbol,str-lt,'IBM']": False,
        "[symbol,str-prefix,'J']": True,
        "[symbol,str-prefix,'N']": False,
        "[symbol,eq,true]": False,
        "[volume,=,9007199254740993]": True,
        "[volume,<,9007199254740992]": False,
        "[volume,<>,9007199254740992]": True,
        "[missing,isPresent,'']": False,
        "[close,isPresent,'']": True,
        "[time,>=,'1999-12-31']": True,
        "[time,>,'1999-12-31']": False,
        "[time,<,'1999-12-01']": False,
        "[time,<=,'1999-12-01']": True,
    }
    for text, expected in read.items():
        flt = parse_filter(f"[class,eq,'STOCK'],{text}")
        assert may_match(flt, f) is expected, text
    assert not may_match(parse_filter("[class,eq,'BOND']"), f)


def test_the_archive_package_exports_what_it_names() -> None:
    import spark

    assert sorted(spark.__all__) == spark.__all__
    for name in spark.__all__:
        assert getattr(spark, name) is not None
    assert issubclass(spark.InputError, spark.ArchiveError)
