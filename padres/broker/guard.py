"""Who may connect to a broker and what each client may ask of it, from its accounts.

A broker given ``Accounts`` admits a connection only with credentials (``Hello.user`` and
``password``, or ``token``) of an account that owns the name it asks for, and of the role it
claims: a neighbour broker must authenticate as a broker account. It then checks every request
of a client against the grants of its account, at the edge broker, where the request enters
the overlay (``docs/security.md``). Grants are read from the accounts as they are when a
request comes, so a changed file applies to the next request of every session; what was
accepted before stays until it is withdrawn or its client disconnects.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

from padres.errors import AuthenticationError
from padres.matching.matcher import matches
from padres.model.messages import (
    Advertisement,
    Filter,
    Predicate,
)
from padres.model.printer import format_filter, format_message
from padres.model.protocol import (
    DeclareSchema,
    DropSchema,
    Envelope,
    Exceptions,
    Failed,
    Hello,
    Query,
    ReplayBatch,
    ReplayOffer,
)
from padres.model.requests import composite_of, publication_of, subscription_of
from padres.security.accounts import CONTROL_CLASS, Account, Accounts, Grants, format_age
from rete.operators import Op

__all__ = ["CLOCK_SKEW", "Guard", "Reach", "admin_refusal", "routing_filter"]

CLOCK_SKEW: Final = 60.0
"""Seconds a historic subscription may start before what its history grant allows and still
be accepted: its client's clock and the broker's differ a little, and ``now-1h`` is read at the
client. The databases get the exact bound (``ReplayRequest.not_before``) all the same."""


def routing_filter(flt: Filter) -> Filter:
    """A composite part as an atomic filter: a variable predicate only asks for the attribute."""
    return Filter(
        tuple(
            Predicate(p.attribute, Op.IS_PRESENT) if p.variable is not None else p
            for p in flt.predicates
        ),
        flt.window,
    )


def _text(flt: Filter) -> str:
    """A filter without its time predicates, as grants are written."""
    return format_filter(Filter(flt.predicates))


class Reach:
    """Which ways a filter reaches at ``now``: into the past (answered by the databases),
    into the future (live), or both; as ``History.watch`` tells them apart."""

    def __init__(self, flt: Filter, now: float) -> None:
        at = datetime.fromtimestamp(now, UTC)
        window = flt.window
        self.start = None if window is None else window.start
        self.past = window is not None and (window.start is None or window.start < at)
        self.live = window is None or window.end is None or window.end > at


class Guard:
    """A broker's admission and grant checks over ``accounts`` (see the module docstring)."""

    def __init__(self, accounts: Accounts) -> None:
        self.accounts = accounts

    # -- admission ---------------------------------------------------------------------------

    def admit(self, hello: Hello, broker_id: str) -> Account:
        """The account ``hello`` authenticates; raises ``AuthenticationError`` saying why not."""
        what = "a broker link" if hello.role == "broker" else "a client"
        if hello.token:
            account = self.accounts.authenticate_token(hello.token)
            if hello.user and hello.user != account.name:
                raise AuthenticationError(f"the token is not one of user {hello.user!r}")
        elif hello.user:
            account = self.accounts.authenticate(hello.user, hello.password)
        else:
            raise AuthenticationError(
                f"broker {broker_id} requires authentication: {what} must give a user and "
                "password, or a token"
            )
        if account.role != hello.role:
            raise AuthenticationError(
                f"account {account.name!r} is a {account.role} account: it cannot open {what}"
            )
        if not account.owns(hello.name):
            names = ", ".join(account.names or (account.name,))
            raise AuthenticationError(
                f"account {account.name!r} may not use the name {hello.name!r} (its names: {names})"
            )
        return account

    def current(self, account: Account) -> Grants:
        """The grants ``account`` has now: the file may have changed since it connected (an
        account removed since has none)."""
        now = self.accounts.get(account.name)
        return Grants() if now is None else now.grants

    # -- requests ----------------------------------------------------------------------------

    def refusal(self, message: Envelope, account: Account, now: float) -> str | None:
        """Why ``account`` may not send ``message`` at ``now``, or None if it may."""
        grants = self.current(account)
        who = f"user {account.name!r}"
        pub = publication_of(message)
        if pub is not None:
            if grants.may_publish(pub):
                return None
            return _missing(who, "publish", format_message(pub), pub.class_name, "matches")
        sub = subscription_of(message)
        if sub is not None:
            return self._subscription(who, grants, sub.filter, now)
        composite = composite_of(message)
        if composite is not None:
            for part in composite.filters:
                why = self._subscription(who, grants, routing_filter(part), now)
                if why is not None:
                    return why
            return None
        match message:
            case Advertisement():
                if grants.may_advertise(message.filter):
                    return None
                text = _text(message.filter)
                return _missing(who, "advertise", text, message.filter.class_name)
            case ReplayOffer():
                flt = message.advertisement.filter
                if grants.may_offer(flt):
                    return None
                return f"{who} may not offer to replay {_text(flt)}: no replay grant covers it"
            case Query():
                return admin_refusal(grants, who, "read the routing tables")
            case DeclareSchema():
                return admin_refusal(grants, who, f"declare the schema of {message.class_name}")
            case DropSchema():
                return admin_refusal(grants, who, f"drop the schema of {message.class_name}")
            case Exceptions() if message.client and not account.owns(message.client):
                action = f"handle the exception queues of client {message.client!r}"
                return admin_refusal(grants, who, action)
            case Failed():
                # An exception queue keeps only what its client could have been delivered.
                pub = message.publication
                if any(matches(grant, pub) for grant in grants.subscribe):
                    return None
                return (
                    f"{who} may not put {format_message(pub)} into an exception queue: no "
                    "subscribe grant matches it"
                )
            case ReplayBatch():
                for pub in message.publications:
                    if not grants.may_replay(pub):
                        return (
                            f"{who} may not replay {format_message(pub)}: no replay grant "
                            "matches it"
                        )
                return None
            case _:
                return None

    def _subscription(self, who: str, grants: Grants, flt: Filter, now: float) -> str | None:
        reach = Reach(flt, now)
        text = _text(flt)
        if reach.live and not grants.may_subscribe(flt):
            return _missing(who, "subscribe", text, flt.class_name)
        if not reach.past:
            return None
        grant = grants.history_for(flt)
        if grant is None:
            return f"{who} may not read the history of {text}: no history grant covers it"
        if grant.max_age is None:
            return None
        earliest = now - grant.max_age
        if reach.start is None or reach.start.timestamp() < earliest - CLOCK_SKEW:
            since = datetime.fromtimestamp(earliest, UTC).isoformat(timespec="seconds")
            asked = "all of it" if reach.start is None else f"since {reach.start.isoformat()}"
            back = format_age(grant.max_age)
            return (
                f"{who} may read the history of {text} only {back} back (since {since}), "
                f"not {asked}: its history grant is {grant}"
            )
        return None

    def not_before(self, account: Account, flt: Filter, now: float) -> float | None:
        """The earliest publication time ``account`` may read of ``flt``'s history at ``now``
        (Unix seconds; None: any)."""
        grant = self.current(account).history_for(flt)
        if grant is None or grant.max_age is None:
            return None
        return now - grant.max_age


def admin_refusal(grants: Grants, who: str, action: str) -> str | None:
    """Why someone with ``grants`` may not ``action`` (an administrator's right), or None."""
    if grants.admin:
        return None
    return f"{who} may not {action}: it needs the admin right"


def _missing(who: str, right: str, text: str, class_name: str, verb: str = "covers") -> str:
    if class_name == CONTROL_CLASS and right in ("advertise", "publish"):
        return f"{who} may not {right} {text}: database control needs the admin right"
    target = f"to {text}" if right == "subscribe" else text
    return f"{who} may not {right} {target}: no {right} grant {verb} it"
