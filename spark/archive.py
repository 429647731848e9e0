"""Answering a filter from an archive, without Spark: plan from the catalog, read the files
that may hold matches with the filter pushed down, check every row exactly with the language's
semantics, and stream the publications in time order."""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.dataset as ds

from padres.matching.matcher import matches
from padres.model.messages import Filter, Publication
from spark.catalog import Catalog, ClassRange, default_url
from spark.columns import publication
from spark.plan import prune
from spark.pushdown import pushdown
from spark.stats import FileStats

__all__ = ["Archive", "Plan"]

BATCH_ROWS = 8192


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
