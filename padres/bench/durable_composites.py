"""``padres bench durable-composite``: what keeping a composite's partial matches costs.

One broker core in this process (no sockets: the broker's own work and its journal's), its
journal in SQLite in a temporary directory with the ``--sync`` policy given. A client makes
``{A} ; {B} within W`` on a key variable (five keys), as a plain composite subscription and as
a durable one, for windows of 1 s and 10 s; ``count`` publications stamped 10 ms apart (nine
A for one B) are handed to the broker in frames of 1 and of 100, the journal committed after
each frame, as a node commits after each frame it reads (the durable one's client
acknowledges the matches of each frame). Figures: publications per second for
each, the ratio durable / plain in the same run, what the durable composite holds at the end,
and the bytes of its partial matches in the journal. Both must deliver the same matches.
"""

from __future__ import annotations

import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from padres.bench import machine
from padres.broker import Broker, Out
from padres.broker.sqlite_journal import SqliteJournal, Sync
from padres.language.parser import parse_advertisement, parse_composite
from padres.model.messages import Publication
from padres.model.protocol import Ack, CompositeNotify, Durable, Hello, Role

__all__ = ["report", "run"]

WINDOWS = (1, 10)
FRAMES = (1, 100)


def _rate(
    path: Path, durable: bool, window: int, frame: int, count: int, sync: Sync
) -> dict[str, Any]:
    journal = SqliteJournal(str(path), sync=sync)
    broker = Broker("B", journal=journal)
    now = time.time()
    broker.handle(Hello("shop", Role.CLIENT), "shop", now)
    broker.handle(Hello("watch", Role.CLIENT), "watch", now)
    for cls in "AB":
        broker.handle(parse_advertisement(f"[class,eq,'{cls}'],[k,isPresent]", id=cls), "shop", now)
    text = f"{{[class,eq,'A'],[k,eq,$K]}} ; {{[class,eq,'B'],[k,eq,$K]}} within {window}s"
    sub = parse_composite(text, id="w")
    broker.handle(Durable(sub) if durable else sub, "watch", now)
    journal.commit()
    start = datetime.now(UTC)
    pubs = [
        Publication(
            f"p{n}",
            {"class": "B" if n % 10 == 9 else "A", "k": f"k{n % 5}"},
            start + n * timedelta(milliseconds=10),
        )
        for n in range(count)
    ]
    matches: list[tuple[str, ...]] = []

    def collect(outs: list[Out]) -> None:
        for _, message in outs:
            if isinstance(message, CompositeNotify):
                matches.append(tuple(p.id for p in message.publications))

    started = time.perf_counter()
    for n, pub in enumerate(pubs, 1):
        collect(broker.handle(pub, "shop", now))
        if n % frame == 0 or n == count:
            journal.commit()
            if durable and matches:  # the client keeps up: it acknowledges each frame's
                collect(broker.handle(Ack("w", len(matches)), "watch", now))
    elapsed = time.perf_counter() - started
    out: dict[str, Any] = {"per_s": round(count / elapsed), "matches": matches}
    if durable:
        (row,) = broker.durables.statistics()
        state = journal.partial(broker.durables.records()[0]) or b""
        out |= {"held": row["held"], "state_bytes": len(state)}
    journal.close()
    return out


def run(count: int = 5_000, sync: Sync = Sync.FULL) -> dict[str, Any]:
    """The figures (see the module docstring)."""
    result: dict[str, Any] = {"machine": machine(), "count": count, "sync": sync.value, "runs": []}
    with tempfile.TemporaryDirectory(prefix="padres-bench-") as tmp:
        for window in WINDOWS:
            for frame in FRAMES:
                path = Path(tmp) / f"{window}-{frame}"
                plain = _rate(path.with_suffix(".plain"), False, window, frame, count, sync)
                kept = _rate(path.with_suffix(".durable"), True, window, frame, count, sync)
                if kept["matches"] != plain["matches"]:
                    raise RuntimeError("the durable composite's matches are not the plain one's")
                result["runs"].append(
                    {
                        "window_s": window,
                        "frame": frame,
                        "plain_per_s": plain["per_s"],
                        "durable_per_s": kept["per_s"],
                        "ratio": round(kept["per_s"] / plain["per_s"], 3),
                        "held": kept["held"],
                        "state_bytes": kept["state_bytes"],
                        "matches": len(kept["matches"]),
                    }
                )
    return result


def report(result: dict[str, Any]) -> str:
    lines = [
        f"{result['machine']}",
        f"one broker core, {result['count']:,} publications, --sync {result['sync']}:",
    ]
    for r in result["runs"]:
        lines.append(
            f"  within {r['window_s']:>2} s, frames of {r['frame']:>3}: plain "
            f"{r['plain_per_s']:>7,}/s   durable {r['durable_per_s']:>7,}/s   "
            f"durable/plain {r['ratio']:.2f}   holds {r['held']:,} publications, "
            f"{r['state_bytes']:,} bytes in the journal; {r['matches']:,} matches"
        )
    return "\n".join(lines)
