"""The web API of every broker, against real broker and database processes: publish and
advertise, subscribe and read over SSE and WebSocket, durable resumption, history paging,
the broker's tables, the overlay, metrics, traces, and bad input answered with problems."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from websockets.sync.client import connect

from padres.client.connection import BlockingClient
from padres.model.protocol import Notify
from padres.testing.processes import BrokerProcess, DatabaseProcess
from web.clients import LIVE_QUEUE, OPEN_PER_ACCOUNT, PUBLISHERS_PER_ACCOUNT

ORDERS = "[class,eq,'Order']"
PROBLEM = "application/problem+json"


@dataclass
class WebOverlay:
    """Brokers B1 - B2 - B3 in a chain and database DB1 at B2 storing orders."""

    brokers: dict[str, BrokerProcess]
    database: DatabaseProcess

    def http(self, broker: str) -> str:
        return f"http://127.0.0.1:{self.brokers[broker].port}"

    def stop(self, broker: str) -> None:
        self.brokers[broker].stop()


def eventually(check: Callable[[], bool], timeout: float = 15.0, what: object = None) -> None:
    """Wait until ``check`` holds; ``what`` is shown if it does not in time."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached in time: {what}")
        time.sleep(0.1)


@contextmanager
def web_overlay(directory: Path, options: tuple[str, ...] = ()) -> Iterator[WebOverlay]:
    """Start the overlay; every process is stopped afterwards, even if a start fails."""
    with ExitStack() as stack:
        procs: dict[str, BrokerProcess] = {}
        b2 = procs["B2"] = BrokerProcess("B2", options=list(options))
        stack.callback(b2.stop)
        b2.start()
        for name in ("B1", "B3"):
            procs[name] = BrokerProcess(name, neighbours=[b2.url], options=list(options))
            stack.callback(procs[name].stop)
        url = f"sqlite:///{directory / 'db1.sqlite'}"
        db = DatabaseProcess("DB1", b2.url, url, stores=[ORDERS])
        stack.callback(db.stop)
        with ThreadPoolExecutor() as starting:  # each takes a second or two to import
            for started in [starting.submit(p.start) for p in (procs["B1"], procs["B3"], db)]:
                started.result()
        overlay = WebOverlay(procs, db)

        def linked() -> bool:
            health = httpx.get(f"{overlay.http('B2')}/health").json()
            return len(health["neighbours"]) == 2

        def complete() -> bool:
            view = httpx.get(f"{overlay.http('B2')}/api/v1/overlay").json()
            return len(view["brokers"]) == 3 and len(view["databases"]) == 1

        eventually(linked)
        # The first request of a quiet overlay waits for the brokers' first reports.
        first = httpx.get(f"{overlay.http('B1')}/api/v1/overlay", timeout=10).json()
        assert [b["id"] for b in first["brokers"]] == ["B1", "B2", "B3"], first
        assert len(first["links"]) == 2, first
        eventually(complete)
        yield overlay


@pytest.fixture(scope="module")
def overlay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebOverlay]:
    with web_overlay(tmp_path_factory.mktemp("web")) as started:
        yield started


def _problem(response: httpx.Response, status: int, *words: str) -> dict[str, Any]:
    """The response is a problem document with ``status`` whose detail names ``words``."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    problem: dict[str, Any] = response.json()
    assert problem["status"] == status and problem["title"]
    for word in words:
        assert word in problem["detail"], problem
    return problem


def _advertise(base: str, text: str, client: str) -> str:
    r = httpx.post(f"{base}/api/v1/advertisements", json={"filter": text, "client": client})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _subscribe(base: str, **body: Any) -> dict[str, Any]:
    r = httpx.post(f"{base}/api/v1/subscriptions", json=body)
    assert r.status_code == 201, r.text
    made: dict[str, Any] = r.json()
    return made


def _events(lines: Iterator[str], count: int) -> list[dict[str, Any]]:
    """The next ``count`` events of an SSE stream's lines: id, event and data."""
    events: list[dict[str, Any]] = []
    event: dict[str, Any] = {}
    for line in lines:
        if line.startswith(":"):
            continue
        if not line:
            if event:
                events.append(event)
                event = {}
            if len(events) == count:
                return events
            continue
        key, _, value = line.partition(": ")
        event[key] = orjson.loads(value) if key == "data" else value
    raise AssertionError(f"the stream ended after {events}")


@contextmanager
def _stream(url: str, headers: dict[str, str] | None = None) -> Iterator[Iterator[str]]:
    """The lines of an SSE stream, once the broker has attached it (its first comment has
    come)."""
    with (
        httpx.Client(timeout=10) as client,
        client.stream("GET", url, headers=headers or {}) as response,
    ):
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = response.iter_lines()
        assert next(lines) == ": subscribed"
        yield lines


