"""The alpha network: conditions grouped into clusters by one hash-indexed equality test.

A condition's access test is one of its ``eq`` / ``=`` tests, chosen to keep clusters small: the
one whose cluster is smallest now, ties going to the attribute with the most distinct keyed
values, then to the later test (``class`` usually comes first and is the least selective).
Conditions without an equality test share the root cluster. A fact visits the root cluster and
the cluster of each of its ``(attribute, value)`` pairs: one dictionary lookup each.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from rete.cluster import Cluster, Entry
from rete.conditions import Test
from rete.keyed import tag
from rete.numeric import RANGE_OPS
from rete.operators import Op, Value

__all__ = ["AlphaNetwork"]

ClusterKey = tuple[str, str, Value] | None


class AlphaNetwork:
    def __init__(self) -> None:
        self.clusters: dict[ClusterKey, Cluster] = {}
        self.tests: Counter[Test] = Counter()
        """Every distinct test in use, with the number of conditions using it."""
        self._keyed_values: Counter[str] = Counter()

    def _access(self, tests: tuple[Test, ...]) -> tuple[ClusterKey, tuple[Test, ...]]:
        best: tuple[tuple[int, int, int], int, ClusterKey] | None = None
        for i, t in enumerate(tests):
            if t.op is Op.EQ or t.op is Op.EQ_NUM:
                assert t.operand is not None
                key: ClusterKey = (t.attribute, tag(t.operand), t.operand)
                cluster = self.clusters.get(key)
                score = (cluster.live if cluster else 0, -self._keyed_values[t.attribute], -i)
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
        key, rest = self._access(tests)
        required = binds | {t.attribute for t in rest if t.op not in RANGE_OPS}
        cluster = self.clusters.get(key)
        if cluster is None:
            cluster = self.clusters[key] = Cluster(key)
            if key is not None:
                self._keyed_values[key[0]] += 1
        entry = Entry(target, is_part, rest, required, key)
        cluster.insert(entry)
        self.tests.update(tests)
        return entry

    def remove(self, entry: Entry, tests: tuple[Test, ...]) -> None:
        key = entry.key
        cluster = self.clusters[key]
        cluster.delete(entry)
        if not cluster.live:
            del self.clusters[key]
            if key is not None:
                self._keyed_values[key[0]] -= 1
                if not self._keyed_values[key[0]]:
                    del self._keyed_values[key[0]]
        elif cluster.wasteful:
            self.clusters[key] = cluster.compacted()
        self.tests.subtract(tests)
        for t in tests:
            if self.tests[t] <= 0:
                del self.tests[t]

    def match(self, attributes: Mapping[str, Value]) -> tuple[list[Any], list[Any]]:
        """The targets ``attributes`` satisfies: (conditions, composite parts)."""
        memo: dict[Test, bool] = {}
        atomic: list[Any] = []
        parts: list[Any] = []
        clusters = self.clusters
        visit = [clusters[None]] if None in clusters else []
        for attribute, value in attributes.items():
            cluster = clusters.get((attribute, tag(value), value))
            if cluster is not None:
                visit.append(cluster)
        for cluster in visit:
            a, p = cluster.match(attributes, memo)
            atomic += a
            parts += p
        return atomic, parts
