"""padres: distributed content-based publish/subscribe.

The public API: the message model, reading and writing PADRES text and the JSON wire format,
matching, the broker core and the client.

Each name is imported from its module on first use (``padres.Client``, ``from padres import
Broker``): ``import padres``, and the command line, load only what they use.
"""

from typing import TYPE_CHECKING, Final

from rete.lazy import lazy

if TYPE_CHECKING:  # what ``__getattr__`` loads, for type checkers: the same names and homes
    from padres.broker import Broker as Broker
    from padres.broker import Covering as Covering
    from padres.client.connection import BlockingClient as BlockingClient
    from padres.client.connection import Client as Client
    from padres.client.transaction import Transaction as Transaction
    from padres.client.transaction import TransactionState as TransactionState
    from padres.errors import AccountsError as AccountsError
    from padres.errors import AuthenticationError as AuthenticationError
    from padres.errors import CommandError as CommandError
    from padres.errors import ConnectError as ConnectError
    from padres.errors import ConnectionLost as ConnectionLost
    from padres.errors import DecodeError as DecodeError
    from padres.errors import DuplicateId as DuplicateId
    from padres.errors import HostsError as HostsError
    from padres.errors import InvalidMessage as InvalidMessage
    from padres.errors import JournalError as JournalError
    from padres.errors import PadresError as PadresError
    from padres.errors import ParseError as ParseError
    from padres.errors import RequestFailed as RequestFailed
    from padres.errors import SchemaConflict as SchemaConflict
    from padres.errors import SchemaLimit as SchemaLimit
    from padres.errors import SchemaViolation as SchemaViolation
    from padres.errors import SlowConsumer as SlowConsumer
    from padres.errors import StorageError as StorageError
    from padres.errors import TLSError as TLSError
    from padres.errors import TransactionAborted as TransactionAborted
    from padres.errors import TransactionClosed as TransactionClosed
    from padres.errors import TransactionError as TransactionError
    from padres.errors import TransactionLimit as TransactionLimit
    from padres.errors import UnknownId as UnknownId
    from padres.language.batch import BatchReader as BatchReader
    from padres.language.batch import parse_batch as parse_batch
    from padres.language.parser import message_kind as message_kind
    from padres.language.parser import parse_advertisement as parse_advertisement
    from padres.language.parser import parse_composite as parse_composite
    from padres.language.parser import parse_filter as parse_filter
    from padres.language.parser import parse_message as parse_message
    from padres.language.parser import parse_publication as parse_publication
    from padres.language.parser import parse_subscription as parse_subscription
    from padres.matching.matcher import CompositeMatch as CompositeMatch
    from padres.matching.matcher import Matcher as Matcher
    from padres.matching.matcher import MatchResult as MatchResult
    from padres.matching.matcher import filter_bindings as filter_bindings
    from padres.matching.matcher import matches as matches
    from padres.matching.reference import ReferenceMatcher as ReferenceMatcher
    from padres.matching.rete_matcher import ReteMatcher as ReteMatcher
    from padres.model.codec import decode as decode
    from padres.model.codec import encode as encode
    from padres.model.messages import Absent as Absent
    from padres.model.messages import Advertisement as Advertisement
    from padres.model.messages import AllOf as AllOf
    from padres.model.messages import AnyOf as AnyOf
    from padres.model.messages import CompositeSubscription as CompositeSubscription
    from padres.model.messages import Expression as Expression
    from padres.model.messages import Filter as Filter
    from padres.model.messages import Message as Message
    from padres.model.messages import Predicate as Predicate
    from padres.model.messages import Publication as Publication
    from padres.model.messages import Sequence as Sequence
    from padres.model.messages import Subscription as Subscription
    from padres.model.messages import Temporal as Temporal
    from padres.model.messages import Unadvertise as Unadvertise
    from padres.model.messages import Unsubscribe as Unsubscribe
    from padres.model.messages import Variable as Variable
    from padres.model.messages import VarType as VarType
    from padres.model.printer import format_batch_line as format_batch_line
    from padres.model.printer import format_message as format_message
    from padres.model.protocol import Lost as Lost
    from padres.model.protocol import Outcome as Outcome
    from padres.model.protocol import Scope as Scope
    from padres.model.protocol import TxNotify as TxNotify
    from padres.model.protocol import Visibility as Visibility
    from padres.model.protocol import Vote as Vote
    from padres.security.accounts import Account as Account
    from padres.security.accounts import Accounts as Accounts
    from padres.security.accounts import Credentials as Credentials
    from padres.security.accounts import Grants as Grants
    from padres.security.accounts import HistoryGrant as HistoryGrant
    from rete.limits import CompositeLimits as CompositeLimits
    from rete.limits import Policy as Policy
    from rete.operators import Op as Op
    from rete.operators import Value as Value

