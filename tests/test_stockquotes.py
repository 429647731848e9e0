"""All real stock quotes parse, and the reference matcher agrees with plain Python on them."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from padres.datasets import find_stockquotes
from padres.parser import parse_publication
from padres.printer import format_message
from padres.wire import decode, encode

DATA = find_stockquotes()
needs_data = pytest.mark.skipif(
    DATA is None,
    reason="the full stock-quote data set is missing (set PADRES_STOCKQUOTES or check out "
    "shared/data/stockquotes beside the repository)",
)


@needs_data
@pytest.mark.slow
def test_every_quote_parses_prints_and_encodes() -> None:
    assert DATA is not None
    now = datetime.now(UTC)
    total = 0
    symbols = set()
    for path in sorted(Path(DATA).glob("*.txt")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            pub = parse_publication(line, id=f"p{total + i}", timestamp=now)
            assert pub.attributes["symbol"] == path.stem
            assert set(pub.attributes) == {
                "class",
                "symbol",
                "open",
                "high",
                "low",
                "close",
                "volume",
                "date",
            }
            if i % 50 == 0:  # full round trips on a sample keep the test quick
                assert parse_publication(format_message(pub), id=pub.id, timestamp=now) == pub
                assert decode(encode(pub)) == pub
        total += len(lines)
        symbols.add(path.stem)
    assert len(symbols) == 100
    # Every line is a quote. (The data's NOTICE says 245,090, which counts newline characters;
    # each file's last line has none.)
    assert total == 245_190
