"""rete: a Rete matching network for attribute/value facts; it knows nothing of pub/sub.

Conditions are conjunctions of tests on a fact's attributes (``Test``), and composite conditions
(``Composite``) whose parts are joined on shared variables (``Bind``). The alpha network clusters
conditions by a hash-indexed equality test and indexes the rest per attribute: numeric ranges
in cell bitsets, equality / prefix / suffix / inequality tests in hash tables, other tests as
shared alpha nodes evaluated once per fact. The beta network joins composite parts through
memories hash-indexed on the shared variables. Conditions come and go at any time.
"""

from typing import TYPE_CHECKING, Final

from rete.lazy import lazy

if TYPE_CHECKING:  # what ``__getattr__`` loads, for type checkers: the same names and homes
    from rete.beta import Activation as Activation
    from rete.conditions import Bind as Bind
    from rete.conditions import Composite as Composite
    from rete.conditions import Conjunction as Conjunction
    from rete.conditions import Fact as Fact
    from rete.conditions import Test as Test
    from rete.limits import CompositeLimits as CompositeLimits
    from rete.limits import Policy as Policy
    from rete.network import DuplicateCondition as DuplicateCondition
    from rete.network import Network as Network
    from rete.network import Result as Result
    from rete.network import UnknownCondition as UnknownCondition
    from rete.operators import Op as Op
    from rete.operators import Value as Value
    from rete.operators import evaluate as evaluate

_HOMES: Final = {
    "Activation": "rete.beta",
    "Bind": "rete.conditions",
    "Composite": "rete.conditions",
    "Conjunction": "rete.conditions",
    "Fact": "rete.conditions",
    "Test": "rete.conditions",
    "CompositeLimits": "rete.limits",
    "Policy": "rete.limits",
    "DuplicateCondition": "rete.network",
    "Network": "rete.network",
    "Result": "rete.network",
    "UnknownCondition": "rete.network",
    "Op": "rete.operators",
    "Value": "rete.operators",
    "evaluate": "rete.operators",
}
"""Where each public name lives: imported on first use, so that the conditions and operators
(which the message model uses) load without the network and NumPy."""

__all__ = sorted(_HOMES)

__getattr__, __dir__ = lazy(globals(), _HOMES)
