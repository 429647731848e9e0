"""The web API of a broker with accounts: the same accounts and grants as its clients."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from padres.model.protocol import Role
from padres.security.accounts import Accounts
from padres.testing.processes import BrokerProcess

EU = "[class,eq,'Order'],[region,eq,'EU']"
US = "[class,eq,'Order'],[region,eq,'US']"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A broker with three accounts: ``ops`` (an administrator, with a token) and ``eu`` and
    ``us``, which may advertise, publish and subscribe to orders of their region only. Gives
    the broker's address and ops' token."""
    path = tmp_path_factory.mktemp("accounts") / "accounts.toml"
    accounts = Accounts(path, create=True)
    accounts.add("ops", "ops-secret", admin=True)
    accounts.add("B9", "B9-secret", role=Role.BROKER)
    token = accounts.add_token("ops", "metrics")
    for user, grant in (("eu", EU), ("us", US)):
        accounts.add(user, f"{user}-secret", names=[user, f"{user}.*"])
        for right in ("advertise", "publish", "subscribe"):
            accounts.grant(user, right, grant)
    broker = BrokerProcess("S1", options=["--accounts", str(path), "--max-subscriptions", "3"])
    try:
        broker.start()
        yield f"http://127.0.0.1:{broker.port}", token
    finally:
        broker.stop()


def _as(user: str) -> tuple[str, str]:
    return user, f"{user}-secret"


def _problem(response: httpx.Response, status: int, *words: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem: dict[str, Any] = response.json()
    for word in words:
        assert word in problem["detail"], problem
    return problem


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/"),
        ("GET", "/api/v1/broker"),
        ("GET", "/api/v1/routing"),
        ("GET", "/api/v1/overlay"),
        ("GET", "/metrics"),
        ("GET", "/api/v1/subscriptions"),
        ("POST", "/api/v1/subscriptions"),
        ("POST", "/api/v1/publications"),
        ("POST", "/api/v1/advertisements"),
        ("GET", "/api/v1/history?filter=[class,eq,'Order']&from=now-1h"),
        ("GET", "/api/v1/databases"),
        ("GET", "/api/v1/durables"),
        ("DELETE", "/api/v1/durables/eu@S1/orders"),
        ("DELETE", "/api/v1/clients/eu@S1"),
        ("POST", "/api/v1/traces"),
        ("GET", "/api/v1/exceptions/eu/s1"),
    ],
)
def test_nothing_is_served_without_credentials(
    secured: tuple[str, str], method: str, path: str
) -> None:
    base, _ = secured
    response = httpx.request(method, base + path, json={})
    problem = _problem(response, 401, "user and password")
    assert response.headers["www-authenticate"].startswith("Basic")
    assert problem["title"] == "authentication required"
    wrong = httpx.request(method, base + path, json={}, auth=("eu", "guess"))
    _problem(wrong, 401, "'eu'")


def test_the_description_and_liveness_are_open(secured: tuple[str, str]) -> None:
    base, _ = secured
    assert httpx.get(f"{base}/openapi.json").status_code == 200
    assert httpx.get(f"{base}/docs").status_code == 200
    # Liveness only: the figures name clients and neighbours, which are the admin's to read.
    assert sorted(httpx.get(f"{base}/health").json()) == ["broker", "uptime"]
    status = httpx.get(f"{base}/api/v1/broker", auth=_as("ops")).json()["status"]
    assert {"clients", "neighbours", "durables"} <= status.keys()


