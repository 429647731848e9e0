"""Accounts, authentication, owned names and grants: each forbidden action is refused at the
edge broker with an error saying why, and nothing of it reaches anyone."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Literal

import pytest
from argon2 import PasswordHasher
from hypothesis import given, settings
from hypothesis import strategies as st

from padres.broker import Broker
from padres.client.connection import Client
from padres.errors import AccountsError, AuthenticationError, RequestFailed
from padres.language.parser import (
    parse_advertisement,
    parse_composite,
    parse_filter,
    parse_publication,
    parse_subscription,
)
from padres.matching.matcher import matches
from padres.model.classes import parse_attributes
from padres.model.messages import Advertisement, Publication, TimeWindow, Unsubscribe
from padres.model.protocol import (
    DeclareSchema,
    DropSchema,
    Durable,
    Envelope,
    Error,
    Exceptions,
    Failed,
    Guaranteed,
    Hello,
    Notify,
    Query,
    ReplayBatch,
    ReplayDone,
    ReplayOffer,
    ReplayRequest,
    Role,
    RouteAdvertise,
    RoutePublish,
    RouteSubscribe,
    Subscribe,
    TxPublish,
    Welcome,
)
from padres.runtime.node import BrokerNode, Handled
from padres.runtime.pump import Pump
from padres.runtime.simulation import SimClient, Simulation
from padres.security.accounts import Accounts, Credentials, Grants, database_grants, parse_age
from padres.testing.processes import BrokerProcess, DatabaseProcess
from rete.operators import Value
from tests.sim_archive import SimArchive
from tests.strategies import scaled
from tests.support import eventually, health
from web.metrics import Metrics
from web.tracing import MAX_ARMED, Tracer

CHEAP = PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)
"""Hashes made for tests verify in microseconds (the parameters travel in each hash)."""

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
EU = "[class,eq,'Order'],[region,eq,'EU']"
US = "[class,eq,'Order'],[region,eq,'US']"
ORDERS = "[class,eq,'Order']"
ADMIN = ("admin", "admin-pw")
"""The administrator of the accounts below: the figures of a broker with accounts are theirs."""


def _accounts(path: Path) -> Accounts:
    """Three brokers, two shops and two managers for two regions, a database, an
    administrator, and eve, who may connect and nothing else."""
    acc = Accounts(path, hasher=CHEAP, create=True)
    for broker in ("B1", "B2", "B3"):
        acc.add(broker, f"{broker}-pw", role=Role.BROKER)
    for region, flt in (("eu", EU), ("us", US)):
        shop = f"shop-{region}"
        acc.add(shop, f"{shop}-pw")
        acc.grant(shop, "advertise", flt)
        acc.grant(shop, "publish", flt)
        manager = f"manager-{region}"
        acc.add(manager, f"{manager}-pw")
        acc.grant(manager, "subscribe", flt)
    acc.grant("manager-eu", "history", EU, max_age=3600)
    acc.grant("manager-us", "history", US)
    acc.add("DB1", "DB1-pw")
    for right, text in database_grants("DB1"):
        acc.grant("DB1", right, text)
    acc.grant("DB1", "subscribe", ORDERS)
    acc.grant("DB1", "replay", ORDERS)
    acc.add("admin", "admin-pw", admin=True)
    acc.add("eve", "eve-pw")
    return acc


def _login(name: str, user: str | None = None) -> Credentials:
    user = user or name
    return Credentials(user, f"{user}-pw")


@dataclass
class Overlay:
    """B1 - B2 - B3, secured; shops at B1, the database and the administrator at B2,
    the managers and eve at B3."""

    sim: Simulation
    accounts: Accounts
    clients: dict[str, SimClient]
    db: SimArchive

    def send(self, who: str, message: Envelope) -> None:
        self.sim.send(self.clients[who], message)
        self.sim.run()

    def errors(self, who: str) -> list[str]:
        return [e.text for e in self.clients[who].errors]

    def ids(self, who: str) -> list[str]:
        return [n.publication.id for n in self.clients[who].notifications]


def _order(pid: str, region: str, at: datetime = NOW) -> Publication:
    return Publication(pid, {"class": "Order", "region": region, "item": "shoes"}, at)


def _secured(tmp_path: Path, seed: int = 1) -> Overlay:
    acc = _accounts(tmp_path / "accounts.toml")
    sim = Simulation(seed, clock=NOW.timestamp(), accounts=acc)
    for broker in ("B1", "B2", "B3"):
        sim.add_broker(broker, _login(broker))
    sim.link("B1", "B2")
    sim.link("B2", "B3")
    sim.run()
    clients: dict[str, SimClient] = {}
    where = {
        "shop-eu": "B1",
        "shop-us": "B1",
        "admin": "B2",
        "manager-eu": "B3",
        "manager-us": "B3",
        "eve": "B3",
    }
    for name, broker in where.items():
        clients[name] = sim.attach(name, broker, _login(name))
    db = sim.clients["DB1"] = SimArchive("DB1", "B2", sim=sim)
    sim.send(db, _login("DB1").hello("DB1"))
    sim.run()
    db.store(ORDERS, "orders")
    for region in ("eu", "us"):
        flt = EU if region == "eu" else US
        sim.send(clients[f"shop-{region}"], parse_advertisement(flt, id="a1"))
    sim.send(clients["admin"], parse_advertisement("[class,eq,'DB_CONTROL']", id="a1"))
    sim.run()
    clients["DB1"] = db
    for name, client in clients.items():
        assert client.errors == [], (name, client.errors)
        assert isinstance(client.other[0], Welcome)
    return Overlay(sim, acc, clients, db)


@pytest.fixture
def overlay(tmp_path: Path) -> Iterator[Overlay]:
    yield _secured(tmp_path)


def _window(start: datetime, end: datetime | None = None) -> str:
    text = f"[time,>=,'{start.isoformat()}']"
    return text + (f",[time,<,'{end.isoformat()}']" if end else "")


# -- accounts --------------------------------------------------------------------------------


def test_accounts_file_round_trip_and_authentication(tmp_path: Path) -> None:
    acc = _accounts(tmp_path / "a.toml")
    again = Accounts(tmp_path / "a.toml")
    eu = again.authenticate("manager-eu", "manager-eu-pw")
    assert eu.grants.subscribe == (parse_filter(EU),)
    assert eu.grants.history[0].max_age == 3600
    b1 = again.get("B1")
    assert b1 is not None and b1.role is Role.BROKER and again.get("B9") is None
    for user, secret in [("manager-eu", "wrong"), ("nobody", "x")]:
        with pytest.raises(AuthenticationError, match="unknown user or wrong password"):
            again.authenticate(user, secret)
    with pytest.raises(AuthenticationError, match="no password or token given"):
        again.authenticate("manager-eu", "")
    token = acc.add_token("eve", "ci")
    assert "ptk_" in token and token not in (tmp_path / "a.toml").read_text()
    assert again.refresh()
    assert again.authenticate_token(token).name == "eve"
    assert again.authenticate("eve", token).name == "eve"
    with pytest.raises(AuthenticationError, match="unknown user or wrong password"):
        again.authenticate("eve", token[:-2] + "xx")
    tid = acc.tokens("eve")[0]["id"]
    acc.remove_token("eve", tid)
    again.refresh()
    with pytest.raises(AuthenticationError, match="unknown or revoked token"):
        again.authenticate_token(token)
    assert "$argon2" in (tmp_path / "a.toml").read_text()
    assert "eve-pw" not in (tmp_path / "a.toml").read_text()


def test_an_empty_password_is_refused_without_hashing(tmp_path: Path) -> None:
    """A hello with a user and no password costs no argon2 check, for a known user or not:
    the event loop never waits on one (and the refusal says the same for every user)."""
    acc = Accounts(tmp_path / "a.toml", create=True)  # the default, costly hasher
    acc.add("known", "pw")
    for user in ("known", "unknown"):
        started = time.perf_counter()
        with pytest.raises(AuthenticationError, match="no password or token given"):
            acc.authenticate(user, "")
        assert time.perf_counter() - started < 0.005


class _CountingHasher(PasswordHasher):
    """``CHEAP``'s parameters, counting the hashes checked."""

    def __init__(self) -> None:
        super().__init__(time_cost=1, memory_cost=8, parallelism=1)
        self.checked = 0

    def verify(self, hash: str | bytes, password: str | bytes) -> Literal[True]:
        self.checked += 1
        return super().verify(hash, password)