def _metric(base: str, line_start: str) -> float:
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _counter(base: str, name: str, peer: str) -> float:
    return _metric(base, f'{name}{{peer="{peer}"}}')


def test_a_publication_at_one_broker_reaches_an_sse_subscriber_at_another(
    overlay: WebOverlay,
) -> None:
    b1, b3 = overlay.http("B1"), overlay.http("B3")
    aid = _advertise(b1, "[class,eq,'STOCK'],[price,isPresent,0]", "quotes")
    sub = _subscribe(b3, filter="[class,eq,'STOCK'],[price,>,10]")
    assert sub["id"] in [s["id"] for s in httpx.get(f"{b3}/api/v1/subscriptions").json()]
    with _stream(b3 + sub["events"]) as events:
        text = "[class,'STOCK'],[price,5]\n# a comment\n[class,'STOCK'],[price,50]\n"
        r = httpx.post(
            f"{b1}/api/v1/publications?client=quotes",
            content=text,
            headers={"content-type": "text/plain"},
        )
        assert r.status_code == 201, r.text
        ids = r.json()["ids"]
        assert len(ids) == 2 and r.json()["publisher"] == "quotes@B1"
        (event,) = _events(events, 1)
    assert event["event"] == "notify"
    assert event["data"]["publication"]["id"] == ids[1]
    assert event["data"]["publication"]["attributes"] == {"class": "STOCK", "price": 50}
    assert event["data"]["subscriptions"] == [sub["id"]]
    listed = httpx.get(f"{b3}/api/v1/subscriptions/{sub['id']}").json()
    assert listed["delivered"] == 1 and listed["text"] == "[class,eq,'STOCK'],[price,>,10]"
    assert httpx.delete(f"{b3}/api/v1/subscriptions/{sub['id']}").status_code == 204
    _problem(httpx.get(f"{b3}{sub['events']}"), 404, sub["id"], "unsubscribed")

    assert aid in [a["id"] for a in httpx.get(f"{b1}/api/v1/advertisements").json()]
    assert httpx.delete(f"{b1}/api/v1/advertisements/{aid}").status_code == 204
    assert aid not in [a["id"] for a in httpx.get(f"{b1}/api/v1/advertisements").json()]
    r = httpx.post(f"{b1}/api/v1/publications?client=quotes", json={"class": "STOCK", "price": 1})
    _problem(r, 409, "quotes@B1", "advertise")


def test_rest_and_websocket_clients_apply_one_conformity_rule(overlay: WebOverlay) -> None:
    """A publication that leaves out an advertised attribute conforms (PADRES' rule), whether
    it comes through REST or through the WebSocket client; one that breaks a predicate of the
    advertisement does not, either way."""
    b1 = overlay.http("B1")
    advertisement = "[class,eq,'partial'],[price,<,100],[amount,>,100]"
    _advertise(b1, advertisement, "rest-partial")
    wanted = {"class": "partial", "price": 80}
    with (
        BlockingClient(overlay.brokers["B3"].url, "partial-reader") as reader,
        BlockingClient(overlay.brokers["B1"].url, "ws-partial") as writer,
    ):
        handle = reader.subscribe("[class,eq,'partial']")
        writer.advertise(advertisement)

        def routed() -> bool:
            rows = httpx.get(f"{b1}/api/v1/routing", params={"search": "partial"}).json()
            return bool(rows["rows"])

        eventually(routed, what="the subscription at B3 is in B1's routing table")
        r = httpx.post(f"{b1}/api/v1/publications?client=rest-partial", json=wanted)
        assert r.status_code == 201, r.text
        writer.publish("[class,'partial'],[price,80]")
        got = list(reader.deliveries(handle, timeout=5))
        assert [d.publication.attributes for d in got if isinstance(d, Notify)] == [wanted] * 2
        r = httpx.post(
            f"{b1}/api/v1/publications?client=rest-partial", json={**wanted, "price": 150}
        )
        _problem(r, 409, "rest-partial@B1", "advertise")
        writer.publish("[class,'partial'],[price,150]")
        writer.flush(5)
        assert list(reader.deliveries(handle, timeout=1)) == []


