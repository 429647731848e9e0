"""rete: a Rete matching network for attribute/value facts; it knows nothing of pub/sub.

Conditions are conjunctions of tests on a fact's attributes (``Test``), and composite conditions
(``Composite``) whose parts are joined on shared variables (``Bind``). The alpha network clusters
conditions by a hash-indexed equality test and indexes the rest per attribute: numeric ranges
in cell bitsets, equality / prefix / suffix / inequality tests in hash tables, other tests as
shared alpha nodes evaluated once per fact. The beta network joins composite parts through
memories hash-indexed on the shared variables. Conditions come and go at any time.
"""

from rete.beta import Activation
from rete.conditions import Bind, Composite, Conjunction, Fact, Test
from rete.limits import CompositeLimits, Policy
from rete.network import DuplicateCondition, Network, Result, UnknownCondition
from rete.operators import Op, Value, evaluate

__all__ = [
    "Activation",
    "Bind",
    "Composite",
    "CompositeLimits",
    "Conjunction",
    "DuplicateCondition",
    "Fact",
    "Network",
    "Op",
    "Policy",
    "Result",
    "Test",
    "UnknownCondition",
    "Value",
    "evaluate",
]
