"""``padres user``: manage a brokers' accounts file (``padres.security.accounts``,
docs/security.md)."""

from __future__ import annotations

import argparse
import getpass
import os
import sys

from padres.errors import CommandError
from padres.model.printer import format_filter
from padres.model.protocol import Role
from padres.security.accounts import (
    CONTROL_CLASS,
    RIGHTS,
    STATUS_CLASS,
    Account,
    Accounts,
    database_grants,
    format_age,
    parse_age,
)

__all__ = ["arguments"]

DEFAULT_FILE = "accounts.toml"


def arguments(p: argparse.ArgumentParser) -> None:
    where = f"the accounts file (default: $PADRES_ACCOUNTS or {DEFAULT_FILE})"
    p.add_argument(
        "--accounts",
        metavar="FILE",
        default=os.environ.get("PADRES_ACCOUNTS", DEFAULT_FILE),
        help=where,
    )
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    add = sub.add_parser("add", help="add an account (asks for its password)")
    add.add_argument("name")
    add.add_argument("--role", choices=[r.value for r in Role], default=Role.CLIENT.value)
    add.add_argument(
        "--name",
        dest="names",
        action="append",
        default=[],
        metavar="NAME",
        help="a client name or broker id it may use, 'prefix*' for all that begin so "
        "(repeatable; default: the account's name)",
    )
    add.add_argument("--admin", action="store_true", help="database control, schemas, queries")
    add.add_argument(
        "--database",
        action="store_true",
        help=f"the account of a database node named after it: it may read its {CONTROL_CLASS} "
        f"commands and publish its {STATUS_CLASS} answers (grant subscribe and replay for "
        "what it may store)",
    )
    _password_options(add, token_only=True)
    add.set_defaults(run=_add)

    passwd = sub.add_parser("passwd", help="set an account's password")
    passwd.add_argument("name")
    _password_options(passwd)
    passwd.set_defaults(run=_passwd)

    rights = ", ".join((*RIGHTS, "admin"))
    grant = sub.add_parser("grant", help=f"give a right: {rights}")
    grant.add_argument("name")
    grant.add_argument("right", choices=[*RIGHTS, "admin"])
    grant.add_argument("filter", nargs="?", help="the filter it covers (not for admin)")
    grant.add_argument(
        "--max-age",
        metavar="AGE",
        help="history only: how far back it reaches, 90s, 15m, 12h, 30d or 2w (default: all)",
    )
    grant.set_defaults(run=_grant)

    revoke = sub.add_parser("revoke", help="take a right back")
    revoke.add_argument("name")
    revoke.add_argument("right", choices=[*RIGHTS, "admin"])
    revoke.add_argument("filter", nargs="?", help="the filter as granted (not for admin)")
    revoke.set_defaults(run=_revoke)

    names = sub.add_parser("names", help="set the client names or broker ids an account owns")
    names.add_argument("name")
    names.add_argument("names", nargs="+", metavar="OWNED", help="a name, or 'prefix*'")
    names.set_defaults(run=_names)

    listing = sub.add_parser("list", help="the accounts and their grants (no secrets)")
    listing.add_argument("name", nargs="?", help="only this account")
    listing.set_defaults(run=_list)

    remove = sub.add_parser("remove", help="remove an account")
    remove.add_argument("name")
    remove.set_defaults(run=_remove)

    token = sub.add_parser("token", help="tokens: add (printed once), list, remove")
    tokens = token.add_subparsers(dest="token_action", required=True, metavar="ACTION")
    token_add = tokens.add_parser("add", help="make a token and print it (only its hash is kept)")
    token_add.add_argument("name")
    token_add.add_argument("--label", default="", help="what the token is for")
    token_add.set_defaults(run=_token_add)
    token_list = tokens.add_parser("list", help="an account's tokens: id and label")
    token_list.add_argument("name")
    token_list.set_defaults(run=_token_list)
    token_remove = tokens.add_parser("remove", help="revoke a token by its id")
    token_remove.add_argument("name")
    token_remove.add_argument("id")
    token_remove.set_defaults(run=_token_remove)
    # ``--accounts`` after the action too (``padres user add NAME --accounts FILE``); given
    # there, it overrides the one before it.
    for action in [*sub.choices.values(), *tokens.choices.values()]:
        action.add_argument("--accounts", metavar="FILE", default=argparse.SUPPRESS, help=where)


