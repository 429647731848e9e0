"""Accounts: who may connect to a broker, under which names, and what each may do.

An accounts file (TOML, written by ``padres user``) holds one table per account::

    [accounts.shop]
    role = "client"                       # or "broker": the account of a broker's links
    password = "$argon2id$v=19$..."       # an argon2 hash, never the password itself
    names = ["shop", "shop.*"]            # the client names it may use ('*' ends a prefix)
    advertise = ["[class,eq,'Order'],[region,eq,'EU']"]
    publish = ["[class,eq,'Order'],[region,eq,'EU']"]
    subscribe = ["[class,eq,'Invoice'],[region,eq,'EU']"]
    history = [{ filter = "[class,eq,'Order'],[region,eq,'EU']", max_age = 86400 }]
    replay = []                           # what a database may offer to replay
    admin = false
    tokens = [{ id = "3f9a0c1d", hash = "sha256:...", label = "ci" }]

Grants are filters in the language, compared with the covering relation the router uses
(``padres.matching.relations.covers``): an advertisement or a subscription is allowed when one
grant of its kind covers it (every publication it can match, the grant matches too), a
publication when it matches one publish grant. ``docs/security.md`` describes the model.

Checking a password costs tens of milliseconds by design (argon2). ``Accounts.authenticate``
remembers its verdicts for each (user, secret) until the file changes, so a caller that must
not block (an event loop) verifies once off its thread (``asyncio.to_thread``) and the same
call made again on its own thread answers at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import tempfile
import threading
import tomllib
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import tomli_w
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from padres.errors import AccountsError, AuthenticationError, InvalidMessage
from padres.language.parser import parse_filter
from padres.matching.matcher import matches
from padres.matching.relations import covers
from padres.model.messages import Filter, Publication, check_id
from padres.model.printer import format_filter
from padres.model.protocol import Hello, Role

__all__ = [
    "CONTROL_CLASS",
    "RIGHTS",
    "STATUS_CLASS",
    "TOKEN_PREFIX",
    "Account",
    "Accounts",
    "Credentials",
    "Grants",
    "HistoryGrant",
    "Role",
    "database_grants",
    "format_age",
    "parse_age",
]

log = logging.getLogger("padres.security.accounts")

CONTROL_CLASS: Final = "DB_CONTROL"
"""The class of database commands: only an administrator advertises or publishes it."""
STATUS_CLASS: Final = "DB_STATUS"
"""The class of the databases' answers: an administrator may always subscribe to it."""
RIGHTS: Final = ("advertise", "publish", "subscribe", "history", "replay")
"""The kinds of grant, as ``padres user grant`` names them."""
TOKEN_PREFIX: Final = "ptk_"
"""Tokens read ``ptk_<id>_<secret>``: the id finds the account, the secret proves it."""
TOKEN_REFUSED: Final = "authentication failed: unknown or revoked token"
"""The one refusal of a token, whether its id is unknown or its secret wrong."""
_VERDICTS: Final = 4096
"""Password verdicts remembered at most (the oldest are forgotten first)."""


def _grant_filter(text: str, right: str) -> Filter:
    try:
        flt = parse_filter(text)
    except InvalidMessage as exc:
        raise AccountsError(f"{right} grant {text!r} is not a filter: {exc}") from exc
    if flt.window is not None:
        raise AccountsError(
            f"{right} grant {text!r} has time predicates: bound how far back a history grant "
            "reaches with max_age instead"
        )
    if flt.variables:
        raise AccountsError(f"{right} grant {text!r} has variables: a grant is a plain filter")
    return flt


