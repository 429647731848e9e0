"""Who calls the web API, when the broker has accounts (``padres broker --accounts``,
docs/security.md): the same accounts as the broker's clients, with the same grants.

A caller authenticates with HTTP Basic authentication (user and password: a browser asks for
them), or a token (``Authorization: Bearer ptk_...``); a browser's ``EventSource`` and
``WebSocket``, which cannot set headers, may give the token as ``?access_token=``. What a caller
asks of the broker (publishing, advertising, subscribing, history) goes through sessions
that carry its account, so the broker applies its grants as it does to any client; reading
the broker (its tables, the overlay, metrics, traces) and commanding databases take the
``admin`` right. Without accounts, everyone may do everything, as on the broker's socket.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from dataclasses import dataclass
from typing import Final

from fastapi import Depends
from starlette.requests import HTTPConnection

from padres.errors import AuthenticationError
from padres.model.protocol import Role
from padres.runtime.node import BrokerNode
from padres.security.accounts import Account
from web.problems import Problem

__all__ = ["CHALLENGE", "Authenticator", "Caller"]

CHALLENGE: Final = {"WWW-Authenticate": 'Basic realm="padres", charset="UTF-8"'}


@dataclass(frozen=True)
class Caller:
    """Who is calling: ``account`` is None when the broker has no accounts."""

    account: Account | None = None

    @property
    def name(self) -> str:
        return "" if self.account is None else self.account.name

    def client(self, given: str | None) -> str:
        """The publisher a request names, by default ``web`` (the caller's user name when the
        broker has accounts); it must be a name the caller's account owns."""
        if self.account is None:
            return given or "web"
        name = given or self.account.name
        if not self.account.owns(name):
            names = ", ".join(self.account.names or (self.account.name,))
            raise Problem(
                403,
                "forbidden",
                f"user {self.account.name!r} may not publish as {name!r} (its names: {names})",
            )
        return name

    def owns(self, owner: str) -> bool:
        """Whether the caller may use what ``owner`` made through the API."""
        return self.account is None or self.account.name == owner


class Authenticator:
    """The web API's dependencies: ``caller`` for every route, ``admin`` for those that read
    or command the broker."""

    def __init__(self, node: BrokerNode) -> None:
        self.node = node
        calling = Depends(self.caller)

        async def admin(caller: Caller = calling) -> Caller:
            if caller.account is not None and not caller.account.grants.admin:
                raise Problem(
                    403,
                    "forbidden",
                    f"user {caller.account.name!r} is not an administrator: reading the broker "
                    "and commanding databases take the admin right",
                )
            return caller

        async def client_owner(client: str, caller: Caller = calling) -> Caller:
            """For routes about one client's things (``{client}`` in the path): its owner's
            account, or an administrator."""
            account = caller.account
            if account is not None and not (account.grants.admin or account.owns(client)):
                raise Problem(
                    403, "forbidden", f"user {account.name!r} does not own the client {client!r}"
                )
            return caller

        self.admin = admin
        self.client_owner = client_owner

    async def caller(self, connection: HTTPConnection) -> Caller:
        guard = self.node.broker.guard
        if guard is None:
            return Caller()
        header = connection.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        token = connection.query_params.get("access_token", "")
        try:
            if scheme.lower() == "basic":
                user, password = _basic(value.strip())
                # argon2 takes tens of milliseconds: off the event loop (the verdict is kept)
                account = await asyncio.to_thread(guard.accounts.authenticate, user, password)
            elif scheme.lower() == "bearer" or token:
                account = guard.accounts.authenticate_token(value.strip() or token)
            else:
                raise Problem(
                    401,
                    "authentication required",
                    "this broker has accounts: give a user and password (HTTP Basic) or a "
                    "token (Authorization: Bearer ...)",
                    headers=CHALLENGE,
                )
        except AuthenticationError as exc:
            raise Problem(401, "authentication failed", str(exc), headers=CHALLENGE) from None
        if account.role is not Role.CLIENT:
            raise Problem(
                403,
                "forbidden",
                f"account {account.name!r} is a {account.role} account: it cannot use the web API",
            )
        return Caller(account)


def _basic(value: str) -> tuple[str, str]:
    try:
        text = base64.b64decode(value, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise AuthenticationError(
            "the Basic credentials are not base64 of 'user:password'"
        ) from None
    user, colon, password = text.partition(":")
    if not colon:
        raise AuthenticationError("the Basic credentials are not of the form 'user:password'")
    return user, password
