"""Writing messages as PADRES text; ``parse`` of the output gives the same message back."""

from __future__ import annotations

from typing import Final

from padres.model.messages import (
    Absent,
    Advertisement,
    AllOf,
    CompositeSubscription,
    Expression,
    Filter,
    Message,
    Predicate,
    Publication,
    Sequence,
    Subscription,
    Temporal,
    Unadvertise,
    Unsubscribe,
    Variable,
)
from padres.model.times import window_predicates
from rete.operators import Op, Value

__all__ = [
    "format_batch_line",
    "format_filter",
    "format_message",
    "format_predicate",
    "format_value",
]

_ESCAPE: Final = str.maketrans({"\\": "\\\\", "'": "\\'", "\n": "\\n", "\r": "\\r", "\t": "\\t"})


def format_value(value: Value | Variable) -> str:
    if isinstance(value, Variable):
        return str(value)
    if type(value) is str:
        return "'" + value.translate(_ESCAPE) + "'"
    if type(value) is bool:
        return "true" if value else "false"
    return repr(value)


def format_predicate(p: Predicate) -> str:
    if p.op is Op.IS_PRESENT:
        return f"[{p.attribute},{p.op}]"
    assert p.value is not None
    return f"[{p.attribute},{p.op},{format_value(p.value)}]"


def format_filter(f: Filter) -> str:
    times = [f"[{a},{op},'{at}']" for a, op, at in window_predicates(f.window)]
    return ",".join([*(format_predicate(p) for p in f.predicates), *times])


def _expression(expr: Expression, nested: bool = False) -> str:
    if isinstance(expr, Filter):
        return "{" + format_filter(expr) + "}"
    if isinstance(expr, Absent):
        return "!{" + format_filter(expr.filter) + "}"
    if isinstance(expr, Sequence):
        joiner = " ;; " if expr.strict else " ; "
    else:
        joiner = " & " if isinstance(expr, AllOf) else " || "
    text = joiner.join(_expression(part, nested=True) for part in expr.parts)
    return f"({text})" if nested else text


def _clauses(temporal: Temporal) -> str:
    out = []
    if temporal.seconds is not None:
        out.append(f"within {_seconds(temporal.seconds)}")
    if temporal.events is not None:
        out.append(f"within {temporal.events} events")
    if temporal.late:
        out.append(f"late {_seconds(temporal.late)}")
    if temporal.consume is not None:
        out.append(f"consume {temporal.consume}")
    return "".join(" " + clause for clause in out)


def _seconds(seconds: float) -> str:
    short = f"{seconds:g}"
    return f"{short if float(short) == seconds else repr(float(seconds))}s"


def format_message(message: Message) -> str:
    """The message in PADRES syntax, without a command (ids and headers are not part of it)."""
    match message:
        case Publication():
            return ",".join(f"[{k},{format_value(v)}]" for k, v in message.attributes.items())
        case Subscription() | Advertisement():
            return format_filter(message.filter)
        case CompositeSubscription():
            temporal = message.temporal
            clauses = _clauses(temporal) if isinstance(temporal, Temporal) else ""
            return _expression(message.expression) + clauses
        case Unsubscribe():
            return message.subscription_id
        case Unadvertise():
            return message.advertisement_id


_COMMANDS: Final[dict[type, str]] = {
    Advertisement: "a",
    Publication: "p",
    Subscription: "s",
    CompositeSubscription: "cs",
    Unsubscribe: "us",
    Unadvertise: "ua",
}


def format_batch_line(message: Message) -> str:
    """The message as one line of a PADRES batch file: ``s [class,eq,'STOCK']``."""
    return f"{_COMMANDS[type(message)]} {format_message(message)}"