def _password_options(p: argparse.ArgumentParser, *, token_only: bool = False) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--password",
        help="the password (default: $PADRES_NEW_PASSWORD, else asked for; a command line can "
        "be read by other users of the machine)",
    )
    group.add_argument(
        "--password-stdin", action="store_true", help="read the password from standard input"
    )
    if token_only:
        group.add_argument(
            "--no-password", action="store_true", help="no password: the account uses tokens"
        )


def _password(args: argparse.Namespace) -> str:
    if getattr(args, "no_password", False):
        return ""
    if args.password:
        return str(args.password)
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    elif os.environ.get("PADRES_NEW_PASSWORD"):
        password = os.environ["PADRES_NEW_PASSWORD"]
    elif sys.stdin.isatty():
        password = getpass.getpass(f"password for {args.name}: ")
        if getpass.getpass("again: ") != password:
            raise CommandError("the passwords differ")
    else:
        raise CommandError("no password: give --password, --password-stdin or --no-password")
    if not password:
        raise CommandError("the password is empty")
    return password


def _open(args: argparse.Namespace, *, create: bool = False) -> Accounts:
    return Accounts(args.accounts, create=create)


def _add(args: argparse.Namespace) -> int:
    accounts = _open(args, create=True)
    password = _password(args)
    names = args.names or [args.name]
    accounts.add(args.name, password, role=Role(args.role), names=names, admin=args.admin)
    if args.database:
        for name in names:
            for right, text in database_grants(name):
                accounts.grant(args.name, right, text)
    print(f"added {args.role} account {args.name} to {accounts.path}")
    return 0


def _passwd(args: argparse.Namespace) -> int:
    accounts = _open(args)
    accounts.describe(args.name)
    accounts.set_password(args.name, _password(args))
    print(f"password of {args.name} changed")
    return 0


def _filter_needed(args: argparse.Namespace) -> str:
    if args.right == "admin":
        if args.filter is not None:
            raise CommandError("the admin right takes no filter")
        return ""
    if args.filter is None:
        raise CommandError(f"a {args.right} right needs a filter, such as \"[class,eq,'Order']\"")
    return str(args.filter)


def _grant(args: argparse.Namespace) -> int:
    accounts = _open(args)
    text = _filter_needed(args)
    if args.right == "admin":
        accounts.set_admin(args.name, True)
    else:
        age = None if args.max_age is None else parse_age(args.max_age)
        if age is not None and args.right != "history":
            raise CommandError("--max-age bounds history grants only")
        accounts.grant(args.name, args.right, text, max_age=age)
    print(_describe(accounts.describe(args.name)))
    return 0


def _revoke(args: argparse.Namespace) -> int:
    accounts = _open(args)
    text = _filter_needed(args)
    if args.right == "admin":
        accounts.set_admin(args.name, False)
    else:
        accounts.revoke(args.name, args.right, text)
    print(_describe(accounts.describe(args.name)))
    return 0


def _names(args: argparse.Namespace) -> int:
    accounts = _open(args)
    accounts.set_names(args.name, args.names)
    print(_describe(accounts.describe(args.name)))
    return 0


def _list(args: argparse.Namespace) -> int:
    accounts = _open(args)
    chosen = [accounts.describe(args.name)] if args.name else list(accounts)
    for account in chosen:
        print(_describe(account))
    return 0


def _remove(args: argparse.Namespace) -> int:
    accounts = _open(args)
    accounts.remove(args.name)
    print(f"removed account {args.name}")
    return 0


def _token_add(args: argparse.Namespace) -> int:
    accounts = _open(args)
    print(accounts.add_token(args.name, args.label))
    print("keep it now: it is not shown again", file=sys.stderr)
    return 0


def _token_list(args: argparse.Namespace) -> int:
    accounts = _open(args)
    for token in accounts.tokens(args.name):
        print(f"{token['id']}  {token.get('label', '')}".rstrip())
    return 0


def _token_remove(args: argparse.Namespace) -> int:
    accounts = _open(args)
    accounts.remove_token(args.name, args.id)
    print(f"token {args.id} of {args.name} revoked")
    return 0


def _describe(account: Account) -> str:
    grants = account.grants
    head = f"{account.name} ({account.role}{', admin' if grants.admin else ''})"
    lines = [head, f"  names: {', '.join(account.names or (account.name,))}"]
    for right in ("advertise", "publish", "subscribe", "replay"):
        for flt in getattr(grants, right):
            lines.append(f"  {right} {format_filter(flt)}")
    for history in grants.history:
        age = "" if history.max_age is None else f" --max-age {format_age(history.max_age)}"
        lines.append(f"  history {format_filter(history.filter)}{age}")
    return "\n".join(lines)
