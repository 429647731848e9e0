"""The broker: routing logic with no I/O (``Broker``), as the runtime and the simulation use it."""

from padres.broker.config import BrokerConfig
from padres.broker.core import Broker
from padres.broker.guard import routing_filter
from padres.broker.merging import Merging
from padres.broker.routes import Covering, Out

__all__ = ["Broker", "BrokerConfig", "Covering", "Merging", "Out", "routing_filter"]
