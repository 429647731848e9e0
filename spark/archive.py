"""Answering a filter from an archive, without Spark: plan from the catalog, read the files
that may hold matches with the filter pushed down, check every row exactly with the language's
semantics, and stream the publications in time order. Also the archive's loads: listing them
and removing one."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import pyarrow.dataset as ds

from padres.matching.matcher import matches
from padres.model.messages import Filter, Publication
from spark.catalog import Catalog, ClassRange, LoadRecord, default_url
from spark.columns import publication
from spark.errors import ArchiveError
from spark.plan import prune
from spark.pushdown import pushdown
from spark.stats import FileStats

__all__ = ["LOCAL_ROWS", "Archive", "Plan", "discard"]

BATCH_ROWS = 8192
LOCAL_ROWS: Final = 2_000_000
"""A query whose kept files hold at most this many rows is read here with pyarrow by default
(``padres archive query``): below it, starting Spark takes longer than the read."""


@dataclass(frozen=True, slots=True)
class Plan:
    """The files a query reads, out of those of its class."""

    read: list[FileStats]
    of: int


class Archive:
    """An archive's root directory and its catalog."""

    def __init__(self, root: Path, catalog_url: str | None = None) -> None:
        self.root = root.resolve()
        self.catalog = Catalog(catalog_url or default_url(str(self.root)))

    def close(self) -> None:
        self.catalog.close()

    def classes(self) -> list[ClassRange]:
        return self.catalog.classes(str(self.root))

    def files(self, class_name: str | None = None) -> list[FileStats]:
        return self.catalog.files(str(self.root), class_name)

    def loads(self) -> list[LoadRecord]:
        return self.catalog.loads(str(self.root))

    def remove(self, load: str) -> tuple[LoadRecord, list[str]]:
        """Remove load ``load``: its catalog entries (in one transaction), then its files; what
        it was and the paths of its files. ``UnknownLoad`` if there is no such load."""
        record, paths = self.catalog.remove(str(self.root), load)
        failed = discard(self.root, paths)
        if failed:
            raise ArchiveError(
                f"load {load} is removed from the catalog, but deleting its files failed: "
                + "; ".join(failed[:5])
            )
        return record, paths

    def plan(self, flt: Filter) -> Plan:
        candidates = self.files(flt.class_name)
        return Plan(prune(flt, candidates), len(candidates))

    def paths(self, files: list[FileStats]) -> list[str]:
        return [str(self.root / f.path) for f in files]

    def _read(self, flt: Filter, f: FileStats, skipping: bool) -> Iterator[Publication]:
        dataset = ds.dataset(str(self.root / f.path), format="parquet")
        expression = pushdown(flt, dataset.schema.names) if skipping else None
        window = flt.window
        for batch in dataset.to_batches(filter=expression, batch_size=BATCH_ROWS):
            for row in batch.to_pylist():
                pub = publication(f.class_name, row)
                if (window is None or pub.timestamp in window) and matches(flt, pub):
                    yield pub

    def stream(
        self, flt: Filter, size: int = 500, plan: Plan | None = None, *, skipping: bool = True
    ) -> Iterator[list[Publication]]:
        """The publications matching ``flt`` (and its window), in time order, ``size`` at a
        time, from the files of ``plan`` (by default, the filter's). Files whose time ranges
        overlap are merged; the others are read one by one. ``skipping=False`` reads every row
        of those files, with no pushdown: what the skipping is checked against."""
        chunk: list[Publication] = []
        for group in _overlapping((plan or self.plan(flt)).read):
            readers = [self._read(flt, f, skipping) for f in group]
            merged = (
                readers[0]
                if len(readers) == 1
                else heapq.merge(*readers, key=lambda p: p.timestamp)
            )
            for pub in merged:
                chunk.append(pub)
                if len(chunk) >= size:
                    yield chunk
                    chunk = []
        if chunk:
            yield chunk

    def query(self, flt: Filter, plan: Plan | None = None) -> list[Publication]:
        return [p for chunk in self.stream(flt, plan=plan) for p in chunk]

    def full_scan(self, flt: Filter) -> list[Publication]:
        """``query`` without any skipping: every row of every file of the class, each checked."""
        everything = Plan(self.files(flt.class_name), 0)
        return [p for chunk in self.stream(flt, plan=everything, skipping=False) for p in chunk]


def discard(root: Path, paths: Iterable[str]) -> list[str]:
    """Delete the files ``paths`` of the archive at ``root``, which the catalog no longer
    names, and the directories they leave empty; return what could not be deleted, and why
    (such a file is never read again, but takes room)."""
    failed: list[str] = []
    for path in paths:
        target = root / path
        try:
            target.unlink(missing_ok=True)
        except OSError as exc:
            failed.append(f"{target}: {exc.strerror or exc}")
            continue
        for folder in (target.parent, target.parent.parent):
            if folder == root or not folder.is_relative_to(root):
                break
            try:
                folder.rmdir()
            except OSError:  # not empty (or just filled by another load): it stays
                break
    return failed


def _overlapping(files: list[FileStats]) -> Iterator[list[FileStats]]:
    """Files in groups whose time ranges chain together, groups in time order."""
    group: list[FileStats] = []
    end = datetime.min.replace(tzinfo=UTC)
    for f in sorted(files, key=lambda f: (f.start, f.path)):
        if group and f.start > end:
            yield group
            group = []
        end = max(end, f.end) if group else f.end
        group.append(f)
    if group:
        yield group