def test_every_refusal_says_and_costs_the_same_whoever_the_account(tmp_path: Path) -> None:
    """A wrong secret for a client, a token-only account, a broker or an unknown user: one
    message, one password hash checked; a token with a real id and a wrong secret, or an
    unknown one: one message naming no account, no hash."""
    hasher = _CountingHasher()
    acc = Accounts(tmp_path / "a.toml", create=True, hasher=hasher)
    acc.add("eve", "eve-pw")
    acc.add("robot", "")  # tokens only
    acc.add("B1", "B1-pw", role=Role.BROKER)
    real = acc.add_token("robot", "ci")
    tid = acc.tokens("robot")[0]["id"]
    guesses = ["wrong", real[:-2] + "xx", f"ptk_{tid}_guess", "ptk_0000_guess"]
    for user in ("eve", "robot", "B1", "nobody"):
        for guess in guesses:
            before = hasher.checked
            with pytest.raises(AuthenticationError) as refused:
                acc.authenticate(user, guess)
            assert str(refused.value) == (
                f"authentication failed for user {user!r}: unknown user or wrong password"
            )
            assert hasher.checked == before + 1, (user, guess)
    before = hasher.checked
    for guess in guesses[1:]:
        with pytest.raises(AuthenticationError) as refused:
            acc.authenticate_token(guess)
        assert str(refused.value) == "authentication failed: unknown or revoked token"
    assert hasher.checked == before
    assert acc.authenticate_token(real).name == "robot"


