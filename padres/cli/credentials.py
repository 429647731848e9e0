"""The options with which a command authenticates to a broker that has accounts.

Commands of the packages above ``padres`` add these options when they are listed
(``padres --help``): the accounts module, which loads Argon2 and the matcher, is imported
only when the credentials are asked for."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from padres.security.accounts import Credentials

__all__ = ["add_credential_options", "credentials"]


def add_credential_options(p: argparse.ArgumentParser, who: str = "this client") -> None:
    group = p.add_argument_group(
        "authentication", f"what {who} gives a broker that has accounts (docs/security.md)"
    )
    group.add_argument("--user", help="account name (default: $PADRES_USER)")
    group.add_argument(
        "--password",
        help="the account's password (default: $PADRES_PASSWORD, which other users of the "
        "machine cannot read as they can a command line)",
    )
    group.add_argument("--token", help="a token instead of a password (default: $PADRES_TOKEN)")


def credentials(args: argparse.Namespace) -> Credentials:
    """The credentials the options give, completed from the environment."""
    from padres.security.accounts import Credentials

    return Credentials.from_env(args.user or "", args.password or "", args.token or "")
