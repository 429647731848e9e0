"""All real stock quotes parse, and the reference matcher agrees with plain Python on them."""

from __future__ import annotations

import multiprocessing
import os
import random
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import pytest

from padres.bench.workloads import stock_subscriptions
from padres.language.datasets import find_stockquotes
from padres.language.parser import parse_publication, parse_subscription
from padres.matching.rete_matcher import ReteMatcher
from padres.model.codec import decode, encode
from padres.model.messages import Publication, Subscription
from padres.model.printer import format_message
from tests.stock_reference import reference_matches
from tests.strategies import NOW

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


def _mixed_subscriptions(quotes: list[Publication], seed: int) -> list[Subscription]:
    """800 subscriptions of the benchmark's stock workload and 200 using string operators."""
    subs = list(stock_subscriptions(800, quotes, seed))
    rng = random.Random(seed)
    symbols = sorted({str(q.attributes["symbol"]) for q in quotes})
    for i in range(200):
        quote = rng.choice(quotes)
        close = quote.attributes["close"]
        kind = i % 4
        if kind == 0:
            extra = f"[symbol,str-prefix,'{rng.choice(symbols)[:1]}'],[close,<,{close!r}]"
        elif kind == 1:
            extra = f"[date,str-postfix,'{str(quote.attributes['date'])[-6:]}'],[volume,>,1000000]"
        elif kind == 2:
            symbol = quote.attributes["symbol"]
            extra = f"[symbol,neq,'{symbol}'],[open,>=,{close!r}],[open,<,{close!r}]"
        else:
            extra = f"[date,str-contains,'Jan'],[symbol,eq,'{quote.attributes['symbol']}']"
        subs.append(parse_subscription(f"[class,eq,'STOCK'],{extra}", id=f"x{i}"))
    return subs


@needs_data
@pytest.mark.slow
def test_rete_equals_the_reference_on_every_quote() -> None:
    """1,000 random PADRES-style subscriptions against every eighth of the 245,190 quotes
    (all of them with ``PADRES_EVERY_QUOTE=1``: seven times as long)."""
    assert DATA is not None
    paths = sorted(Path(DATA).glob("*.txt"))
    step = 1 if os.environ.get("PADRES_EVERY_QUOTE") else 8
    quotes = [
        parse_publication(line, id=f"{p.stem}{i}", timestamp=NOW)
        for p in paths
        for i, line in list(enumerate(p.read_text(encoding="utf-8").splitlines()))[::step]
    ]
    subs = _mixed_subscriptions(quotes, seed=7)
    halves = [paths[: len(paths) // 2], paths[len(paths) // 2 :]]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=2, mp_context=context) as pool:
        futures = [pool.submit(reference_matches, subs, half, step) for half in halves]
        rete = ReteMatcher()
        for sub in subs:
            rete.add(sub)
        actual = [sorted(rete.match(q).subscriptions) for q in quotes]
        expected = [row for future in futures for row in future.result()]
    assert len(actual) == len(expected) >= 245_190 // step
    mismatches = [i for i, (a, e) in enumerate(zip(actual, expected, strict=True)) if a != e]
    assert not mismatches, f"{len(mismatches)} quotes differ, first {quotes[mismatches[0]]}"
    total = sum(map(len, actual))
    assert 0 < total < len(quotes) * 1000  # the check must see matches, and not everything