_UNITS: Final = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_age(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``15m``, ``12h``, ``30d`` or ``2w``."""
    text = text.strip()
    unit = _UNITS.get(text[-1:], None)
    number = text[:-1] if unit is not None else text
    try:
        seconds = float(number) * (unit or 1.0)
    except ValueError:
        raise AccountsError(f"{text!r} is not an age (say 90, 15m, 12h, 30d or 2w)") from None
    if not seconds > 0:
        raise AccountsError(f"an age must be positive, not {text!r}")
    return seconds


def format_age(seconds: float) -> str:
    """``seconds`` in the largest unit ``parse_age`` reads that states it exactly."""
    for unit, size in sorted(_UNITS.items(), key=lambda item: -item[1]):
        if seconds >= size and (seconds / size).is_integer():
            return f"{int(seconds / size)}{unit}"
    return f"{seconds:g}s"


def database_grants(db_id: str) -> tuple[tuple[str, str], ...]:
    """The grants (right, filter) a database node named ``db_id`` needs to be controlled:
    reading the ``DB_CONTROL`` publications addressed to it (by ``db`` or by PADRES'
    ``database_id``) and advertising and publishing its ``DB_STATUS`` answers."""
    status = f"[class,eq,'{STATUS_CLASS}'],[db,eq,'{db_id}']"
    return (
        ("advertise", status),
        ("publish", status),
        ("subscribe", f"[class,eq,'{CONTROL_CLASS}'],[db,eq,'{db_id}']"),
        ("subscribe", f"[class,eq,'{CONTROL_CLASS}'],[database_id,str-postfix,'{db_id}']"),
    )


@dataclass(frozen=True)
class HistoryGrant:
    """The holder may read stored publications matching ``filter`` published at most
    ``max_age`` seconds before the request (any time back when None)."""

    filter: Filter
    max_age: float | None = None

    def __str__(self) -> str:
        age = "any age" if self.max_age is None else f"at most {format_age(self.max_age)} old"
        return f"{format_filter(self.filter)} ({age})"


_CONTROL: Final = parse_filter(f"[class,eq,'{CONTROL_CLASS}']")
_STATUS: Final = parse_filter(f"[class,eq,'{STATUS_CLASS}']")


@dataclass(frozen=True)
class Grants:
    """What an account may do, each right a tuple of filters (see the module docstring).

    ``admin``: database control (advertising and publishing ``DB_CONTROL``, which nobody else
    may, and subscribing to ``DB_STATUS``), schema declarations and broker administration
    (reading the routing tables)."""

    advertise: tuple[Filter, ...] = ()
    publish: tuple[Filter, ...] = ()
    subscribe: tuple[Filter, ...] = ()
    history: tuple[HistoryGrant, ...] = ()
    replay: tuple[Filter, ...] = ()
    """What the holder (a database) may offer to replay, and replay: its answers are taken
    as the history of the publications they hold, whoever published them."""
    admin: bool = False

    def may_advertise(self, flt: Filter) -> bool:
        if flt.class_name == CONTROL_CLASS:
            return self.admin
        return any(covers(grant, flt) for grant in self.advertise)

    def may_publish(self, pub: Publication) -> bool:
        if pub.class_name == CONTROL_CLASS:
            return self.admin
        return any(matches(grant, pub) for grant in self.publish)

    def may_subscribe(self, flt: Filter) -> bool:
        """Whether live publications matching ``flt`` may be delivered (time predicates are
        not compared: see ``history_for``)."""
        if self.admin and covers(_STATUS, flt):
            return True
        return any(covers(grant, flt) for grant in self.subscribe)

    def history_for(self, flt: Filter) -> HistoryGrant | None:
        """The history grant covering ``flt`` that reaches back furthest, if any."""
        best: HistoryGrant | None = None
        for grant in self.history:
            if covers(grant.filter, flt) and (
                best is None
                or grant.max_age is None
                or (best.max_age is not None and grant.max_age > best.max_age)
            ):
                best = grant
                if grant.max_age is None:
                    break
        return best

    def may_offer(self, flt: Filter) -> bool:
        return any(covers(grant, flt) for grant in self.replay)

    def may_replay(self, pub: Publication) -> bool:
        return any(matches(grant, pub) for grant in self.replay)


@dataclass(frozen=True)
class Account:
    """One entry of the accounts file, without its secrets."""

    name: str
    role: Role = Role.CLIENT
    """A client, or a broker (the account authenticates that broker's links)."""
    names: tuple[str, ...] = ()
    """The client names (database ids, publisher names) or broker ids the account may use; a
    name ending in ``*`` stands for every name it begins. Empty means the account's own name."""
    grants: Grants = field(default_factory=Grants)

    def owns(self, name: str) -> bool:
        """Whether the account may connect under ``name``."""
        for own in self.names or (self.name,):
            if own == name or (own.endswith("*") and name.startswith(own[:-1])):
                return True
        return False


@dataclass(frozen=True)
class _Entry:
    account: Account
    password: str
    tokens: Mapping[str, str]
    """Token id -> ``sha256:<hex>`` of the whole token."""


def _token_digest(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode(errors="surrogatepass")).hexdigest()


_DECOY_DIGEST: Final = _token_digest(TOKEN_PREFIX + "decoy")
"""Compared with a token whose id is unknown, so that it takes as long as a known one."""


def _strings(raw: Mapping[str, Any], key: str, where: str) -> list[str]:
    value = raw.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise AccountsError(f"{where}: {key} must be a list of strings")
    return value


def _entry(name: str, raw: Any) -> _Entry:
    where = f"account {name!r}"
    if not isinstance(raw, dict):
        raise AccountsError(f"{where} must be a table")
    try:
        check_id(name, "account name")
        role = Role(raw.get("role", "client"))
    except (InvalidMessage, ValueError) as exc:
        raise AccountsError(f"{where}: {exc}") from None
    password = raw.get("password", "")
    if not isinstance(password, str):
        raise AccountsError(f"{where}: password must be an argon2 hash (a string)")
    history: list[HistoryGrant] = []
    for item in raw.get("history", []):
        if isinstance(item, str):
            item = {"filter": item}
        if not isinstance(item, dict) or not isinstance(item.get("filter"), str):
            raise AccountsError(f"{where}: a history grant is a filter or {{filter, max_age}}")
        age = item.get("max_age")
        if age is not None and (isinstance(age, bool) or not isinstance(age, int | float)):
            raise AccountsError(f"{where}: max_age must be a number of seconds")
        if age is not None and not age > 0:
            raise AccountsError(f"{where}: max_age must be positive")
        history.append(
            HistoryGrant(
                _grant_filter(item["filter"], "history"), None if age is None else float(age)
            )
        )
    admin = raw.get("admin", False)
    if not isinstance(admin, bool):
        raise AccountsError(f"{where}: admin must be true or false")
    grants = Grants(
        advertise=tuple(_grant_filter(t, "advertise") for t in _strings(raw, "advertise", where)),
        publish=tuple(_grant_filter(t, "publish") for t in _strings(raw, "publish", where)),
        subscribe=tuple(_grant_filter(t, "subscribe") for t in _strings(raw, "subscribe", where)),
        history=tuple(history),
        replay=tuple(_grant_filter(t, "replay") for t in _strings(raw, "replay", where)),
        admin=admin,
    )
    tokens: dict[str, str] = {}
    for token in raw.get("tokens", []):
        if not isinstance(token, dict) or not all(
            isinstance(token.get(k), str) for k in ("id", "hash")
        ):
            raise AccountsError(f"{where}: a token is a table with id and hash")
        tokens[token["id"]] = token["hash"]
    names = tuple(_strings(raw, "names", where))
    return _Entry(Account(name, role, names, grants), password, tokens)


class Accounts:
    """The accounts of one file: authentication, look-up, reloading and editing.

    ``hasher`` hashes new passwords (its parameters are stored in each hash, so verifying
    follows the hash whatever hasher made it). A missing file is an error unless ``create``
    (then it is written on the first change)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        hasher: PasswordHasher | None = None,
        create: bool = False,
    ) -> None:
        self.path = Path(path)
        self.hasher = hasher or PasswordHasher()
        self._doc: dict[str, Any] = {"accounts": {}}
        self._entries: dict[str, _Entry] = {}
        self._owners: dict[str, str] = {}
        """Token id -> account name."""
        self._verdicts: OrderedDict[tuple[str, bytes], Account | str] = OrderedDict()
        self._stamp: tuple[int, int, int] | None = None
        self._lock = threading.Lock()
        """Guards ``_verdicts``: ``authenticate`` may run on worker threads."""
        self._decoy_hash = ""
        """A hash no secret matches, checked for unknown users (``_verify``)."""
        self._generation = 0
        """Counts the readings of the file: a verdict reached on an older one is not kept."""
        if create and not self.path.exists():
            return
        self._load()

    # -- reading -----------------------------------------------------------------------------

    def _file_stamp(self) -> tuple[int, int, int]:
        st = self.path.stat()
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _load(self) -> None:
        try:
            stamp = self._file_stamp()
            doc = tomllib.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise AccountsError(
                f"no accounts file {self.path} (make one with 'padres user add')"
            ) from None
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise AccountsError(f"cannot read the accounts file {self.path}: {exc}") from exc
        table = doc.get("accounts", {})
        if not isinstance(table, dict):
            raise AccountsError(f"{self.path}: 'accounts' must be a table")
        try:
            entries = {name: _entry(name, raw) for name, raw in table.items()}
        except AccountsError as exc:
            raise AccountsError(f"{self.path}: {exc}") from None
        self._doc = doc
        self._entries = entries
        self._owners = {tid: name for name, e in entries.items() for tid in e.tokens}
        self._forget_verdicts()
        self._stamp = stamp

    def _forget_verdicts(self) -> None:
        with self._lock:
            self._verdicts.clear()
            self._generation += 1

    def refresh(self) -> bool:
        """Read the file again if it changed since it was read; whether it was.

        A file that has become unreadable or invalid is not taken: the accounts stay as they
        were and the problem is logged (it is tried again at the next change)."""
        try:
            stamp = self._file_stamp()
        except OSError:
            stamp = None
        if stamp == self._stamp:
            return False
        try:
            self._load()
        except AccountsError as exc:
            self._stamp = stamp
            log.error("%s; the accounts read before stay in force", exc)
            return False
        log.info("accounts reloaded from %s: %d accounts", self.path, len(self._entries))
        return True

    def get(self, name: str) -> Account | None:
        entry = self._entries.get(name)
        return None if entry is None else entry.account

    def __iter__(self) -> Iterator[Account]:
        return (e.account for _, e in sorted(self._entries.items()))

    def __len__(self) -> int:
        return len(self._entries)

    def tokens(self, name: str) -> list[dict[str, str]]:
        """The account's tokens as stored: id, label and hash (never the token)."""
        raw = self._raw(name)
        return [dict(t) for t in raw.get("tokens", [])]

    # -- authentication ----------------------------------------------------------------------

    def authenticate(self, user: str, secret: str) -> Account:
        """The account ``user`` if ``secret`` is its password or one of its tokens; raises
        ``AuthenticationError`` otherwise (the same message whether the user exists or not).

        Each verdict is remembered until the file changes (see the module docstring)."""
        key = (user, hashlib.sha256(secret.encode(errors="surrogatepass")).digest())
        with self._lock:
            verdict = self._verdicts.get(key)
            generation = self._generation
            if verdict is not None:
                self._verdicts.move_to_end(key)
        if verdict is None:
            verdict = self._verify(user, secret)
            with self._lock:
                if generation == self._generation:
                    self._verdicts[key] = verdict
                    while len(self._verdicts) > _VERDICTS:
                        self._verdicts.popitem(last=False)
        if isinstance(verdict, str):
            raise AuthenticationError(verdict)
        return verdict

    def authenticate_token(self, token: str) -> Account:
        """The account holding ``token``; raises ``AuthenticationError``, with one message
        and in one time whether the token's id is unknown or its secret is wrong."""
        tid = _token_id(token) or ""
        entry = self._entries.get(self._owners.get(tid, ""))
        stored = entry.tokens.get(tid) if entry is not None else None
        if not hmac.compare_digest(stored or _DECOY_DIGEST, _token_digest(token)) or not entry:
            raise AuthenticationError(TOKEN_REFUSED)
        return entry.account

    def _decoy(self) -> str:
        if not self._decoy_hash:
            self._decoy_hash = self.hasher.hash(secrets.token_hex(16))
        return self._decoy_hash

    def _verify(self, user: str, secret: str) -> Account | str:
        """The account, or why not: one message, and one password hash checked, whether the
        user is unknown, holds tokens only, or gave a wrong password or token."""
        if not secret:  # refused alike for every user, without the cost of a hash
            return f"authentication failed for user {user!r}: no password or token given"
        entry = self._entries.get(user)
        tid = _token_id(secret)
        stored = entry.tokens.get(tid) if entry is not None and tid is not None else None
        if entry is not None and stored and hmac.compare_digest(stored, _token_digest(secret)):
            return entry.account
        password = entry.password if entry is not None else ""
        with contextlib.suppress(VerificationError, InvalidHashError):  # the decoy matches none
            if self.hasher.verify(password or self._decoy(), secret) and entry and password:
                return entry.account
        return f"authentication failed for user {user!r}: unknown user or wrong password"

    # -- editing -----------------------------------------------------------------------------

    def _raw(self, name: str) -> dict[str, Any]:
        raw = self._doc.setdefault("accounts", {}).get(name)
        if raw is None:
            raise AccountsError(f"no account {name!r} in {self.path}")
        assert isinstance(raw, dict)
        return raw

    def _save(self) -> None:
        """Write the document atomically (a reader sees the old file or the new one) and take
        it as read."""
        table = self._doc.setdefault("accounts", {})
        entries = {name: _entry(name, raw) for name, raw in table.items()}
        text = "# padres accounts: edit with 'padres user'\n" + tomli_w.dumps(self._doc)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._entries = entries
        self._owners = {tid: name for name, e in entries.items() for tid in e.tokens}
        self._forget_verdicts()
        self._stamp = self._file_stamp()

    def add(
        self,
        name: str,
        password: str,
        *,
        role: Role = Role.CLIENT,
        names: Iterable[str] = (),
        admin: bool = False,
    ) -> Account:
        """A new account (no grants yet); ``password`` may be empty for a token-only one."""
        if name in self._doc.setdefault("accounts", {}):
            raise AccountsError(f"account {name!r} already exists in {self.path}")
        raw: dict[str, Any] = {"role": str(role)}
        if password:
            raw["password"] = self.hasher.hash(password)
        raw |= {"names": list(names) or [name], "admin": admin}
        self._doc["accounts"][name] = raw
        try:
            self._save()
        except AccountsError:
            del self._doc["accounts"][name]
            raise
        return self._entries[name].account

    def set_password(self, name: str, password: str) -> None:
        self._raw(name)["password"] = self.hasher.hash(password)
        self._save()

    def set_admin(self, name: str, admin: bool) -> None:
        self._raw(name)["admin"] = admin
        self._save()

    def set_names(self, name: str, names: Iterable[str]) -> None:
        self._raw(name)["names"] = list(names) or [name]
        self._save()

    def grant(self, name: str, right: str, text: str, *, max_age: float | None = None) -> None:
        """Give ``name`` the ``right`` (one of ``RIGHTS``) over the filter ``text``."""
        raw = self._raw(name)
        flt = format_filter(_grant_filter(text, right))
        if right == "history":
            item: dict[str, Any] = {"filter": flt}
            if max_age is not None:
                item["max_age"] = max_age
            have = raw.get("history", [])
            raw["history"] = [h for h in have if _normal(_history_text(h)) != flt] + [item]
        elif right in RIGHTS:
            if max_age is not None:
                raise AccountsError("max_age bounds history grants only")
            if flt not in map(_normal, raw.setdefault(right, [])):
                raw[right].append(flt)
        else:
            raise AccountsError(f"no right {right!r} (rights: {', '.join(RIGHTS)})")
        self._save()

    def revoke(self, name: str, right: str, text: str) -> None:
        """Take back a grant given with ``grant`` (the filter as it was given or as listed)."""
        raw = self._raw(name)
        if right not in RIGHTS:
            raise AccountsError(f"no right {right!r} (rights: {', '.join(RIGHTS)})")
        flt = format_filter(_grant_filter(text, right))
        have = raw.get(right, [])
        kept = [g for g in have if _normal(_history_text(g)) != flt]
        if len(kept) == len(have):
            raise AccountsError(f"account {name!r} has no {right} grant {flt}")
        raw[right] = kept
        self._save()

    def remove(self, name: str) -> None:
        self._raw(name)
        del self._doc["accounts"][name]
        self._save()

    def add_token(self, name: str, label: str = "") -> str:
        """A new token for ``name``: returned once, only its hash is kept."""
        raw = self._raw(name)
        tid = secrets.token_hex(4)
        while tid in self._owners:
            tid = secrets.token_hex(4)
        token = f"{TOKEN_PREFIX}{tid}_{secrets.token_urlsafe(32)}"
        raw.setdefault("tokens", []).append(
            {"id": tid, "hash": _token_digest(token), "label": label}
        )
        self._save()
        return token

    def remove_token(self, name: str, token_id: str) -> None:
        raw = self._raw(name)
        have = raw.get("tokens", [])
        kept = [t for t in have if t.get("id") != token_id]
        if len(kept) == len(have):
            raise AccountsError(f"account {name!r} has no token {token_id!r}")
        raw["tokens"] = kept
        self._save()

    def describe(self, name: str) -> Account:
        """The account ``name``; raises ``AccountsError`` if there is none."""
        self._raw(name)
        return self._entries[name].account


def _history_text(item: Any) -> str:
    return item if isinstance(item, str) else str(item.get("filter", ""))


def _normal(text: str) -> str:
    """A grant's filter as ``format_filter`` writes it (as written, if it does not parse)."""
    try:
        return format_filter(parse_filter(text))
    except InvalidMessage:
        return text


def _token_id(secret: str) -> str | None:
    if not secret.startswith(TOKEN_PREFIX):
        return None
    tid, sep, _ = secret[len(TOKEN_PREFIX) :].partition("_")
    return tid if sep else None


@dataclass(frozen=True)
class Credentials:
    """What a client or a broker gives a broker to authenticate: a user and its password, or
    a token (which names its user)."""

    user: str = ""
    password: str = field(default="", repr=False)
    token: str = field(default="", repr=False)

    @classmethod
    def from_env(cls, user: str = "", password: str = "", token: str = "") -> Credentials:
        """The credentials given, each missing one taken from ``PADRES_USER``,
        ``PADRES_PASSWORD`` or ``PADRES_TOKEN``."""
        env = os.environ
        return cls(
            user or env.get("PADRES_USER", ""),
            password or env.get("PADRES_PASSWORD", ""),
            token or env.get("PADRES_TOKEN", ""),
        )

    def hello(self, name: str, role: Role = Role.CLIENT) -> Hello:
        """The ``hello`` that connects as ``name`` with these credentials."""
        return Hello(name, role, user=self.user, password=self.password, token=self.token)
