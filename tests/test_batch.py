"""PADRES batch files: commands, ids, comments and errors with line numbers."""

from __future__ import annotations

import pytest

from padres.errors import ParseError
from padres.language.batch import BatchReader, parse_batch
from padres.model.messages import (
    Advertisement,
    CompositeSubscription,
    Publication,
    Subscription,
    Unadvertise,
    Unsubscribe,
)
from padres.model.printer import format_batch_line

BATCH = """\
# a PADRES batch file
a [class,eq,'STOCK'],[symbol,isPresent,'IBM'],[open,isPresent,0.0]
p [class,'STOCK'],[symbol,'IBM'],[open,100.5]

s [class,eq,'STOCK'],[symbol,eq,'IBM']
cs {[class,eq,'STOCK'],[symbol,eq,$S$X]} & {[class,eq,'NEWS'],[symbol,eq,$S$X]}
  s [class,eq,'STOCK'],[open,>,100]
us s2
ua a1
[class,'STOCK'],[symbol,'MSFT'],[open,30]
[class,eq,'STOCK'],[open,<,10]
"""


def test_batch_commands_and_ids() -> None:
    messages = list(parse_batch(BATCH.splitlines()))
    assert [type(m) for m in messages] == [
        Advertisement,
        Publication,
        Subscription,
        CompositeSubscription,
        Subscription,
        Unsubscribe,
        Unadvertise,
        Publication,
        Subscription,
    ]
    ids = [getattr(m, "id", None) for m in messages]
    assert ids == ["a1", "p1", "s1", "s2", "s3", None, None, "p2", "s4"]
    assert messages[5] == Unsubscribe("s2")
    assert messages[6] == Unadvertise("a1")


def test_printed_batch_reads_back_the_same() -> None:
    messages = list(parse_batch(BATCH.splitlines()))
    text = [format_batch_line(m) for m in messages]
    again = list(parse_batch(text))
    assert [format_batch_line(m) for m in again] == text


def test_error_names_file_line_and_column() -> None:
    lines = ["s [class,eq,'A']", "", "  s [class,eq,'A'],[x,<,'y']"]
    with pytest.raises(ParseError) as info:
        list(parse_batch(lines, origin="subs.txt"))
    err = info.value
    assert (err.line, err.column, err.origin) == (3, 20, "subs.txt")
    assert str(err).startswith("subs.txt:line 3, column 20: operator < of 'x' takes a number")
    assert str(err).splitlines()[2] == "  " + " " * 19 + "^"


def test_ids_stay_stable_across_bad_lines_and_files() -> None:
    reader = BatchReader()
    first = [m for _, m in reader.read(["s [class,eq,'A']"], "one.txt")]
    with pytest.raises(ParseError):
        reader.parse_line("s [class,eq,]", 2)
    second = [m for _, m in reader.read(["s [class,eq,'B']"], "two.txt")]
    assert [m.id for m in first + second if isinstance(m, Subscription)] == ["s1", "s3"]


@pytest.mark.parametrize("line", ["us", "us two words", "ua ["])
def test_bad_unsubscribe_ids(line: str) -> None:
    with pytest.raises(ParseError, match="invalid"):
        BatchReader().parse_line(line)


def test_crlf_lines_and_comments() -> None:
    reader = BatchReader()
    assert reader.parse_line("# only a comment\r\n") is None
    assert reader.parse_line("   \r\n") is None
    msg = reader.parse_line("p [class,'A'],[x,1]\r\n")
    assert isinstance(msg, Publication) and msg.attributes["x"] == 1