def test_a_composite_subscription_over_websocket(overlay: WebOverlay) -> None:
    b1, b3 = overlay.http("B1"), overlay.http("B3")
    _advertise(b1, "[class,eq,'Load'],[host,isPresent,'']", "ops")
    _advertise(b1, "[class,eq,'Alarm'],[host,isPresent,'']", "ops")
    sub = _subscribe(
        b3, expression="{[class,eq,'Load'],[host,eq,$X]} & {[class,eq,'Alarm'],[host,eq,$X]}"
    )
    assert sub["kind"] == "composite"
    with connect(b3.replace("http", "ws") + sub["websocket"]) as ws:
        time.sleep(0.2)  # the stream attaches
        r = httpx.post(
            f"{b1}/api/v1/publications?client=ops",
            json=[{"class": "Load", "host": "h7"}, "[class,'Alarm'],[host,'h7']"],
        )
        assert r.status_code == 201, r.text
        message = orjson.loads(ws.recv(timeout=10))
    assert message["type"] == "composite_notify"
    assert message["bindings"] == {"X": "h7"}
    assert [p["id"] for p in message["publications"]] == r.json()["ids"]


def test_a_durable_subscription_resumes_after_the_last_event_id(overlay: WebOverlay) -> None:
    b1, b2 = overlay.http("B1"), overlay.http("B2")
    _advertise(b1, "[class,eq,'Tick'],[n,isPresent,0]", "ticker")
    sub = _subscribe(b2, filter="[class,eq,'Tick']", durable=True, name="ticks")
    assert sub["id"] == "ticks" and sub["durable"]

    def publish(*numbers: int) -> None:
        body = [{"class": "Tick", "n": n} for n in numbers]
        r = httpx.post(f"{b1}/api/v1/publications?client=ticker&guaranteed=true", json=body)
        assert r.status_code == 201, r.text

    publish(1, 2, 3)  # nobody reads: the broker keeps them
    with _stream(f"{b2}{sub['events']}") as events:
        got = _events(events, 3)
    assert [(e["id"], e["data"]["publication"]["attributes"]["n"]) for e in got] == [
        ("1", 1),
        ("2", 2),
        ("3", 3),
    ]
    publish(4, 5)
    with _stream(f"{b2}{sub['events']}", {"Last-Event-ID": "3"}) as events:
        got = _events(events, 2)
    assert [e["data"]["publication"]["attributes"]["n"] for e in got] == [4, 5]
    assert [e["id"] for e in got] == ["4", "5"]
    assert httpx.delete(f"{b2}/api/v1/subscriptions/ticks").status_code == 204


def test_a_durable_composite_subscription_keeps_its_matches_for_its_reader(
    overlay: WebOverlay,
) -> None:
    b1, b2 = overlay.http("B1"), overlay.http("B2")
    _advertise(b1, "[class,eq,'Login'],[user,isPresent]", "bank")
    _advertise(b1, "[class,eq,'Transfer'],[user,isPresent]", "bank")
    expression = (
        "{[class,eq,'Login'],[user,eq,$U]} ; {[class,eq,'Transfer'],[user,eq,$U]} within 1m"
    )
    sub = _subscribe(b2, expression=expression, durable=True, name="risky")
    assert (sub["id"], sub["kind"], sub["durable"]) == ("risky", "composite", True)
    now = time.time()

    def publish(*events: tuple[str, str, float]) -> None:
        body = [f"[class,'{c}'],[user,'{u}'],[time,'{_iso(now + at)}']" for c, u, at in events]
        r = httpx.post(f"{b1}/api/v1/publications?client=bank&guaranteed=true", json=body)
        assert r.status_code == 201, r.text

    # The second Login lets ann's Transfer out of the composite's reorder buffer.
    publish(("Login", "ann", 0), ("Transfer", "ann", 1), ("Login", "bob", 2))
    with _stream(f"{b2}{sub['events']}") as events:
        (first,) = _events(events, 1)
    assert (first["id"], first["event"], first["data"]["bindings"]) == (
        "1",
        "composite_notify",
        {"U": "ann"},
    )
    publish(("Transfer", "bob", 3), ("Login", "end", 4))
    with _stream(f"{b2}{sub['events']}", {"Last-Event-ID": "1"}) as events:
        (second,) = _events(events, 1)
    assert (second["id"], second["data"]["bindings"]) == ("2", {"U": "bob"})
    assert httpx.delete(f"{b2}/api/v1/subscriptions/risky").status_code == 204


