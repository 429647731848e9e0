"""A broker's settings: plain values, one frozen dataclass.

Each field's docstring says what it does; ``padres broker`` makes its command-line options from
them (``padres.cli.config``). A field's ``metadata`` tells the command line what the docstring
and the type do not:

- ``option``: the option's name, if not ``--`` and the field's name with dashes; None: none;
- ``help``: the option's help, if the docstring does not fit it (a flag that turns a default on
  setting off, say);
- ``metavar``: what the help calls the option's value, if not ``N`` or ``SECONDS``;
- ``prefix``: for a group of settings (a dataclass), what its fields' options start with;
- ``fields``: for a group, the only fields that are options, each with its own metadata.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from padres.broker.merging import Merging
from padres.broker.paths import Switching
from padres.broker.quotas import Quotas
from padres.broker.routes import Covering
from padres.broker.transactions import TxLimits
from rete import CompositeLimits

__all__ = ["BrokerConfig"]


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """What a broker is set to (``Broker(id, config=...)``)."""

    covering: Covering = Covering.LAZY
    """How a subscription covered by one already forwarded is handled: off (forwarded all
    the same), lazy (not forwarded), active (forwarding a subscription also withdraws those
    it covers)."""
    merging: Merging = field(
        default=Merging(),
        metadata={
            "fields": {
                "enabled": {"option": "--merging"},
                "imperfect": {"option": "--merge-imperfect", "metavar": "RATE"},
            }
        },
    )
    """Whether the subscriptions forwarded to one neighbour are merged into fewer filters
    (docs/architecture.md, "Merging")."""
    conformity: bool = field(
        default=True,
        metadata={
            "option": "--no-conformity",
            "help": "route publications that match none of their publisher's advertisements",
        },
    )
    """Refuse a publication that matches none of its publisher's advertisements (it could
    not be routed reliably)."""
    composites: CompositeLimits = field(
        default=CompositeLimits(),
        metadata={
            "fields": {
                "distinct": {
                    "option": "--one-for-many",
                    "help": "one publication may fill several parts of a composite "
                    "subscription, as in PADRES",
                }
            }
        },
    )
    """Bounds on the partial state of each composite subscription."""
    epoch: str = field(default="0", metadata={"option": None})
    """Makes the overlay-wide ids this broker assigns differ from those of an earlier run
    under the same id."""
    memory: float = field(default=60.0, metadata={"option": None})
    """Seconds a withdrawn advertisement's id is remembered, so that a late copy still
    travelling a longer path of a cyclic overlay is not taken for a new one."""
    replay_delay: float = 0.5
    """Seconds a database waits past a historic query's end before it answers, so that
    publications on their way are stored first."""
    durable_expiry: float = 0.0
    """Seconds a durable subscription is kept while its client is away; then it is dropped,
    with what it queued (0: kept until its client unsubscribes). A client that moved to
    another broker leaves its subscription behind: this lets go of it."""
    replay_timeout: float = 30.0
    """A historic request fails when its database has sent nothing for this many seconds."""
    quotas: Quotas = field(default=Quotas(), metadata={"prefix": "max-"})
    """How much one client may hold, and how many schemas the overlay may."""
    transactions: TxLimits = field(
        default=TxLimits(),
        metadata={
            "prefix": "tx-",
            "fields": {"timeout": {}, "linger": {}, "max_publications": {}},
        },
    )
    """The limits and timeouts of the clients' transactions."""
    switching: Switching = field(
        default=Switching(),
        metadata={
            "prefix": "switch-",
            "fields": {
                "adaptive": {
                    "option": "--no-adaptive-paths",
                    "help": "keep each tree's parent until the link to it is lost, however "
                    "slow it is or long it stays silent (no measured paths)",
                },
                "ratio": {"metavar": "RATIO"},
                "gain": {},
                "hold": {},
            },
        },
    )
    """When a tree moves to a better way to its root (``padres.broker.paths``)."""
