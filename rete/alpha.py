"""The alpha network: conditions grouped into clusters by one hash-indexed equality test.

A condition's access test is one of its ``eq`` / ``=`` tests, chosen to keep clusters small: the
one whose cluster is smallest now, ties going to the attribute with the most distinct keyed
values, then to the later test (``class`` usually comes first and is the least selective).
Conditions without an equality test share the root cluster. A fact visits the root cluster and
the cluster of each of its ``(attribute, value)`` pairs: one dictionary lookup each.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any

from rete.cluster import SMALL, Cluster, Entry, Filing
from rete.conditions import Test
from rete.keyed import TAGS, tag
from rete.operators import Op, Value

__all__ = ["AlphaNetwork"]

ClusterKey = tuple[str, str, Value] | None
_ACCESS_OPS = (Op.EQ, Op.EQ_NUM)
_OP = itemgetter(1)


class AlphaNetwork:
    def __init__(self, small_cluster: int = SMALL) -> None:
        self.small_cluster = small_cluster
        self.clusters: dict[ClusterKey, Cluster] = {}
        self._keyed_values: Counter[str] = Counter()
        self._entries = 0

    def _access(
        self, tests: tuple[Test, ...], staged: Mapping[ClusterKey, list[int]]
    ) -> tuple[ClusterKey, tuple[Test, ...]]:
        """The key of the cluster for a condition (``staged``: conditions on their way into
        each cluster, counted as if there already), and its tests less the access test."""
        best: tuple[tuple[int, int, int], int, ClusterKey] | None = None
        ops = list(map(_OP, tests))  # scanned in C: most tests are no equality
        for op in _ACCESS_OPS:
            i = -1
            for _ in range(ops.count(op)):
                i = ops.index(op, i + 1)
                attribute, _, operand = tests[i]
                assert operand is not None
                key: ClusterKey = (attribute, tag(operand), operand)
                cluster = self.clusters.get(key)
                size = (cluster.live if cluster else 0) + len(staged.get(key, ()))
                score = (size, -self._keyed_values[attribute], -i)
                if best is None or score < best[0]:
                    best = (score, i, key)
        if best is None:
            return None, tests
        _, i, key = best
        return key, tests[:i] + tests[i + 1 :]

    def add(
        self, target: Any, tests: tuple[Test, ...], binds: frozenset[str], is_part: bool
    ) -> Entry:
        """File a condition; ``binds`` names attributes it binds variables to (they must exist)."""
        return self.add_many([(target, tests, binds, is_part)])[0]

    def add_many(
        self, conditions: Sequence[tuple[Any, tuple[Test, ...], frozenset[str], bool]]
    ) -> list[Entry]:
        """``add`` each of ``conditions`` (target, tests, binds, is_part) in turn, into the same
        clusters, each cluster taking its share at once."""
        staged: dict[ClusterKey, list[int]] = {}
        filings: list[Filing] = []
        for i, (target, tests, binds, is_part) in enumerate(conditions):
            key, rest = self._access(tests, staged)
            if key not in self.clusters:
                self.clusters[key] = Cluster(key, small=self.small_cluster)
                if key is not None:
                    self._keyed_values[key[0]] += 1
            staged.setdefault(key, []).append(i)
            filings.append((target, is_part, binds, rest))
        entries: list[Entry] = [None] * len(filings)  # type: ignore[list-item]  # all set below
        for key, which in staged.items():
            filed = self.clusters[key].insert([filings[i] for i in which])
            for i, entry in zip(which, filed, strict=True):
                entries[i] = entry
        self._entries += len(entries)
        return entries

    def remove(self, entry: Entry) -> None:
        key = entry.key
        cluster = self.clusters[key]
        cluster.delete(entry)
        self._entries -= 1
        if not cluster.live:
            del self.clusters[key]
            if key is not None:
                self._keyed_values[key[0]] -= 1
                if not self._keyed_values[key[0]]:
                    del self._keyed_values[key[0]]
        elif cluster.wasteful:
            self.clusters[key] = cluster.compacted()

    def nodes(self) -> int:
        """Alpha nodes: access tests, numeric columns, keyed values and residual tests."""
        total = 0
        for cluster in self.clusters.values():
            total += 1 + len(cluster.numeric.columns) + len(cluster.residual)
            for index in cluster.keyed.values():
                total += sum(len(f.by_key) for f in index.families.values())
        return total

    def _route(self, attributes: Mapping[str, Value]) -> list[Cluster]:
        """The clusters a fact visits: the root, and the cluster of each of its (attribute,
        value) pairs that has one."""
        clusters = self.clusters
        keyed = self._keyed_values
        route = [clusters[None]] if None in clusters else []
        for attribute, value in attributes.items():
            if attribute in keyed:
                cluster = clusters.get((attribute, TAGS.get(type(value), "n"), value))
                if cluster is not None:
                    route.append(cluster)
        return route

    def match(self, attributes: Mapping[str, Value]) -> tuple[list[Any], list[Any]]:
        """The targets ``attributes`` satisfies: (conditions, composite parts)."""
        memo: dict[Test, bool] = {}
        atomic: list[Any] = []
        parts: list[Any] = []
        for cluster in self._route(attributes):
            a, p = cluster.match(attributes, memo)
            atomic += a
            parts += p
        return atomic, parts

    def batches(self) -> bool:
        """Whether ``match_batch`` can beat ``match`` here: not while every cluster is small
        enough to be evaluated directly, as all are with few conditions in all."""
        return self._entries > self.small_cluster

    def match_batch(
        self, facts: Sequence[Mapping[str, Value]]
    ) -> list[tuple[list[Any], list[Any]]]:
        """``match`` for each of ``facts`` (the same results, in the same order), each cluster
        that enough of them visit matching its visitors in one pass."""
        routes: list[list[Cluster]] = []
        visitors: dict[Cluster, list[int]] = {}
        for i, attributes in enumerate(facts):
            route = self._route(attributes)
            for cluster in route:
                visitors.setdefault(cluster, []).append(i)
            routes.append(route)
        memos: list[dict[Test, bool]] = [{} for _ in facts]
        ahead = {
            cluster: iter(cluster.match_batch([facts[i] for i in which], [memos[i] for i in which]))
            for cluster, which in visitors.items()
            if cluster.batches(len(which))
        }
        out: list[tuple[list[Any], list[Any]]] = []
        for attributes, route, memo in zip(facts, routes, memos, strict=True):
            atomic: list[Any] = []
            parts: list[Any] = []
            for cluster in route:
                batched = ahead.get(cluster)
                a, p = cluster.match(attributes, memo) if batched is None else next(batched)
                atomic += a
                parts += p
            out.append((atomic, parts))
        return out