def test_history_pages_and_streams_what_the_database_stored(overlay: WebOverlay) -> None:
    b1, b3 = overlay.http("B1"), overlay.http("B3")
    _advertise(b1, "[class,eq,'Order'],[n,isPresent,0]", "shop")
    before = time.time()
    orders = [{"class": "Order", "n": n} for n in range(5)]
    assert httpx.post(f"{b1}/api/v1/publications?client=shop", json=orders).status_code == 201
    query = {"filter": ORDERS, "from": f"{_iso(before - 1)}", "to": "now"}

    seen: list[Any] = []

    def stored() -> bool:
        r = httpx.get(f"{b3}/api/v1/history", params=query | {"page_size": 2}, timeout=30)
        seen[:] = [r.json()]
        return bool(r.json()["total"] == 5)

    eventually(stored, timeout=20, what=seen)
    pages: list[dict[str, Any]] = []
    params: dict[str, Any] = query | {"page_size": 2}
    while True:
        r = httpx.get(f"{b3}/api/v1/history", params=params, timeout=30)
        assert r.status_code == 200, r.text
        pages.append(r.json())
        token = pages[-1]["next_page_token"]
        if token is None:
            break
        params = {"page_token": token, "page_size": 2}
    assert [len(p["rows"]) for p in pages] == [2, 2, 1]
    assert [row["attributes"]["n"] for p in pages for row in p["rows"]] == [0, 1, 2, 3, 4]
    assert pages[0]["databases"] == ["DB1@B2"] and pages[0]["failed"] == []

    r = httpx.get(f"{b3}/api/v1/history/stream", params=query, timeout=30)
    assert r.headers["content-type"].startswith("application/x-ndjson")
    lines = [orjson.loads(line) for line in r.text.splitlines()]
    assert [line["attributes"]["n"] for line in lines[:-1]] == [0, 1, 2, 3, 4]
    assert lines[-1]["done"]["count"] == 5


