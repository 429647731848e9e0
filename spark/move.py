"""Moving a database node's old history into an archive: export what its store holds before a
time (as JSON lines in the wire format, which ``load`` reads), load it, and only then delete
exactly the exported publications from SQL.

Whatever fails before the delete leaves the store as it was; the delete removes only rows the
archive's catalog now names, in one transaction. Between the load and the delete both hold the
same publications, which a replay gives once (brokers merge answers by publisher and id).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from historic.errors import StoreError
from historic.store import Store
from padres.model.codec import encode
from spark.errors import ArchiveError
from spark.inputs import Format, Period, Reading
from spark.load import LoadReport, load
from spark.session import DEFAULT_LOG, DEFAULT_MASTER

__all__ = ["MoveReport", "export", "move"]


@dataclass(frozen=True, slots=True)
class MoveReport:
    exported: int
    removed: int
    load: LoadReport | None


def export(store: Store, before: datetime, out: Path) -> list[int]:
    """Write the store's publications older than ``before`` to ``out``, one wire message a
    line in time order; return their row keys."""
    keys: list[int] = []
    with out.open("wb") as f:
        for chunk in store.older(before):
            for key, pub in chunk:
                f.write(encode(pub) + b"\n")
                keys.append(key)
    return keys


def move(
    url: str,
    archive: Path,
    before: datetime,
    *,
    catalog_url: str | None = None,
    master: str = DEFAULT_MASTER,
    period: Period = Period.MONTH,
    progress: Callable[[str], None] = lambda _: None,
    replace: bool = False,
    spark_log: str = DEFAULT_LOG,
) -> MoveReport:
    """Move the publications of the store at ``url`` older than ``before`` into ``archive``
    (``replace``, ``spark_log``: as ``load`` takes them)."""
    store = Store(url)
    staging = archive / "_staging"
    staging.mkdir(parents=True, exist_ok=True)
    out = staging / f"export-{time.strftime('%Y%m%dT%H%M%S')}-{id(store):x}.jsonl"
    try:
        keys = export(store, before, out)
        progress(f"exported {len(keys):,} publications older than {before.isoformat()}")
        if not keys:
            return MoveReport(0, 0, None)
        report = load(
            [str(out)],
            archive,
            Reading(Format.JSON, period=period),
            catalog_url=catalog_url,
            master=master,
            progress=progress,
            replace=replace,
            spark_log=spark_log,
        )
        if report.rows != len(keys):
            raise ArchiveError(f"exported {len(keys)} publications but loaded {report.rows}")
        try:
            removed = store.remove(keys)
        except StoreError as exc:
            raise ArchiveError(
                "the archive holds them now, but removing them from the store failed "
                f"(a replay gives them once all the same): {exc}"
            ) from exc
        progress(f"removed {removed:,} publications from the store")
        return MoveReport(len(keys), removed, report)
    finally:
        out.unlink(missing_ok=True)
        store.close()