def test_accounts_file_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(AccountsError, match="no accounts file"):
        Accounts(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[accounts.x]\npublish = [\"[class,eq,'Order'],[time,>,now-1h]\"]\n")
    with pytest.raises(AccountsError, match="time predicates"):
        Accounts(bad)
    bad.write_text('[accounts.x]\nsubscribe = ["[price,>,1]"]\n')
    with pytest.raises(AccountsError, match=r"subscribe grant .* is not a filter"):
        Accounts(bad)
    bad.write_text('[accounts.x]\nrole = "king"\n')
    with pytest.raises(AccountsError, match="account 'x'"):
        Accounts(bad)
    acc = Accounts(tmp_path / "a.toml", hasher=CHEAP, create=True)
    acc.add("x", "pw")
    with pytest.raises(AccountsError, match="already exists"):
        acc.add("x", "pw")
    with pytest.raises(AccountsError, match="no right 'own'"):
        acc.grant("x", "own", ORDERS)
    with pytest.raises(AccountsError, match="has no publish grant"):
        acc.revoke("x", "publish", ORDERS)
    assert parse_age("30d") == 30 * 86400 and parse_age("90") == 90
    with pytest.raises(AccountsError, match="not an age"):
        parse_age("soon")


def test_grants_use_the_covering_relation() -> None:
    grants = Grants(
        advertise=(parse_filter("[class,eq,'Order'],[price,<,100]"),),
        publish=(parse_filter(EU),),
        subscribe=(parse_filter("[class,eq,'Order'],[item,str-prefix,'sh']"),),
    )
    assert grants.may_advertise(parse_filter("[class,eq,'Order'],[price,<,50]"))
    assert not grants.may_advertise(parse_filter("[class,eq,'Order'],[price,<,150]"))
    assert not grants.may_advertise(parse_filter("[class,eq,'DB_CONTROL']"))
    assert grants.may_publish(parse_publication("[class,'Order'],[region,'EU']", id="p"))
    assert not grants.may_publish(parse_publication("[class,'Order'],[region,'US']", id="p"))
    assert grants.may_subscribe(parse_filter("[class,eq,'Order'],[item,eq,'shoes']"))
    assert not grants.may_subscribe(parse_filter("[class,eq,'Order'],[item,eq,'hat']"))
    assert not grants.may_subscribe(parse_filter("[class,eq,'Order']"))


# -- authentication in the simulation ----------------------------------------------------------


def _stranger(ov: Overlay, name: str, broker: str, hello: Hello) -> SimClient:
    client = ov.sim.clients[name] = SimClient(name, broker)
    ov.sim.send(client, hello)
    ov.sim.run()
    return client


@pytest.mark.parametrize(
    ("hello", "why"),
    [
        (Hello("eve"), "requires authentication: a client must give a user and password"),
        (Hello("eve", user="eve", password="nope"), "unknown user or wrong password"),
        (Hello("mallory", user="mallory", password="x"), "unknown user or wrong password"),
        (Hello("DB1", user="eve", password="eve-pw"), "may not use the name 'DB1'"),
        (Hello("shop-eu", user="eve", password="eve-pw"), "may not use the name 'shop-eu'"),
        (Hello("B1", user="B1", password="B1-pw"), "'B1' is a broker account"),
        (Hello("B9", Role.BROKER), "a broker link must give a user and password"),
        (Hello("eve", Role.BROKER, user="eve", password="eve-pw"), "'eve' is a client account"),
        (Hello("B9", Role.BROKER, user="B1", password="B1-pw"), "may not use the name 'B9'"),
        (Hello("B1", Role.BROKER, user="B1", password="bad"), "wrong password"),
        (Hello("eve", token="ptk_0000_nothing"), "unknown or revoked token"),
    ],
)
def test_a_connection_without_the_right_credentials_is_refused(
    overlay: Overlay, hello: Hello, why: str
) -> None:
    broker = overlay.sim.brokers["B3"]
    before = (set(broker.sessions), broker.peers, _state(overlay))
    stranger = _stranger(overlay, "stranger", "B3", hello)
    assert len(stranger.errors) == 1 and why in stranger.errors[0].text
    assert (set(broker.sessions), broker.peers, _state(overlay)) == before
    # Nothing it sends afterwards is taken: a broker's routing messages least of all.
    sub = parse_subscription(ORDERS, id="x")
    overlay.sim.send(stranger, RouteSubscribe(sub, ("B1#1.1",)))
    overlay.sim.send(stranger, sub)
    overlay.sim.run()
    assert [e.text for e in stranger.errors[1:]] == 2 * [
        "the first message of a connection must be 'hello'"
    ]
    assert _state(overlay) == before[2]


def test_a_broker_without_credentials_cannot_join(overlay: Overlay) -> None:
    sim = overlay.sim
    sim.add_broker("B4")  # no credentials: its hello is refused, and B3 gains no neighbour
    sim.link("B4", "B3")
    sim.run()
    assert "B4" not in sim.brokers["B3"].peers.values()
    assert "B3" not in sim.brokers["B4"].peers.values()
    tapper = sim.attach("tap", "B4")
    sim.send(tapper, parse_subscription(ORDERS, id="all"))
    sim.run()
    sim.send(overlay.clients["shop-eu"], _order("p1", "EU"))
    sim.run()
    assert tapper.notifications == [] and overlay.ids("manager-eu") == []


# -- the table of forbidden actions -----------------------------------------------------------


def _historic(flt: str, start: datetime, end: datetime | None = None) -> str:
    return f"{flt},{_window(start, end)}"


HOUR = timedelta(hours=1)

FORBIDDEN: list[tuple[str, str, Envelope, str]] = [
    # (test id, who, message, what the error says)
    ("advertise", "eve", parse_advertisement(EU, id="a1"), "no advertise grant covers it"),
    (
        "advertise-wider",
        "shop-eu",
        parse_advertisement(ORDERS, id="a2"),
        "may not advertise [class,eq,'Order']: no advertise grant",
    ),
    ("publish", "eve", _order("p1", "EU"), "no publish grant matches it"),
    ("publish-other-region", "shop-eu", _order("p1", "US"), "no publish grant matches it"),
    ("guaranteed", "shop-eu", Guaranteed(_order("p1", "US")), "no publish grant matches it"),
    (
        "transaction",
        "shop-eu",
        TxPublish(tx="t1", publication=_order("p1", "US")),
        "no publish grant matches it",
    ),
    (
        "subscribe",
        "eve",
        parse_subscription(EU, id="s1"),
        "may not subscribe to [class,eq,'Order'],[region,eq,'EU']: no subscribe grant",
    ),
    ("subscribe-wider", "manager-eu", parse_subscription(ORDERS, id="s1"), "no subscribe grant"),
    ("subscribe-other", "manager-us", parse_subscription(EU, id="s1"), "no subscribe grant"),
    ("durable", "manager-us", Durable(parse_subscription(EU, id="d1")), "no subscribe grant"),
    (
        "subscribe-visibility",
        "manager-us",
        Subscribe(subscription=parse_subscription(EU, id="s1")),
        "no subscribe grant",
    ),
    (
        "composite-part",
        "manager-eu",
        parse_composite(f"{{{EU}}} & {{[class,eq,'Order'],[region,eq,'US']}}", id="c1"),
        "may not subscribe to [class,eq,'Order'],[region,eq,'US']",
    ),
    (
        "durable-composite-part",
        "manager-eu",
        Durable(parse_composite(f"{{{EU}}} ; {{[class,eq,'Order'],[region,eq,'US']}}", id="c1")),
        "may not subscribe to [class,eq,'Order'],[region,eq,'US']",
    ),
    (
        "historic",
        "eve",
        parse_subscription(_historic(EU, NOW - HOUR, NOW), id="h1"),
        "may not read the history of [class,eq,'Order'],[region,eq,'EU']: no history grant",
    ),
    (
        "historic-other",
        "manager-us",
        parse_subscription(_historic(EU, NOW - HOUR, NOW), id="h1"),
        "no history grant covers it",
    ),
    (
        "historic-too-old",
        "manager-eu",
        parse_subscription(_historic(EU, NOW - 2 * HOUR, NOW), id="h1"),
        "only 1h back",
    ),
    (
        "historic-unbounded",
        "manager-eu",
        parse_subscription(f"{EU},[time,<,'{NOW.isoformat()}']", id="h1"),
        "not all of it",
    ),
    (
        "hybrid-without-subscribe",
        "DB1",
        parse_subscription(f"[class,eq,'DB_STATUS'],{_window(NOW - HOUR)}", id="h1"),
        "may not subscribe to [class,eq,'DB_STATUS']",
    ),
    (
        "composite-historic-part",
        "manager-eu",
        parse_composite(
            f"{{{_historic(EU, NOW - HOUR, NOW)}}} & {{{_historic(US, NOW - HOUR, NOW)}}}",
            id="c1",
        ),
        "may not read the history of [class,eq,'Order'],[region,eq,'US']",
    ),
    (
        "control-advertise",
        "eve",
        parse_advertisement("[class,eq,'DB_CONTROL'],[db,eq,'DB1']", id="a1"),
        "database control needs the admin right",
    ),
    (
        "control-publish",
        "DB1",
        Publication("c1", {"class": "DB_CONTROL", "db": "DB1", "command": "STOP"}, NOW),
        "database control needs the admin right",
    ),
    (
        "control-read",
        "eve",
        parse_subscription("[class,eq,'DB_CONTROL']", id="s1"),
        "no subscribe grant covers it",
    ),
    (
        "status-read",
        "eve",
        parse_subscription("[class,eq,'DB_STATUS']", id="s1"),
        "no subscribe grant covers it",
    ),
    (
        "status-forged",
        "eve",
        Publication("st", {"class": "DB_STATUS", "db": "DB1", "ok": True}, NOW),
        "no publish grant matches it",
    ),
    (
        "status-of-another-database",
        "DB1",
        Publication("st", {"class": "DB_STATUS", "db": "DB2", "ok": True}, NOW),
        "no publish grant matches it",
    ),
    ("query", "eve", Query("subscriptions"), "read the routing tables: it needs the admin right"),
    ("query-advertisements", "shop-eu", Query("advertisements"), "needs the admin right"),
    (
        "schema",
        "shop-eu",
        DeclareSchema(id="d1", class_name="Order", attributes=parse_attributes("price:float")),
        "may not declare the schema of Order: it needs the admin right",
    ),
    (
        "schema-drop",
        "shop-eu",
        DropSchema(id="d1", class_name="Order"),
        "may not drop the schema of Order: it needs the admin right",
    ),
    (
        "exceptions-of-another",
        "eve",
        Exceptions(ref="x1", subscription="eu", client="manager-eu"),
        "may not handle the exception queues of client 'manager-eu'",
    ),
    (
        "replay-offer",
        "eve",
        ReplayOffer(parse_advertisement(ORDERS, id="o1")),
        "may not offer to replay [class,eq,'Order']: no replay grant covers it",
    ),
    (
        "replay-offer-wider",
        "DB1",
        ReplayOffer(parse_advertisement("[class,eq,'Invoice']", id="o2")),
        "no replay grant covers it",
    ),
    (
        "route-subscribe",
        "eve",
        RouteSubscribe(parse_subscription(ORDERS, id="B3#x.1"), ("B1#1.1",)),
        "a client may not send RouteSubscribe",
    ),
    (
        "route-publish",
        "eve",
        RoutePublish(_order("p1", "EU"), "B1#1.1"),
        "a client may not send RoutePublish",
    ),
    (
        "route-advertise",
        "eve",
        RouteAdvertise(Advertisement("B3#x.1", parse_filter(EU)), "B3#x.1", ("B3",)),
        "a client may not send RouteAdvertise",
    ),
    (
        "replay-request",
        "eve",
        ReplayRequest(parse_subscription(ORDERS, id="B3#x.2"), "t", "DB1@B2", NOW.timestamp()),
        "a client may not send ReplayRequest",
    ),
]


def _state(ov: Overlay) -> tuple[object, ...]:
    """Everything a refused request could have changed, except its sender's errors."""
    clients = {
        name: (len(c.notifications), len(c.composites), len(c.other), len(c.acks))
        for name, c in ov.clients.items()
    }
    brokers = {
        name: (len(b.trees), len(b.archives), len(b.routes), len(b.network), b.history.is_empty())
        for name, b in ov.sim.brokers.items()
    }
    return clients, brokers, len(ov.db.requests), len(ov.db.stored)


@pytest.mark.parametrize(
    ("who", "message", "why"),
    [row[1:] for row in FORBIDDEN],
    ids=[row[0] for row in FORBIDDEN],
)
def test_every_forbidden_action_is_refused_and_reaches_nobody(
    overlay: Overlay, who: str, message: Envelope, why: str
) -> None:
    # Live subscribers of everything that could leak, where the grants allow them.
    overlay.send("manager-eu", parse_subscription(EU, id="eu"))
    overlay.send("manager-us", parse_subscription(US, id="us"))
    overlay.send("admin", parse_subscription("[class,eq,'DB_STATUS']", id="status"))
    before = _state(overlay)
    sender = overlay.clients[who]
    errors = len(sender.errors)
    overlay.sim.send(sender, message)
    overlay.sim.run()
    overlay.sim.tick(1.0)
    overlay.sim.run()
    new = sender.errors[errors:]
    assert len(new) == 1, new
    assert why in new[0].text, new[0].text
    assert _state(overlay) == before


# -- two regions, disjoint -----------------------------------------------------------------


def test_disjoint_grants_on_one_class_never_cross_live_or_from_history(
    overlay: Overlay,
) -> None:
    ov = overlay
    ov.send("manager-eu", parse_subscription(EU, id="live"))
    ov.send("manager-us", parse_subscription(US, id="live"))
    ov.send("manager-eu", parse_subscription(ORDERS, id="all"))  # refused
    ov.send("manager-us", parse_subscription("[class,eq,'Order'],[item,eq,'shoes']", id="all"))
    at = NOW - timedelta(minutes=30)
    for i in range(10):
        ov.sim.send(ov.clients["shop-eu"], _order(f"eu{i}", "EU", at))
        ov.sim.send(ov.clients["shop-us"], _order(f"us{i}", "US", at))
    # A shop may claim what it likes in its publications: the region decides, not the claim.
    ov.sim.send(ov.clients["shop-us"], _order("sneak", "EU", at))
    ov.sim.run()
    assert ov.ids("manager-eu") == [f"eu{i}" for i in range(10)]
    assert ov.ids("manager-us") == [f"us{i}" for i in range(10)]
    assert len(ov.db.stored) == 20
    ov.sim.tick(60.0)
    since = NOW - HOUR + timedelta(minutes=1)
    ov.send("manager-eu", parse_subscription(_historic(EU, since, NOW), id="past"))
    ov.send("manager-us", parse_subscription(_historic(US, since, NOW), id="past"))
    ov.send("manager-us", parse_subscription(_historic(ORDERS, since, NOW), id="wide"))
    assert len(ov.db.requests) == 2
    ov.db.answer()
    ov.sim.run()
    assert ov.ids("manager-eu")[10:] == [f"eu{i}" for i in range(10)]
    assert ov.ids("manager-us")[10:] == [f"us{i}" for i in range(10)]
    for name, other in (("manager-eu", "US"), ("manager-us", "EU")):
        received = [n.publication for n in ov.clients[name].notifications]
        assert all(p.attributes["region"] != other for p in received)
    assert ov.errors("manager-eu") == [
        "user 'manager-eu' may not subscribe to [class,eq,'Order']: no subscribe grant covers it"
    ]
    assert ov.errors("manager-us") == [
        "user 'manager-us' may not subscribe to [class,eq,'Order'],[item,eq,'shoes']: "
        "no subscribe grant covers it",
        "user 'manager-us' may not read the history of [class,eq,'Order']: "
        "no history grant covers it",
    ]


# -- the attacks, one by one -------------------------------------------------------------------


def test_a_forged_publisher_name_is_replaced_by_the_authenticated_sender(
    overlay: Overlay,
) -> None:
    overlay.send("manager-eu", parse_subscription(EU, id="s"))
    forged = Publication("p1", {"class": "Order", "region": "EU"}, NOW, publisher="shop-us@B1")
    overlay.send("shop-eu", forged)
    (note,) = overlay.clients["manager-eu"].notifications
    assert note.publication.publisher == "shop-eu@B1"
    assert set(overlay.db.stored) == {("shop-eu@B1", "p1")}


def test_an_attacker_cannot_take_a_database_name_first(overlay: Overlay) -> None:
    sim = overlay.sim
    sim.detach(overlay.db)
    sim.run()
    squatter = _stranger(overlay, "squatter", "B2", Hello("DB1", user="eve", password="eve-pw"))
    assert "may not use the name 'DB1'" in squatter.errors[0].text
    db = sim.clients["DB1"] = SimArchive("DB1", "B2", sim=sim)
    sim.send(db, _login("DB1").hello("DB1"))
    sim.run()
    assert db.errors == [] and isinstance(db.other[0], Welcome)


def test_an_attacker_cannot_stop_a_database_or_read_its_commands(overlay: Overlay) -> None:
    ov = overlay
    ov.send("DB1", parse_subscription("[class,eq,'DB_CONTROL'],[db,eq,'DB1']", id="control"))
    ov.send("eve", parse_subscription("[class,eq,'DB_CONTROL']", id="spy"))
    ov.send("eve", parse_advertisement("[class,eq,'DB_CONTROL']", id="a"))
    stop = {"class": "DB_CONTROL", "db": "DB1", "command": "STOP", "spec": ORDERS}
    ov.send("eve", Publication("stop", stop, NOW))
    ov.send("admin", Publication("list", {**stop, "command": "LIST"}, NOW))
    assert ("admin@B2", "list") in ov.db.stored and ("eve@B3", "stop") not in ov.db.stored
    assert ov.clients["eve"].notifications == []
    assert len(ov.errors("eve")) == 3


def test_forged_history_is_refused_and_ends_the_request(overlay: Overlay) -> None:
    ov = overlay
    ov.sim.tick(60.0)
    since = datetime.fromtimestamp(ov.sim.clock, UTC) - timedelta(minutes=30)
    ov.send("manager-us", parse_subscription(_historic(US, since), id="past"))
    (request,) = ov.db.requests
    invoice = Publication("i1", {"class": "Invoice", "region": "US"}, since, "shop-us@B1")
    ov.db.requests.clear()
    ov.sim.send(ov.db, ReplayBatch(request.subscription.id, request.database, (invoice,)))
    ov.sim.run()
    assert "may not replay [class,'Invoice']" in ov.db.errors[-1].text
    assert ov.clients["manager-us"].notifications == []
    (done,) = [m for m in ov.clients["manager-us"].other if isinstance(m, ReplayDone)]
    assert done.databases == () and "may not replay" in done.failed[0]


def test_an_offer_left_unanswered_ends_after_the_replay_timeout(overlay: Overlay) -> None:
    ov = overlay
    ov.send("manager-us", parse_subscription(_historic(US, NOW - HOUR, NOW), id="past"))
    assert len(ov.db.requests) == 1  # the database keeps quiet
    for _ in range(3):
        ov.sim.tick(20.0)
        ov.sim.run()
    (done,) = [m for m in ov.clients["manager-us"].other if isinstance(m, ReplayDone)]
    assert done.failed == ("DB1@B2: no answer within 30 s",)
    assert all(b.history.is_empty() for b in ov.sim.brokers.values())


def test_history_is_bounded_where_the_data_is_and_at_the_edge(overlay: Overlay) -> None:
    ov = overlay
    clock = ov.sim.clock
    start = datetime.fromtimestamp(clock - 3600 - 30, UTC)  # within the clock skew allowed
    old = _order("old", "EU", datetime.fromtimestamp(clock - 3600 - 10, UTC))
    recent = _order("recent", "EU", datetime.fromtimestamp(clock - 600, UTC))
    ov.db.keep([old, recent])
    ov.send("manager-eu", parse_subscription(_historic(EU, start), id="past"))
    (request,) = ov.db.requests
    assert request.not_before == pytest.approx(clock - 3600, abs=0.1)
    ov.db.answer()  # this database ignores the bound: the edge broker enforces it too
    ov.sim.run()
    assert ov.ids("manager-eu") == ["recent"]
    ov.send("manager-us", parse_subscription(_historic(US, start), id="past"))
    assert ov.db.requests[-1].not_before is None  # an unbounded history grant


# -- reloading -------------------------------------------------------------------------------


def test_a_changed_file_changes_what_a_connected_user_may_do(overlay: Overlay) -> None:
    ov = overlay
    editor = Accounts(ov.accounts.path, hasher=CHEAP)
    ov.send("eve", parse_subscription(EU, id="s1"))
    assert "no subscribe grant" in ov.errors("eve")[-1]
    editor.grant("eve", "subscribe", EU)
    assert ov.accounts.refresh()
    assert not ov.accounts.refresh()  # read once per change
    ov.send("eve", parse_subscription(EU, id="s1"))
    assert ov.clients["eve"].acks[-1] == "s1"
    ov.send("shop-eu", _order("p1", "EU"))
    assert ov.ids("eve") == ["p1"]
    editor.revoke("eve", "subscribe", EU)
    ov.accounts.refresh()
    ov.send("eve", parse_subscription(EU, id="s2"))
    assert "no subscribe grant" in ov.errors("eve")[-1]
    ov.send("shop-eu", _order("p2", "EU"))
    assert ov.ids("eve") == ["p1", "p2"]  # what was accepted stays until withdrawn
    ov.send("eve", Unsubscribe("s1"))
    editor.remove("shop-eu")
    ov.accounts.refresh()
    ov.send("shop-eu", _order("p3", "EU"))
    assert "no publish grant" in ov.errors("shop-eu")[-1]
    editor.set_password("eve", "new-pw")
    ov.accounts.refresh()
    again = _stranger(ov, "eve2", "B3", Hello("eve", user="eve", password="eve-pw"))
    assert "wrong password" in again.errors[0].text


def test_an_unreadable_file_keeps_the_accounts_in_force(tmp_path: Path) -> None:
    acc = _accounts(tmp_path / "a.toml")
    acc.path.write_text("this is [not toml")
    assert not acc.refresh()
    assert acc.authenticate("eve", "eve-pw").name == "eve"


# -- real broker processes -------------------------------------------------------------------


def _broker(
    acc: Accounts, broker_id: str, neighbours: Sequence[str] = (), log: IO[bytes] | None = None
) -> BrokerProcess:
    options = ["--accounts", str(acc.path), "--user", broker_id, "--password", f"{broker_id}-pw"]
    return BrokerProcess(broker_id, neighbours=neighbours, options=options, log=log)


async def test_real_brokers_authenticate_clients_and_each_other(tmp_path: Path) -> None:
    acc = _accounts(tmp_path / "accounts.toml")
    with (tmp_path / "B1.log").open("wb") as log:
        b1 = _broker(acc, "B1", log=log)
        b2: BrokerProcess | None = None
        intruder = BrokerProcess("B3", options=["--accounts", str(acc.path)])
        try:
            url1 = b1.start()
            b2 = _broker(acc, "B2", [url1])
            url2 = b2.start()
            intruder.neighbours = [url1]  # no credentials of its own
            url3 = intruder.start()
            await _converse(acc, url1, url2)
            assert health(url1, ADMIN)["neighbours"] == ["B2"]
            assert health(url3, ADMIN)["neighbours"] == []
        finally:
            for broker in (b1, b2, intruder):
                if broker is not None:
                    broker.stop()
    logged = (tmp_path / "B1.log").read_text()
    assert "a broker link must give a user and password, or a token" in logged


async def test_passwords_are_checked_off_the_event_loop(tmp_path: Path) -> None:
    checked: list[threading.Thread] = []

    class Recording(PasswordHasher):
        def verify(self, hash: str | bytes, password: str | bytes) -> Literal[True]:
            checked.append(threading.current_thread())
            return super().verify(hash, password)

    acc = Accounts(
        tmp_path / "a.toml",
        hasher=Recording(time_cost=1, memory_cost=8, parallelism=1),
        create=True,
    )
    acc.add("eve", "eve-pw")

    node = BrokerNode(Broker("B1", accounts=acc))
    sent: list[bytes] = []

    async def send(data: bytes) -> None:
        sent.append(data)

    hop = node.attach(send, lambda reason: None)
    hello = _login("eve").hello("eve")
    await node.verify(hello)
    node.submit(hop, [hello])  # the core checks again: the verdict is remembered
    await eventually(lambda: bool(sent))
    await node.detach(hop)
    (frame,) = sent
    assert b'"welcome"' in frame
    assert len(checked) == 1 and checked[0] is not threading.main_thread()


async def _converse(acc: Accounts, url1: str, url2: str) -> None:
    await eventually(lambda: health(url1, ADMIN)["neighbours"] == ["B2"])
    for kwargs, why in [
        ({"user": "manager-eu", "password": "wrong"}, "unknown user or wrong password"),
        ({"user": "mallory", "password": "x"}, "unknown user or wrong password"),
        ({}, "requires authentication"),
    ]:
        with pytest.raises(AuthenticationError, match=why):
            await Client(url2, "manager-eu", **kwargs).connect()  # type: ignore[arg-type]
    async with (
        Client(url2, "manager-eu", user="manager-eu", password="manager-eu-pw") as manager,
        Client(url1, "shop-eu", user="shop-eu", password="shop-eu-pw") as shop,
    ):
        with pytest.raises(RequestFailed, match="no subscribe grant covers it"):
            await manager.subscribe(ORDERS)
        sub = await manager.subscribe(EU)
        await shop.advertise(EU)
        with pytest.raises(RequestFailed, match="no advertise grant"):
            await shop.advertise(ORDERS)
        await shop.publish("[class,'Order'],[region,'EU'],[item,'shoes']")
        note = await asyncio.wait_for(anext(aiter(sub)), 10)
        assert isinstance(note, Notify) and note.publication.publisher == "shop-eu@B1"
        # ``padres pub`` as a user who may publish, not administer (at B2: its name is in use
        # at B1): it succeeds.
        command = [sys.executable, "-m", "padres.cli", "pub", "--broker", url2, "--adv", EU]
        command += ["--user", "shop-eu", "--password", "shop-eu-pw"]
        command += ["[class,'Order'],[region,'EU'],[item,'hat']"]
        done = await asyncio.to_thread(subprocess.run, command, capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        hat = await asyncio.wait_for(anext(aiter(sub)), 10)
        assert isinstance(hat, Notify) and hat.publication.attributes["item"] == "hat"
        # The file changes under the running brokers: the next request sees it.
        Accounts(acc.path, hasher=CHEAP).grant("manager-eu", "subscribe", ORDERS)

        async def widened() -> bool:
            try:
                await manager.subscribe(ORDERS)
            except RequestFailed:
                return False
            return True

        await eventually(widened, timeout=10)
    token = Accounts(acc.path, hasher=CHEAP).add_token("eve")
    admitted: list[Client] = []

    async def connects() -> bool:
        client = Client(url2, "eve", token=token)
        try:
            admitted.append(await client.connect())
        except AuthenticationError:
            return False
        return True

    await eventually(connects, timeout=10)  # the broker reads the file again within a second
    (eve,) = admitted
    try:
        assert eve.session == "eve@B2"
        with pytest.raises(RequestFailed, match="needs the admin right"):
            await eve.query("subscriptions")
    finally:
        await eve.close()


def test_the_user_command_manages_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from padres.cli import main

    path = str(tmp_path / "accounts.toml")
    base = ["user", "--accounts", path]
    assert main([*base, "add", "DB1", "--database", "--password", "pw"]) == 0
    assert main([*base, "grant", "DB1", "replay", ORDERS]) == 0
    assert main([*base, "grant", "DB1", "history", ORDERS, "--max-age", "7d"]) == 0
    assert main([*base, "grant", "DB1", "admin"]) == 0
    assert main([*base, "token", "add", "DB1", "--label", "node"]) == 0
    token = capsys.readouterr().out.strip().splitlines()[-1]
    assert main([*base, "list"]) == 0
    listing = capsys.readouterr().out
    assert "DB1 (client, admin)" in listing
    assert "subscribe [class,eq,'DB_CONTROL'],[db,eq,'DB1']" in listing
    assert "history [class,eq,'Order'] --max-age 1w" in listing
    assert re.search(r"replay \[class,eq,'Order'\]", listing)
    acc = Accounts(path)
    assert acc.authenticate("DB1", "pw").grants.admin
    assert acc.authenticate_token(token).name == "DB1"
    assert main([*base, "names", "DB1", "DB1", "DB1-*"]) == 0
    assert "names: DB1, DB1-*" in capsys.readouterr().out
    assert Accounts(path).describe("DB1").owns("DB1-replica")
    assert main([*base, "revoke", "DB1", "replay", ORDERS]) == 0
    assert main([*base, "revoke", "DB1", "replay", ORDERS]) == 1
    assert "has no replay grant" in capsys.readouterr().err
    assert main([*base, "grant", "DB1", "publish"]) == 1
    assert main([*base, "remove", "DB1"]) == 0
    assert main([*base, "list"]) == 0
    assert "DB1" not in capsys.readouterr().out.replace("removed account DB1", "")


def test_a_window_in_the_future_needs_no_history_grant(overlay: Overlay) -> None:
    later = NOW + timedelta(days=1)
    sub = parse_subscription(f"{EU},{_window(later)}", id="future")
    assert sub.filter.window == TimeWindow(later, None)
    overlay.send("manager-us", parse_subscription(f"{US},{_window(later)}", id="future"))
    assert overlay.clients["manager-us"].acks[-1] == "future"
    overlay.send("eve", sub)
    assert "no subscribe grant" in overlay.errors("eve")[-1]


def test_an_error_reply_names_the_refused_request(overlay: Overlay) -> None:
    overlay.send("eve", parse_subscription(EU, id="mine"))
    (error,) = overlay.clients["eve"].errors
    assert isinstance(error, Error) and error.ref == "mine"


def test_a_broker_without_accounts_beyond_loopback_warns(tmp_path: Path) -> None:
    with (tmp_path / "open.log").open("wb") as log:
        broker = BrokerProcess("B9", options=["--host", "0.0.0.0"], log=log)
        try:
            broker.start()
        finally:
            broker.stop()
    logged = (tmp_path / "open.log").read_text()
    assert "SECURITY WARNING: listening on 0.0.0.0 without an accounts file" in logged


async def test_a_secured_database_stores_and_replays_to_those_granted_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    acc = _accounts(tmp_path / "accounts.toml")
    broker = _broker(acc, "B1")
    db: DatabaseProcess | None = None
    try:
        url = broker.start()
        with monkeypatch.context() as env:  # the node's credentials, as an operator gives them
            env.setenv("PADRES_USER", "DB1")
            env.setenv("PADRES_PASSWORD", "DB1-pw")
            db = DatabaseProcess("DB1", url, f"sqlite:///{tmp_path}/DB1.sqlite", stores=[ORDERS])
            db.start()
        await _history(url)
    finally:
        if db is not None:
            db.stop()
        broker.stop()


async def _history(url: str) -> None:
    def login(name: str) -> Client:
        return Client(url, name, user=name, password=f"{name}-pw")

    async with login("shop-eu") as eu, login("shop-us") as us, login("eve") as eve:
        for shop, region in ((eu, "EU"), (us, "US")):
            await shop.advertise(EU if region == "EU" else US)
            for i in range(3):
                await shop.publish(f"[class,'Order'],[region,'{region}'],[n,{i}]")
        with pytest.raises(RequestFailed, match="database control needs the admin right"):
            await eve.advertise("[class,eq,'DB_CONTROL'],[db,eq,'DB1']")
        with pytest.raises(RequestFailed, match="no history grant covers it"):
            await eve.subscribe(f"{ORDERS},[time,>=,now-1h],[time,<,now]")
    async with login("manager-eu") as manager:
        replayed: list[Publication] = []

        async def complete() -> bool:
            past = await manager.subscribe(f"{EU},[time,>=,now-10m],[time,<,now]")
            replayed[:] = [n.publication async for n in past if isinstance(n, Notify)]
            return len(replayed) == 3

        await eventually(complete, timeout=20)  # the node writes in batches
        assert {p.attributes["region"] for p in replayed} == {"EU"}
        assert {p.publisher for p in replayed} == {"shop-eu@B1"}
        with pytest.raises(RequestFailed, match="no history grant covers it"):
            await manager.subscribe(f"{US},[time,>=,now-10m],[time,<,now]")
        with pytest.raises(RequestFailed, match="only 1h back"):
            await manager.subscribe(f"{EU},[time,>=,now-2h],[time,<,now]")


# -- grants hold whatever the filters ----------------------------------------------------------

_NUMERIC = ["<", "<=", ">", ">=", "=", "<>"]
_TEXT = ["eq", "neq", "str-prefix", "str-postfix", "str-contains"]


@st.composite
def _orders(draw: st.DrawFn) -> str:
    """A filter over orders with a price and a region, as text: small domains, so that
    grants, subscriptions and publications often overlap, cover and miss each other."""
    parts = ["[class,eq,'Order']"]
    for _ in range(draw(st.integers(0, 2))):
        op = draw(st.sampled_from([*_NUMERIC, "isPresent"]))
        parts.append(f"[price,{op},{draw(st.integers(0, 6))}]")
    for _ in range(draw(st.integers(0, 2))):
        op = draw(st.sampled_from([*_TEXT, "isPresent"]))
        parts.append(f"[region,{op},'{draw(st.sampled_from(['EU', 'US', 'E', 'U']))}']")
    return ",".join(parts)


_ATTRIBUTES: list[dict[str, Value]] = [{}, {"price": 3}, {"region": "EU"}]
_ATTRIBUTES += [{"price": p, "region": r} for p in range(7) for r in ("EU", "US", "UE", "E")]
_PUBLICATIONS = [
    Publication(f"p{i}", {"class": "Order", **attrs}, NOW) for i, attrs in enumerate(_ATTRIBUTES)
]
_HASH = CHEAP.hash("pw")


def _shop_and_reader(tmp: Path, grants: list[str]) -> tuple[Simulation, SimClient, SimClient]:
    """Broker B1 with accounts: a shop that may advertise and publish orders, attached and
    advertising them, and a reader granted ``grants``, attached."""
    path = tmp / "accounts.toml"
    path.write_text(
        f'[accounts.B1]\nrole = "broker"\npassword = "{_HASH}"\n'
        f'[accounts.shop]\npassword = "{_HASH}"\n'
        f"advertise = {json.dumps([ORDERS])}\npublish = {json.dumps([ORDERS])}\n"
        f'[accounts.reader]\npassword = "{_HASH}"\n'
        f"subscribe = {json.dumps(grants)}\n"
    )
    sim = Simulation(clock=NOW.timestamp(), accounts=Accounts(path))
    sim.add_broker("B1")
    shop = sim.attach("shop", "B1", Credentials("shop", "pw"))
    reader = sim.attach("reader", "B1", Credentials("reader", "pw"))
    sim.send(shop, parse_advertisement(ORDERS, id="a"))
    return sim, shop, reader


@settings(max_examples=scaled(40), deadline=None)
@given(grants=st.lists(_orders(), min_size=1, max_size=2), wanted=st.lists(_orders(), max_size=3))
def test_a_subscriber_never_receives_what_no_grant_covers(
    grants: list[str], wanted: list[str]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sim, shop, reader = _shop_and_reader(Path(tmp), grants)
        for i, text in enumerate(wanted):
            sim.send(reader, parse_subscription(text, id=f"s{i}"))
        sim.run()
        for pub in _PUBLICATIONS:
            sim.send(shop, pub)
        sim.run()
    allowed = [parse_filter(g) for g in grants]
    accepted = {f"s{i}" for i in range(len(wanted))} - {e.ref for e in reader.errors}
    assert set(reader.acks) == accepted
    for note in reader.notifications:
        assert any(matches(g, note.publication) for g in allowed), note.publication
        assert set(note.subscriptions) <= accepted
    for error in reader.errors:
        assert "no subscribe grant covers it" in error.text


def test_secrets_stay_out_of_reprs() -> None:
    given = Credentials("eve", "eve-pw", "ptk_1_secret")
    assert "eve-pw" not in repr(given) and "secret" not in repr(given)
    hello = given.hello("eve")
    assert "eve-pw" not in repr(hello) and "user='eve'" in repr(hello)
    assert "secret" not in repr(Credentials(token="ptk_1_secret").hello("eve"))


async def test_disjoint_grants_hold_in_a_cyclic_overlay_with_two_databases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B1, B2 and B3 all linked to each other, a database at B2 and one at B3 storing every
    order: the EU and US managers at B1 each get their own region's orders, live and from both
    databases' history, and never the other's."""
    acc = _accounts(tmp_path / "accounts.toml")
    acc.add("DB2", "DB2-pw")
    for right, text in database_grants("DB2"):
        acc.grant("DB2", right, text)
    acc.grant("DB2", "subscribe", ORDERS)
    acc.grant("DB2", "replay", ORDERS)
    with ExitStack() as stack:
        urls: list[str] = []
        for broker in ("B1", "B2", "B3"):
            process = _broker(acc, broker, list(urls))
            stack.callback(process.stop)
            urls.append(process.start())
        for db, at in (("DB1", urls[1]), ("DB2", urls[2])):
            with monkeypatch.context() as env:
                env.setenv("PADRES_USER", db)
                env.setenv("PADRES_PASSWORD", f"{db}-pw")
                node = DatabaseProcess(db, at, f"sqlite:///{tmp_path}/{db}.sqlite", stores=[ORDERS])
                stack.callback(node.stop)
                node.start()
        deadline = time.monotonic() + 15
        while len(health(urls[0], ADMIN)["neighbours"]) < 2:
            assert time.monotonic() < deadline, "B1 did not link to B2 and B3"
            await asyncio.sleep(0.1)
        await _two_regions(urls)


async def _two_regions(urls: list[str]) -> None:
    def login(name: str, url: str) -> Client:
        return Client(url, name, user=name, password=f"{name}-pw")

    async with (
        login("manager-eu", urls[0]) as eu,
        login("manager-us", urls[0]) as us,
        login("shop-eu", urls[1]) as shop_eu,
        login("shop-us", urls[2]) as shop_us,
    ):
        live = {"EU": await eu.subscribe(EU), "US": await us.subscribe(US)}
        for shop, region in ((shop_eu, "EU"), (shop_us, "US")):
            await shop.advertise(EU if region == "EU" else US)
        for i in range(5):
            await shop_eu.publish(f"[class,'Order'],[region,'EU'],[n,{i}]", id=f"eu{i}")
            await shop_us.publish(f"[class,'Order'],[region,'US'],[n,{i}]", id=f"us{i}")
        for region, handle in live.items():
            got = [await handle.get(timeout=10) for _ in range(5)]
            ids = [n.publication.id for n in got if isinstance(n, Notify)]
            assert ids == [f"{region.lower()}{i}" for i in range(5)]
        for manager, region in ((eu, "EU"), (us, "US")):
            flt = EU if region == "EU" else US

            async def complete(manager: Client = manager, flt: str = flt) -> bool:
                past = await manager.subscribe(f"{flt},[time,>=,now-10m],[time,<,now]")
                found = [n async for n in past if isinstance(n, Notify)]
                done = past.replay
                return len(found) == 5 and done is not None and len(done.databases) == 2

            await eventually(complete, timeout=30)  # each node writes in batches
            past = await manager.subscribe(f"{flt},[time,>=,now-10m],[time,<,now]")
            ids = sorted([n.publication.id async for n in past if isinstance(n, Notify)])
            assert ids == sorted(f"{region.lower()}{i}" for i in range(5))
            other = US if region == "EU" else EU
            with pytest.raises(RequestFailed, match="no history grant covers it"):
                await manager.subscribe(f"{other},[time,>=,now-10m],[time,<,now]")
            with pytest.raises(RequestFailed, match="no subscribe grant covers it"):
                await manager.subscribe(other)
        for handle in live.values():
            with pytest.raises(TimeoutError):  # nothing more: the other region's never came
                await handle.get(timeout=0.5)


def test_an_exception_queue_takes_only_what_its_client_may_receive(overlay: Overlay) -> None:
    """A client cannot use its exception queue to store (and show administrators) forged
    entries of classes it may not receive."""
    ov = overlay
    forged = Publication("x", {"class": "DB_CONTROL", "command": "STOP"}, NOW, "admin@B2")
    ov.send("manager-eu", Failed("f1", "live", forged, "boom", 1))
    assert ov.errors("manager-eu") == [
        "user 'manager-eu' may not put [class,'DB_CONTROL'],[command,'STOP'] into an exception "
        "queue: no subscribe grant matches it"
    ]
    assert ov.sim.brokers["B3"].dead_letters.queues() == []


def test_a_grant_cannot_be_escaped_at_the_edge_of_exact_floats() -> None:
    """A reader granted n >= 2**53 + 1 (or n <> 2**53) asks for n = 2**53 written as a float:
    refused, and the publication with n = 2**53 never reaches it."""
    edge = [
        "[class,eq,'Order'],[n,>=,9007199254740993]",
        "[class,eq,'Order'],[n,<>,9007199254740992]",
    ]
    for grant in edge:
        with tempfile.TemporaryDirectory() as tmp:
            sim, shop, reader = _shop_and_reader(Path(tmp), [grant])
            sim.send(
                reader, parse_subscription("[class,eq,'Order'],[n,=,9007199254740992.0]", id="s")
            )
            sim.run()
            sim.send(shop, Publication("p", {"class": "Order", "n": 2**53}, NOW))
            sim.run()
        errors = [e.text for e in reader.errors]
        assert errors and "no subscribe grant covers it" in errors[0]
        assert reader.notifications == []


# -- what the web layer's observers see ----------------------------------------------------------


def _trace_request(i: int) -> Publication:
    attributes: dict[str, Value] = {
        "class": "TRACE_REQUEST",
        "trace": f"t{i}",
        "filter": "",
        "targets": "[]",
    }
    return Publication(f"r{i}", attributes, NOW)


def test_observers_see_only_what_the_core_took(tmp_path: Path) -> None:
    """A frame of a wrong hello and 500 trace requests is refused after the hello, unread;
    a client's refused publications reach no observer either; its accepted ones do."""
    path = tmp_path / "accounts.toml"
    path.write_text(
        f'[accounts.shop]\npassword = "{_HASH}"\n'
        f"advertise = {json.dumps([ORDERS])}\npublish = {json.dumps([ORDERS])}\n"
    )
    broker = Broker("B1", accounts=Accounts(path))
    pump = Pump(broker, lambda outs: None)
    stranger: list[Envelope] = [Hello("eve", user="shop", password="guess")]
    stranger += map(_trace_request, range(500))
    left, outs, handled = pump.walk("h1", stranger, NOW.timestamp)
    assert (left, handled) == (len(stranger), [])
    assert [type(m) for _, m in outs] == [Error]
    shop: list[Envelope] = [
        Hello("shop", user="shop", password="pw"),
        parse_advertisement(ORDERS, id="a"),
        *map(_trace_request, range(5)),  # no grant: refused
        _order("o1", "EU", NOW),
    ]
    _, _, handled = pump.walk("h2", shop, NOW.timestamp)
    assert [type(m).__name__ for m, _, _ in handled] == ["Hello", "Advertisement", "Publication"]


def test_a_flood_of_trace_requests_arms_a_bounded_few() -> None:
    broker = Broker("B1")
    node = BrokerNode(broker)
    metrics = Metrics(node)
    tracer = Tracer(metrics, private=frozenset())
    requests: list[Handled] = [(_trace_request(i), [], 0.0) for i in range(1000)]
    tracer.observe("h1", requests)
    assert len(tracer.armed) == MAX_ARMED
    assert list(tracer.armed)[-1] == "t999"  # the newest are kept
