"""padres: distributed content-based publish/subscribe.

The public API: the message model, reading and writing PADRES text and the JSON wire format,
matching, the broker core and the client.
"""

from padres.batch import BatchReader, parse_batch
from padres.broker import Broker, Covering
from padres.client import BlockingClient, Client
from padres.errors import (
    CommandError,
    ConnectError,
    ConnectionLost,
    DecodeError,
    DuplicateId,
    InvalidMessage,
    JournalError,
    PadresError,
    ParseError,
    RequestFailed,
    StorageError,
    StoreError,
    StoreUnavailable,
    UnknownId,
)
from padres.matching import CompositeMatch, Matcher, MatchResult, filter_bindings, matches
from padres.messages import (
    Advertisement,
    AllOf,
    AnyOf,
    CompositeSubscription,
    Expression,
    Filter,
    Message,
    Predicate,
    Publication,
    Subscription,
    Unadvertise,
    Unsubscribe,
    Variable,
    VarType,
)
from padres.parser import (
    message_kind,
    parse_advertisement,
    parse_composite,
    parse_filter,
    parse_message,
    parse_publication,
    parse_subscription,
)
from padres.printer import format_batch_line, format_message
from padres.reference import ReferenceMatcher
from padres.rete_engine import ReteMatcher
from padres.wire import decode, encode
from rete.limits import CompositeLimits, Policy
from rete.operators import Op, Value

__all__ = [
    "Advertisement",
    "AllOf",
    "AnyOf",
    "BatchReader",
    "BlockingClient",
    "Broker",
    "Client",
    "CommandError",
    "CompositeLimits",
    "CompositeMatch",
    "CompositeSubscription",
    "ConnectError",
    "ConnectionLost",
    "Covering",
    "DecodeError",
    "DuplicateId",
    "Expression",
    "Filter",
    "InvalidMessage",
    "JournalError",
    "MatchResult",
    "Matcher",
    "Message",
    "Op",
    "PadresError",
    "ParseError",
    "Policy",
    "Predicate",
    "Publication",
    "ReferenceMatcher",
    "RequestFailed",
    "ReteMatcher",
    "StorageError",
    "StoreError",
    "StoreUnavailable",
    "Subscription",
    "Unadvertise",
    "UnknownId",
    "Unsubscribe",
    "Value",
    "VarType",
    "Variable",
    "decode",
    "encode",
    "filter_bindings",
    "format_batch_line",
    "format_message",
    "matches",
    "message_kind",
    "parse_advertisement",
    "parse_batch",
    "parse_composite",
    "parse_filter",
    "parse_message",
    "parse_publication",
    "parse_subscription",
]