def _iso(at: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(at, UTC).isoformat()


def test_the_broker_its_routing_tables_and_the_overlay(overlay: WebOverlay) -> None:
    b1, b2 = overlay.http("B1"), overlay.http("B2")
    _advertise(b1, "[class,eq,'Route'],[x,isPresent,0]", "router")
    sub = _subscribe(b2, filter="[class,eq,'Route'],[x,>,1]")
    broker = httpx.get(f"{b2}/api/v1/broker").json()
    assert broker["id"] == "B2" and broker["uptime"] > 0
    assert sorted(n["id"] for n in broker["neighbours"]) == ["B1", "B3"]
    assert "DB1@B2" in [c["name"] for c in broker["clients"]]
    assert {"queued_bytes", "dropped", "evicted"} <= set(broker["queues"])

    prt = httpx.get(f"{b2}/api/v1/routing", params={"table": "prt", "search": "route"}).json()
    assert [r for r in prt["rows"] if "[class,eq,'Route'],[x,>,1]" in r] and prt["total"] == 1
    srt = httpx.get(f"{b2}/api/v1/routing", params={"table": "srt", "search": "'Route'"}).json()
    assert srt["total"] == 1 and "[class,eq,'Route'],[x,isPresent]" in srt["rows"][0]
    first = httpx.get(f"{b2}/api/v1/routing", params={"table": "srt", "page_size": 1}).json()
    assert len(first["rows"]) == 1 and first["total"] > 1
    second = httpx.get(
        f"{b2}/api/v1/routing",
        params={"table": "srt", "page_size": 1, "page_token": first["next_page_token"]},
    ).json()
    assert second["rows"] != first["rows"]

    view = httpx.get(f"{b1}/api/v1/overlay").json()
    assert [b["id"] for b in view["brokers"]] == ["B1", "B2", "B3"]
    assert view["links"] == [
        {"source": "B1", "target": "B2"},
        {"source": "B2", "target": "B3"},
    ]
    assert {"name": "DB1@B2", "broker": "B2", "database": True} in view["clients"]
    assert view["databases"] == [{"id": "DB1@B2", "broker": "B2", "stores": [ORDERS]}]
    httpx.delete(f"{b2}/api/v1/subscriptions/{sub['id']}")


def test_databases_are_listed_and_told_what_to_store(overlay: WebOverlay) -> None:
    b3 = overlay.http("B3")
    assert httpx.get(f"{b3}/api/v1/databases").json() == [{"id": "DB1@B2", "stores": [ORDERS]}]
    r = httpx.post(f"{b3}/api/v1/databases/DB1/store", json={"filter": "[class,eq,'Refund']"})
    assert r.status_code == 200, r.text
    assert r.json()["ok"] is True and "[class,eq,'Refund']" in r.json()["specs"]
    eventually(lambda: len(httpx.get(f"{b3}/api/v1/databases").json()[0]["stores"]) == 2)
    r = httpx.post(f"{b3}/api/v1/databases/DB1/stop", json={"filter": "[class,eq,'Refund']"})
    assert r.json()["ok"] is True and r.json()["specs"] == [ORDERS]
    _problem(httpx.post(f"{b3}/api/v1/databases/DB9/store", json={"filter": ORDERS}), 404, "DB9")


def test_metrics_in_the_prometheus_format(overlay: WebOverlay) -> None:
    b1, b2, b3 = overlay.http("B1"), overlay.http("B2"), overlay.http("B3")
    _advertise(b1, "[class,eq,'Order'],[meter,isPresent,0]", "meter")
    before = _counter(b1, "padres_publications_in_total", "clients")
    ingested = _metric(b2, 'padres_database_ingest_total{database="DB1@B2"}')
    replays = _metric(b3, "padres_replays_total")
    orders = [{"class": "Order", "meter": n} for n in range(3)]
    assert httpx.post(f"{b1}/api/v1/publications?client=meter", json=orders).status_code == 201
    history = httpx.get(f"{b3}/api/v1/history", params={"filter": ORDERS, "from": "now-1h"})
    assert history.status_code == 200

    r = httpx.get(f"{b1}/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    assert _counter(b1, "padres_publications_in_total", "clients") == before + 3
    assert _counter(b1, "padres_publications_out_total", "B2") >= 3
    assert _metric(b1, "padres_match_seconds_count") >= 3
    eventually(
        lambda: _metric(b2, 'padres_database_ingest_total{database="DB1@B2"}') == ingested + 3
    )
    assert _metric(b3, "padres_replays_total") == replays + 1
    assert _metric(b3, "padres_replay_seconds_count") == replays + 1
    for name in ("padres_matches_total", "padres_queue_bytes", "padres_dropped_messages_total"):
        assert name in r.text, name


def test_a_databases_ingest_counts_its_deliveries_only() -> None:
    """A hop counts as a database once it offers replays; what it ingests is what is delivered
    to it, never publications routed to it (a neighbour whose offer the core refused)."""
    from types import SimpleNamespace

    from padres.broker import Out
    from padres.model.messages import Advertisement, Filter, Predicate, Publication
    from padres.model.protocol import Notify, ReplayOffer, RoutePublish
    from rete.operators import Op
    from web.metrics import Metrics

    broker = SimpleNamespace(sessions={"h1": SimpleNamespace(name="DB1@B1")}, peers={"n1": "B2"})
    metrics = Metrics(SimpleNamespace(broker=broker))  # type: ignore[arg-type]
    orders = Filter((Predicate("class", Op.EQ, "Order"),))
    pub = Publication("p1", {"class": "Order"}, datetime.now(UTC), "shop@B1")
    for hop in ("h1", "n1"):
        metrics.observe(hop, [(ReplayOffer(Advertisement(f"a{hop}", orders)), [], 0.0)])
    sent: list[Out] = [("n1", RoutePublish(pub, "t1")), ("h1", Notify(pub, ("s1",)))]
    metrics.observe("h2", [(pub, sent, 1e-5), (pub, sent, 1e-5)])
    assert metrics.ingest == {"DB1@B1": 2}
    # h2, a client gone already: counted with the other clients, not under a name of its own
    assert metrics.totals == {"in": {"clients": 2}, "out": {"B2": 2, "DB1@B1": 2}}


def test_a_trace_follows_a_publication_hop_by_hop(overlay: WebOverlay) -> None:
    b1, b3 = overlay.http("B1"), overlay.http("B3")
    _advertise(b1, "[class,eq,'Parcel'],[to,isPresent,'']", "post")
    sub = _subscribe(b3, filter="[class,eq,'Parcel']")
    r = httpx.post(
        f"{b1}/api/v1/traces",
        json={"publication": "[class,'Parcel'],[to,'x']", "client": "post"},
    )
    assert r.status_code == 201, r.text
    trace = r.json()

    def traced() -> bool:
        seen = httpx.get(f"{b1}/api/v1/traces/{trace['id']}").json()
        return len(seen["hops"]) == 3

    eventually(traced)
    seen = httpx.get(f"{b1}/api/v1/traces/{trace['id']}").json()
    assert seen["publisher"] == "post@B1"
    path = [(h["broker"], h["from"], h["to"]) for h in seen["hops"]]
    assert path == [("B1", "post@B1", ["B2"]), ("B2", "B1", ["B3"]), ("B3", "B2", [])]
    assert seen["hops"][2]["matched"] == [
        {"client": f"web-{sub['id']}@B3", "subscription": sub["id"]}
    ]
    assert {h["publication"] for h in seen["hops"]} == {seen["publication"]}
    _problem(httpx.post(f"{b1}/api/v1/traces", json={}), 400, "exactly one")


def test_a_trace_of_the_next_match_shows_every_hop_of_a_client_publication(
    overlay: WebOverlay,
) -> None:
    """A publication from an ordinary client (its message names no publisher: the broker
    does) is reported at its first broker under the publisher the others see."""
    b1, b3 = overlay.http("B1"), overlay.http("B3")
    sub = _subscribe(b3, filter="[class,eq,'Letter']")
    r = httpx.post(f"{b1}/api/v1/traces", json={"filter": "[class,eq,'Letter']"})
    assert r.status_code == 201, r.text
    tid = r.json()["id"]
    with BlockingClient(f"ws://127.0.0.1:{overlay.brokers['B1'].port}", "postie") as postie:
        postie.advertise("[class,eq,'Letter'],[to,isPresent,'']")
        postie.publish("[class,'Letter'],[to,'x']")

        def traced() -> list[dict[str, Any]]:
            hops: list[dict[str, Any]] = httpx.get(f"{b1}/api/v1/traces/{tid}").json()["hops"]
            return hops

        eventually(lambda: len(traced()) == 3, what=traced)
    seen = httpx.get(f"{b1}/api/v1/traces/{tid}").json()
    assert seen["publisher"] == "postie@B1"
    assert [h["broker"] for h in seen["hops"]] == ["B1", "B2", "B3"]
    assert seen["hops"][2]["matched"] == [
        {"client": f"web-{sub['id']}@B3", "subscription": sub["id"]}
    ]


def test_bad_input_is_refused_whole_with_a_problem_naming_it(overlay: WebOverlay) -> None:
    b1 = overlay.http("B1")
    api = f"{b1}/api/v1"
    _advertise(b1, "[class,eq,'Bad'],[n,isPresent,0]", "careful")
    before = _counter(b1, "padres_publications_in_total", "clients")

    text = "[class,'Bad'],[n,1]\n[class,'Bad'],[n,2\n"
    problem = _problem(
        httpx.post(
            f"{api}/publications?client=careful",
            content=text,
            headers={"content-type": "text/plain"},
        ),
        400,
        "line 2",
        "column",
        "nothing was accepted",
    )
    (error,) = problem["errors"]
    assert error["line"] == 2 and error["excerpt"] == "[class,'Bad'],[n,2"
    assert error["caret"].endswith("^") and len(error["caret"]) == error["column"]
    problem = _problem(
        httpx.post(f"{api}/publications?client=careful", json=[{"class": "Bad"}, {"n": 1}]),
        400,
        "publications[1]",
        "class",
    )
    _problem(
        httpx.post(f"{api}/publications?client=careful", json=[{"class": "Other"}]),
        409,
        "advertise",
    )
    _problem(
        httpx.post(
            f"{api}/publications", content=b"{", headers={"content-type": "application/json"}
        ),
        400,
        "not JSON",
    )
    _problem(
        httpx.post(f"{api}/publications", content=b"x", headers={"content-type": "image/png"}),
        415,
        "image/png",
    )
    _problem(httpx.post(f"{api}/publications", json=[]), 400, "no publication")
    assert _counter(b1, "padres_publications_in_total", "clients") == before

    _problem(
        httpx.post(f"{api}/advertisements", json={"filter": "[class,eq,'X'],[y,>>,1]"}),
        400,
        "filter",
        "column",
    )
    _problem(
        httpx.post(f"{api}/advertisements", json={"filter": "[class,eq,'X']", "client": "a b"}),
        400,
        "client name",
    )
    _problem(httpx.post(f"{api}/advertisements", json={}), 422, "filter")
    _problem(httpx.delete(f"{api}/advertisements/nope"), 404, "nope")
    _problem(httpx.post(f"{api}/subscriptions", json={}), 400, "exactly one")
    _problem(httpx.post(f"{api}/subscriptions", json={"expression": "{[class,eq,'A']} &"}), 400)
    _problem(httpx.post(f"{api}/subscriptions", json={"filter": ["class", "eq"]}), 422, "filter")
    _problem(httpx.post(f"{api}/subscriptions", json={"filter": [["class", "eq"]]}), 400, "filter")
    _problem(httpx.get(f"{api}/subscriptions/none/events"), 404, "none")
    _problem(httpx.delete(f"{api}/subscriptions/none"), 404, "none")
    _problem(httpx.get(f"{api}/history", params={"filter": ORDERS, "to": "now+1h"}), 400, "now")
    _problem(httpx.get(f"{api}/history", params={"filter": ORDERS, "from": "noon"}), 400, "from")
    _problem(httpx.get(f"{api}/history", params={"page_token": "%%%"}), 400, "token")
    _problem(httpx.get(f"{api}/history"), 400, "filter")
    _problem(httpx.get(f"{api}/routing", params={"table": "xrt"}), 422, "table")
    _problem(httpx.get(f"{api}/traces/none"), 404, "none")
    _problem(httpx.get(f"{b1}/nowhere"), 404, "/nowhere")
    assert httpx.get(f"{api}/advertisements").status_code == 200


def test_a_batch_breaking_a_schema_is_refused_whole_and_schema_publications_declare(
    overlay: WebOverlay,
) -> None:
    b1, b3 = overlay.http("B1"), overlay.http("B3")
    api = f"{b1}/api/v1/publications?client=ticker"
    declaration = "[class,'SCHEMA'],[of,'Tick'],[attributes,'symbol:string price:float']"
    r = httpx.post(api, json=declaration)  # needs no advertisement
    assert r.status_code == 201, r.text
    problem = _problem(
        httpx.post(api, json=[declaration, {"class": "Tick", "symbol": "A", "price": 1}]),
        400,
        "request of their own",
    )
    assert [e["where"] for e in problem["errors"]] == ["publications[1]"]
    _advertise(b1, "[class,eq,'Tick']", "ticker")
    sub = _subscribe(b3, filter="[class,eq,'Tick']")  # the schema reached B3 with the 201
    before = _counter(b1, "padres_publications_in_total", "clients")
    bad = [
        {"class": "Tick", "symbol": "A", "price": 1},
        {"class": "Tick", "symbol": "A", "price": "high"},
        {"class": "Tick", "symbol": "B", "price": 2, "volume": 3},
    ]
    for guaranteed in ("false", "true"):
        problem = _problem(
            httpx.post(f"{api}&guaranteed={guaranteed}", json=bad),
            422,
            "2 of the publications",
            "nothing was published",
        )
        reasons = {e["where"]: e["reason"] for e in problem["errors"]}
        assert list(reasons) == ["publications[1]", "publications[2]"]
        assert "'price': expected float, found string 'high'" in reasons["publications[1]"]
        assert "has no attribute 'volume'" in reasons["publications[2]"]
    assert _counter(b1, "padres_publications_in_total", "clients") == before
    with _stream(b3 + sub["events"]) as events:
        r = httpx.post(api, json={"class": "Tick", "symbol": "C", "price": 3.5})
        assert r.status_code == 201, r.text
        (event,) = _events(events, 1)  # the first delivery: nothing refused got through
    assert event["data"]["publication"]["attributes"]["symbol"] == "C"


def test_an_sse_reader_too_slow_for_its_queue_is_evicted() -> None:
    broker = BrokerProcess("S", options=["--client-queue", "0.25", "--evict-after", "0.5"])
    broker.start()
    try:
        base = f"http://127.0.0.1:{broker.port}"
        _advertise(base, "[class,eq,'Flood'],[pad,isPresent,'']", "flood")
        sub = _subscribe(base, filter="[class,eq,'Flood']")
        with socket.socket() as reader:  # a reader that takes a few bytes and then no more
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            reader.connect(("127.0.0.1", broker.port))
            reader.sendall(f"GET {sub['events']} HTTP/1.1\r\nHost: here\r\n\r\n".encode())
            head = b""
            while b": subscribed" not in head:
                head += reader.recv(4096)
            batch = [{"class": "Flood", "pad": "x" * 1000}] * 2000
            deadline = time.monotonic() + 20
            while httpx.get(f"{base}/api/v1/subscriptions/{sub['id']}").status_code == 200:
                assert time.monotonic() < deadline, "the slow reader was never evicted"
                r = httpx.post(f"{base}/api/v1/publications?client=flood", json=batch)
                assert r.status_code == 201
        _problem(httpx.get(f"{base}/api/v1/subscriptions/{sub['id']}"), 404, "evicted", "slowly")
        health = httpx.get(f"{base}/health").json()
        assert health["evicted"] == 1 and health["dropped"] > 0
    finally:
        broker.stop()


def test_the_api_description_is_served_without_a_cdn(overlay: WebOverlay) -> None:
    b1 = overlay.http("B1")
    page = httpx.get(f"{b1}/docs")
    assert page.status_code == 200 and "/openapi.json" in page.text
    scripts = [s for s in ("swagger-ui-bundle.js", "swagger-ui.css") if f"/static/{s}" in page.text]
    assert len(scripts) == 2 and "cdn" not in page.text.lower(), page.text
    for asset in scripts:
        assert httpx.get(f"{b1}/static/{asset}").status_code == 200


def test_a_durable_subscription_outlasts_a_broker_restart(tmp_path: Path) -> None:
    data = ("--data", str(tmp_path))
    with ExitStack() as stack:
        broker = BrokerProcess("W1", options=list(data))
        stack.callback(broker.stop)
        broker.start()
        base = f"http://127.0.0.1:{broker.port}"
        _advertise(base, "[class,eq,'Tick'],[n,isPresent,0]", "ticker")
        sub = _subscribe(base, filter="[class,eq,'Tick']", durable=True, name="kept")
        body = [{"class": "Tick", "n": n} for n in (1, 2)]
        r = httpx.post(f"{base}/api/v1/publications?client=ticker&guaranteed=true", json=body)
        assert r.status_code == 201, r.text
        broker.kill()
        broker.start()  # on the same port
        listed = httpx.get(f"{base}/api/v1/subscriptions").json()
        assert [(s["id"], s["durable"]) for s in listed] == [("kept", True)]
        with _stream(f"{base}{sub['events']}") as events:
            got = _events(events, 2)
        assert [e["data"]["publication"]["attributes"]["n"] for e in got] == [1, 2]


def test_a_trace_is_complete_in_a_cyclic_overlay() -> None:
    """B1, B2 and B3 all linked: the trace request and the publication may take different
    paths, and every broker still reports the publication."""
    with ExitStack() as stack:
        procs: list[BrokerProcess] = []
        for name in ("C1", "C2", "C3"):
            proc = BrokerProcess(name, neighbours=[p.url for p in procs])
            stack.callback(proc.stop)
            proc.start()
            procs.append(proc)
        c1, c2, c3 = (f"http://127.0.0.1:{p.port}" for p in procs)
        eventually(lambda: len(httpx.get(f"{c1}/health").json()["neighbours"]) == 2)
        _advertise(c1, "[class,eq,'Parcel'],[to,isPresent,'']", "post")
        subs = {b: _subscribe(b, filter="[class,eq,'Parcel']")["id"] for b in (c2, c3)}
        for attempt in range(3):
            r = httpx.post(
                f"{c1}/api/v1/traces",
                json={"publication": f"[class,'Parcel'],[to,'x{attempt}']", "client": "post"},
                timeout=15,
            )
            assert r.status_code == 201, r.text
            tid = r.json()["id"]
            assert r.json()["armed"] == ["C1", "C2", "C3"]

            def matched(tid: str = tid) -> set[str]:
                hops = httpx.get(f"{c1}/api/v1/traces/{tid}").json()["hops"]
                return {m["subscription"] for h in hops for m in h["matched"]}

            eventually(lambda: matched() == set(subs.values()), what=matched)


def test_what_rest_clients_hold_at_the_broker_is_bounded_per_account() -> None:
    """A plain REST subscription nobody reads queues at most ``LIVE_QUEUE`` bytes at the
    broker; one account keeps at most ``OPEN_PER_ACCOUNT`` open and ``PUBLISHERS_PER_ACCOUNT``
    publishers; a publish refused under a new client name keeps no publisher."""
    broker = BrokerProcess(
        "S", options=["--max-subscriptions", "1000", "--evict-after", "60", "--heartbeat", "1"]
    )
    broker.start()
    try:
        base = f"http://127.0.0.1:{broker.port}"
        _advertise(base, "[class,eq,'Flood'],[pad,isPresent,'']", "flood")
        unread = _subscribe(base, filter="[class,eq,'Flood']")
        batch = [{"class": "Flood", "pad": "x" * 1000}] * 1000
        for _ in range(3):
            r = httpx.post(f"{base}/api/v1/publications?client=flood", json=batch)
            assert r.status_code == 201, r.text

        def queue() -> dict[str, Any]:
            info = httpx.get(f"{base}/api/v1/broker").json()
            return next(c for c in info["clients"] if c["name"].startswith(f"web-{unread['id']}"))

        deadline = time.monotonic() + 10
        while queue()["dropped"] == 0:
            assert time.monotonic() < deadline, "nothing was dropped"
            time.sleep(0.1)
        assert queue()["queued_bytes"] <= LIVE_QUEUE + 2048
        for _ in range(OPEN_PER_ACCOUNT - 1):
            _subscribe(base, filter="[class,eq,'Other']")
        over = httpx.post(f"{base}/api/v1/subscriptions", json={"filter": "[class,eq,'Other']"})
        _problem(over, 409, f"the API has {OPEN_PER_ACCOUNT} REST subscriptions open")
        for n in range(PUBLISHERS_PER_ACCOUNT + 5):  # refused, so none is kept
            r = httpx.post(f"{base}/api/v1/publications?client=stray{n}", json={"class": "Flood"})
            _problem(r, 409, "advertise what you publish first")
        for n in range(PUBLISHERS_PER_ACCOUNT - 1):  # 'flood' is the first
            _advertise(base, "[class,eq,'Flood'],[pad,isPresent,'']", f"shop{n}")
        r = httpx.post(
            f"{base}/api/v1/advertisements",
            json={"filter": "[class,eq,'Flood']", "client": "one-too-many"},
        )
        _problem(r, 409, f"the API keeps {PUBLISHERS_PER_ACCOUNT} publishers")
        names = [c["name"] for c in httpx.get(f"{base}/api/v1/broker").json()["clients"]]
        assert not [name for name in names if name.startswith("stray")]
    finally:
        broker.stop()