def test_reading_the_broker_takes_the_admin_right(secured: tuple[str, str]) -> None:
    base, token = secured
    for path in ("/api/v1/routing", "/api/v1/broker", "/api/v1/durables", "/metrics", "/"):
        _problem(httpx.get(base + path, auth=_as("eu")), 403, "'eu'", "admin")
        assert httpx.get(base + path, auth=_as("ops")).status_code == 200, path
    for path in ("/api/v1/durables/us@S1/orders", "/api/v1/clients/us@S1"):
        _problem(httpx.delete(base + path, auth=_as("eu")), 403, "'eu'", "admin")
    # The broker's own monitoring session runs under accounts too.
    view = httpx.get(f"{base}/api/v1/overlay", auth=_as("ops"), timeout=10).json()
    assert [b["id"] for b in view["brokers"]] == ["S1"]
    bearer = {"Authorization": f"Bearer {token}"}
    assert "padres_" in httpx.get(f"{base}/metrics", headers=bearer).text
    assert httpx.get(f"{base}/api/v1/routing?access_token={token}").status_code == 200
    revoked = token[:-4] + "xxxx"
    _problem(httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {revoked}"}), 401)


def test_each_user_publishes_and_reads_within_its_grants(secured: tuple[str, str]) -> None:
    base, _ = secured
    eu, us = _as("eu"), _as("us")
    made = httpx.post(f"{base}/api/v1/advertisements", json={"filter": EU}, auth=eu)
    assert made.status_code == 201, made.text
    assert made.json()["client"] == "eu"  # the user's own name by default
    _problem(
        httpx.post(f"{base}/api/v1/advertisements", json={"filter": US}, auth=eu),
        403,
        "'eu'",
        "advertise",
    )
    _problem(
        httpx.post(f"{base}/api/v1/advertisements", json={"filter": EU, "client": "us"}, auth=eu),
        403,
        "may not publish as 'us'",
    )
    sub = httpx.post(f"{base}/api/v1/subscriptions", json={"filter": EU}, auth=eu)
    assert sub.status_code == 201, sub.text
    sid = sub.json()["id"]
    _problem(httpx.post(f"{base}/api/v1/subscriptions", json={"filter": US}, auth=eu), 403)
    # Another user neither sees nor ends it.
    assert httpx.get(f"{base}/api/v1/subscriptions", auth=us).json() == []
    _problem(httpx.get(f"{base}/api/v1/subscriptions/{sid}", auth=us), 404)
    _problem(httpx.delete(f"{base}/api/v1/subscriptions/{sid}", auth=us), 404)
    with (
        httpx.Client(timeout=10, auth=eu) as client,
        client.stream("GET", f"{base}/api/v1/subscriptions/{sid}/events") as events,
    ):
        assert events.status_code == 200
        lines = events.iter_lines()
        assert next(lines) == ": subscribed"
        refused = httpx.post(
            f"{base}/api/v1/publications",
            json=[{"class": "Order", "region": "EU", "n": 1}, {"class": "Order", "region": "US"}],
            auth=eu,
        )
        _problem(refused, 403, "'eu'", "publish")  # nothing of the batch is published
        ok = httpx.post(
            f"{base}/api/v1/publications", json={"class": "Order", "region": "EU", "n": 2}, auth=eu
        )
        assert ok.status_code == 201, ok.text
        data = next(line for line in lines if line.startswith("data: "))
    assert '"n":2' in data
    assert httpx.delete(f"{base}/api/v1/subscriptions/{sid}", auth=eu).status_code == 204


def test_each_user_has_its_own_subscription_quota_and_sees_nothing_of_others(
    secured: tuple[str, str],
) -> None:
    base, _ = secured
    eu, us = _as("eu"), _as("us")
    made = []
    for n in range(3):
        r = httpx.post(
            f"{base}/api/v1/subscriptions", json={"filter": EU, "name": f"q{n}"}, auth=eu
        )
        assert r.status_code == 201, r.text
        made.append(r.json()["id"])
    over = httpx.post(f"{base}/api/v1/subscriptions", json={"filter": EU}, auth=eu)
    _problem(over, 409, "user 'eu' holds 3", "limit is 3")
    mine = httpx.post(f"{base}/api/v1/subscriptions", json={"filter": US}, auth=us)
    assert mine.status_code == 201, mine.text  # another user's quota is its own
    for sid in made:
        assert httpx.delete(f"{base}/api/v1/subscriptions/{sid}", auth=eu).status_code == 204
    gone = httpx.get(f"{base}/api/v1/subscriptions/q0", auth=eu)
    assert "ended (unsubscribed)" in _problem(gone, 404)["detail"]
    hidden = _problem(httpx.get(f"{base}/api/v1/subscriptions/q0", auth=us), 404)
    assert "ended" not in hidden["detail"]
    assert (
        httpx.delete(f"{base}/api/v1/subscriptions/{mine.json()['id']}", auth=us).status_code == 204
    )


async def test_concurrent_administrator_reads_are_all_answered(secured: tuple[str, str]) -> None:
    """Readers of one table while a query for it is in flight share its answer."""
    base, _ = secured
    async with httpx.AsyncClient(auth=_as("ops"), timeout=10) as client:
        replies = await asyncio.gather(
            *(client.get(f"{base}/api/v1/routing?table={t}") for t in ["prt", "srt"] * 20)
        )
    assert [r.status_code for r in replies] == [200] * 40
    assert {r.json()["table"] for r in replies} == {"prt", "srt"}


def test_a_refusal_tells_no_account_apart(secured: tuple[str, str]) -> None:
    """A wrong password for a client, an administrator, a broker or an unknown user; a token
    with a real id and a wrong secret, or an unknown one: the same answer."""
    base, token = secured
    url = f"{base}/api/v1/subscriptions"
    for user in ("eu", "ops", "B9", "nobody"):
        detail = _problem(httpx.get(url, auth=(user, "guess")), 401)["detail"]
        assert detail == f"authentication failed for user {user!r}: unknown user or wrong password"
    tid = token.split("_")[1]
    for guess in (token[:-4] + "xxxx", f"ptk_{tid}_guess", "ptk_0000_guess"):
        bearer = {"Authorization": f"Bearer {guess}"}
        detail = _problem(httpx.get(url, headers=bearer), 401)["detail"]
        assert detail == "authentication failed: unknown or revoked token"
    # A broker's account, with its right password, is for links only.
    _problem(httpx.get(url, auth=("B9", "B9-secret")), 403, "'B9' is a broker account")


def _raw(base: str, head: str, body: bytes = b"") -> bytes:
    """Send ``head`` (and ``body``) as is; what comes back within 5 seconds."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
        answer = b""
        with contextlib.suppress(TimeoutError):
            while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
                part = sock.recv(65536)
                if not part:
                    break
                answer += part
        return answer


def _basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def test_a_body_is_bounded_and_its_sender_authenticated_before_it_is_read(
    secured: tuple[str, str],
) -> None:
    """A 64 MiB publication announced, none of it sent: refused at once, 401 with wrong
    credentials or none, 413 with right ones; a chunked body past its route's bound: 413."""
    base, _ = secured
    big = 64 << 20
    attempts = [("", b"401"), (_basic("eu", "guess"), b"401"), (_basic(*_as("eu")), b"413")]
    for auth, status in attempts:
        head = (
            f"POST /api/v1/publications HTTP/1.1\nHost: x\nContent-Length: {big}\n"
            f"Content-Type: application/json\n" + (f"Authorization: Basic {auth}\n" if auth else "")
        )
        started = time.monotonic()
        answer = _raw(base, head)
        assert answer.startswith(b"HTTP/1.1 " + status), answer[:200]
        assert time.monotonic() - started < 2
    chunk = b"x" * 70_000
    head = (
        "POST /api/v1/subscriptions HTTP/1.1\nHost: x\nTransfer-Encoding: chunked\n"
        f"Content-Type: application/json\nAuthorization: Basic {_basic(*_as('eu'))}\n"
    )
    answer = _raw(base, head, b"%x\r\n%s\r\n0\r\n\r\n" % (len(chunk), chunk))
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"at most 65,536" in answer
