"""Worker for the full-data test: reference matches of quote files, in a separate process."""

from __future__ import annotations

from pathlib import Path

from padres.language.parser import parse_publication
from padres.matching.reference import ReferenceMatcher
from padres.model.messages import Subscription
from tests.strategies import NOW


def reference_matches(
    subs: list[Subscription], paths: list[Path], step: int = 1
) -> list[list[str]]:
    """The reference matcher's matches of every ``step``-th quote of each file."""
    matcher = ReferenceMatcher()
    for sub in subs:
        matcher.add(sub)
    out = []
    for path in paths:
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in list(enumerate(lines))[::step]:
            pub = parse_publication(line, id=f"{path.stem}{i}", timestamp=NOW)
            out.append(sorted(matcher.match(pub).subscriptions))
    return out