_HOMES: Final = {
    "Broker": "padres.broker",
    "Covering": "padres.broker",
    "BlockingClient": "padres.client.connection",
    "Client": "padres.client.connection",
    "Transaction": "padres.client.transaction",
    "TransactionState": "padres.client.transaction",
    "AccountsError": "padres.errors",
    "AuthenticationError": "padres.errors",
    "CommandError": "padres.errors",
    "ConnectError": "padres.errors",
    "ConnectionLost": "padres.errors",
    "DecodeError": "padres.errors",
    "DuplicateId": "padres.errors",
    "HostsError": "padres.errors",
    "InvalidMessage": "padres.errors",
    "JournalError": "padres.errors",
    "PadresError": "padres.errors",
    "ParseError": "padres.errors",
    "RequestFailed": "padres.errors",
    "SchemaConflict": "padres.errors",
    "SchemaLimit": "padres.errors",
    "SchemaViolation": "padres.errors",
    "SlowConsumer": "padres.errors",
    "StorageError": "padres.errors",
    "TLSError": "padres.errors",
    "TransactionAborted": "padres.errors",
    "TransactionClosed": "padres.errors",
    "TransactionError": "padres.errors",
    "TransactionLimit": "padres.errors",
    "UnknownId": "padres.errors",
    "BatchReader": "padres.language.batch",
    "parse_batch": "padres.language.batch",
    "message_kind": "padres.language.parser",
    "parse_advertisement": "padres.language.parser",
    "parse_composite": "padres.language.parser",
    "parse_filter": "padres.language.parser",
    "parse_message": "padres.language.parser",
    "parse_publication": "padres.language.parser",
    "parse_subscription": "padres.language.parser",
    "CompositeMatch": "padres.matching.matcher",
    "MatchResult": "padres.matching.matcher",
    "Matcher": "padres.matching.matcher",
    "filter_bindings": "padres.matching.matcher",
    "matches": "padres.matching.matcher",
    "ReferenceMatcher": "padres.matching.reference",
    "ReteMatcher": "padres.matching.rete_matcher",
    "decode": "padres.model.codec",
    "encode": "padres.model.codec",
    "Absent": "padres.model.messages",
    "Advertisement": "padres.model.messages",
    "AllOf": "padres.model.messages",
    "AnyOf": "padres.model.messages",
    "CompositeSubscription": "padres.model.messages",
    "Expression": "padres.model.messages",
    "Filter": "padres.model.messages",
    "Message": "padres.model.messages",
    "Predicate": "padres.model.messages",
    "Publication": "padres.model.messages",
    "Sequence": "padres.model.messages",
    "Subscription": "padres.model.messages",
    "Temporal": "padres.model.messages",
    "Unadvertise": "padres.model.messages",
    "Unsubscribe": "padres.model.messages",
    "VarType": "padres.model.messages",
    "Variable": "padres.model.messages",
    "format_batch_line": "padres.model.printer",
    "format_message": "padres.model.printer",
    "Lost": "padres.model.protocol",
    "Outcome": "padres.model.protocol",
    "Scope": "padres.model.protocol",
    "TxNotify": "padres.model.protocol",
    "Visibility": "padres.model.protocol",
    "Vote": "padres.model.protocol",
    "Account": "padres.security.accounts",
    "Accounts": "padres.security.accounts",
    "Credentials": "padres.security.accounts",
    "Grants": "padres.security.accounts",
    "HistoryGrant": "padres.security.accounts",
    "CompositeLimits": "rete.limits",
    "Policy": "rete.limits",
    "Op": "rete.operators",
    "Value": "rete.operators",
}
"""Where each public name lives."""

__all__ = sorted(_HOMES)

__getattr__, __dir__ = lazy(globals(), _HOMES)
