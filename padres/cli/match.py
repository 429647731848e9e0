"""``padres match``: which subscriptions each publication matches."""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from padres.cli.inputs import expand, positive, read_lines
from padres.errors import CommandError
from padres.language.batch import BatchReader
from padres.matching.engines import ENGINES, make_engine
from padres.matching.matcher import CompositeMatch, Matcher, MatchResult
from padres.model.messages import CompositeSubscription, Publication, Subscription
from padres.model.printer import format_message, format_value
from rete.limits import CompositeLimits, Policy


def arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "For each publication, print the subscriptions it matches and the composite "
        "subscriptions it completes (with their publications and bindings)."
    )
    p.add_argument("--subs", required=True, metavar="FILE", help="subscriptions (s / cs lines)")
    p.add_argument(
        "--pubs", required=True, nargs="+", metavar="FILE", help="publications; - for stdin"
    )
    p.add_argument("--engine", default="rete", choices=sorted(ENGINES), help="matching engine")
    p.add_argument("--json", action="store_true", help="one JSON object per publication")
    p.add_argument(
        "--only-matches", action="store_true", help="skip publications that match nothing"
    )
    p.add_argument(
        "--summary", action="store_true", help="print match counts per subscription instead"
    )
    p.add_argument(
        "--policy", default=Policy.CONSUME_AND_REMAIN.value, choices=[x.value for x in Policy]
    )
    p.add_argument(
        "--max-facts",
        type=positive(int),
        default=CompositeLimits().max_facts,
        help="per composite part",
    )
    p.add_argument(
        "--window",
        type=positive(float),
        metavar="SECONDS",
        help="forget composite parts older than this",
    )
    p.add_argument(
        "--one-for-many",
        action="store_true",
        help="one publication may fill several parts of a composite, as in PADRES",
    )
    p.set_defaults(run=run)


def _natural(text: str) -> tuple[Any, ...]:
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def load_subscriptions(path: str) -> list[Subscription | CompositeSubscription]:
    subs: list[Subscription | CompositeSubscription] = []
    for lineno, message in BatchReader().read(read_lines(path), path):
        if not isinstance(message, Subscription | CompositeSubscription):
            raise CommandError(
                f"{path}:{lineno}: expected a subscription, found {type(message).__name__}"
            )
        subs.append(message)
    return subs


def publications(paths: list[str]) -> Iterator[tuple[str, Publication]]:
    """``(file:line, publication)`` over every file, numbered p1, p2, ... across files."""
    reader = BatchReader(timestamp=datetime.now(UTC))
    for path in paths:
        name = "<stdin>" if path == "-" else path
        for lineno, message in reader.read(read_lines(path), name):
            if not isinstance(message, Publication):
                raise CommandError(
                    f"{name}:{lineno}: expected a publication, found {type(message).__name__}"
                )
            yield f"{name}:{lineno}", message


def _composite_json(m: CompositeMatch) -> dict[str, Any]:
    return {
        "subscription": m.subscription_id,
        "publications": [p.id for p in m.publications],
        "bindings": dict(m.bindings),
    }


def _composite_text(m: CompositeMatch) -> str:
    bindings = " ".join(f"{k}={format_value(v)}" for k, v in sorted(m.bindings.items()))
    pubs = ",".join(p.id for p in m.publications)
    return f"{m.subscription_id}[{pubs}]" + (f"{{{bindings}}}" if bindings else "")


def _results(
    engine: Matcher, pubs: Iterator[tuple[str, Publication]]
) -> Iterator[tuple[str, Publication | None, MatchResult]]:
    """What each publication matched; then, at the end of the input, what time passing
    every window completes (absences still waiting), with no publication, if anything."""
    for source, pub in pubs:
        yield source, pub, engine.match(pub)
    closed = engine.advance(datetime.max.replace(tzinfo=UTC))
    if closed:
        yield "end", None, MatchResult((), closed)


def run(args: argparse.Namespace) -> int:
    window = timedelta(seconds=args.window) if args.window else None
    limits = CompositeLimits(
        Policy(args.policy), args.max_facts, window, distinct=not args.one_for_many
    )
    engine = make_engine(args.engine, limits)
    subs = load_subscriptions(args.subs)
    for sub in subs:
        engine.add(sub)
    order = {sub.id: i for i, sub in enumerate(subs)}
    counts: Counter[str] = Counter()
    total = 0
    started = time.perf_counter()
    out = sys.stdout
    for source, pub, result in _results(engine, publications(expand(args.pubs))):
        total += pub is not None
        atomic = sorted(result.subscriptions, key=order.__getitem__)
        composites = sorted(
            result.composites,
            key=lambda m: (order[m.subscription_id], [_natural(p.id) for p in m.publications]),
        )
        counts.update(atomic)
        counts.update(m.subscription_id for m in composites)
        if args.summary or (args.only_matches and not result):
            continue
        if args.json:
            line = orjson.dumps(
                {
                    "publication": None if pub is None else pub.id,
                    "source": source,
                    "subscriptions": atomic,
                    "composites": [_composite_json(m) for m in composites],
                }
            ).decode()
        else:
            line = (
                ("end of input" if pub is None else f"{pub.id} ({source})")
                + ": "
                + (" ".join(atomic + [_composite_text(m) for m in composites]) or "-")
            )
        out.write(line + "\n")
    if args.summary:
        elapsed = time.perf_counter() - started
        rate = total / elapsed if elapsed else 0.0
        print(
            f"{total:,} publications matched against {len(subs)} subscriptions "
            f"with engine {args.engine} in {elapsed:.2f} s ({rate:,.0f} per second)"
        )
        width = max((len(s.id) for s in subs), default=2)
        for sub in subs:
            print(f"  {sub.id:<{width}}  {counts[sub.id]:>9,}  {format_message(sub)}")
    return 0
