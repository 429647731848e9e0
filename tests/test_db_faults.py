"""Faults around a database node, with real broker and database processes: the node frozen
long enough for its broker to drop it, the node killed, its broker killed and restarted,
publications whose timestamps have no UTC equivalent. Nothing the overlay accepted is lost."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect

from historic import Store
from padres.client.connection import Client, ClientState
from padres.errors import DecodeError, InvalidMessage, ParseError
from padres.language.parser import parse_publication
from padres.model.codec import decode
from padres.model.messages import Filter, Predicate, Publication
from padres.testing.processes import BrokerProcess, DatabaseProcess, free_ports
from rete.operators import Op
from tests.support import eventually

T = "[class,eq,'T']"
POISON = ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"]
"""Timestamps that exist in their own zone but not in UTC."""


class Setup:
    """A broker (pinging every second) and a database node storing class T into SQLite."""

    def __init__(self, tmp_path: Path) -> None:
        self.broker = BrokerProcess("B", options=["--heartbeat", "1"])
        self.url = self.broker.start()
        self.db_url = f"sqlite:///{tmp_path / 'db1.sqlite'}"
        self.log_path = tmp_path / "db1.log"
        self._log = self.log_path.open("wb")
        self.db = DatabaseProcess("DB1", self.url, self.db_url, stores=[T], log=self._log)
        self.db.start()
        self.store = Store(self.db_url)

    def stored(self) -> set[str]:
        return {p.id for p in self.store.query(Filter((Predicate("class", Op.EQ, "T"),)))}

    def attached(self) -> bool:
        """Whether the broker has the node among its clients."""
        health = self.url.replace("ws://", "http://").replace("/ws", "/health")
        with urllib.request.urlopen(health) as reply:
            return "DB1@B" in orjson.loads(reply.read())["clients"]

    def close(self) -> None:
        self.db.stop()
        self.broker.stop()
        self.store.close()
        self._log.close()


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    s = Setup(tmp_path)
    yield s
    s.close()


async def _node_subscribed(client: Client) -> None:
    """Wait until the node's subscription to T is at the broker again."""

    async def ready() -> bool:
        return any(T in row for row in await client.query("subscriptions"))

    await eventually(ready)


async def test_a_node_dropped_by_its_broker_reconnects_and_stores_again(setup: Setup) -> None:
    async with Client(setup.url, "pub") as pub:
        await pub.advertise(T)
        await _node_subscribed(pub)
        await pub.publish("[class,'T']", id="before")
        await eventually(lambda: "before" in setup.stored())
        setup.db.pause()  # alive but silent: the broker's pings go unanswered
        await eventually(lambda: not setup.attached())
        await pub.publish("[class,'T']", id="away")  # its broker keeps it for the node
        setup.db.resume()
        await eventually(setup.attached)
        await _node_subscribed(pub)
        await pub.publish("[class,'T']", id="after")
        await eventually(lambda: "after" in setup.stored())
    assert setup.db.alive
    assert setup.stored() == {"before", "away", "after"}
    assert "DB1: reconnected to" in setup.log_path.read_text()


async def test_a_node_reconnects_to_its_broker_killed_and_restarted(setup: Setup) -> None:
    async with Client(setup.url, "pub", reconnect=True) as pub:
        await pub.advertise(T)
        await _node_subscribed(pub)
        await pub.publish("[class,'T']", id="before")
        await eventually(lambda: "before" in setup.stored())
        setup.broker.kill()
        await eventually(lambda: pub.state is ClientState.CONNECTING)
        await asyncio.to_thread(setup.broker.start)  # the same port
        await eventually(lambda: pub.state is ClientState.OPEN)
        await _node_subscribed(pub)
        await pub.publish("[class,'T']", id="after")
        await eventually(lambda: "after" in setup.stored())
    assert setup.db.alive
    assert setup.stored() == {"before", "after"}


def _publication(ident: str, stamp: str) -> dict[str, Any]:
    return {
        "v": 1,
        "type": "publication",
        "id": ident,
        "timestamp": stamp,
        "attributes": {"class": "T"},
    }


@pytest.mark.parametrize("stamp", POISON)
def test_a_timestamp_with_no_utc_equivalent_is_refused_where_it_is_made(stamp: str) -> None:
    with pytest.raises(InvalidMessage, match=re.escape(f"timestamp {stamp} is out of range")):
        Publication("p", {"class": "T"}, datetime.fromisoformat(stamp))
    with pytest.raises(DecodeError, match=re.escape(f"timestamp {stamp} is out of range")):
        decode(orjson.dumps(_publication("p", stamp)))
    with pytest.raises(ParseError, match="out of range"):
        parse_publication(f"[class,'T'],[time,'{stamp}']", id="p")
    # An hour inside the range is fine.
    inside = stamp.replace("00:00:00+", "01:00:00+").replace("23:59:59-", "22:59:59-")
    assert Publication("p", {"class": "T"}, datetime.fromisoformat(inside))


async def test_poison_timestamps_are_refused_and_what_follows_is_stored(setup: Setup) -> None:
    now = datetime.now().astimezone().isoformat()

    async with Client(setup.url, "watcher") as watcher, connect(setup.url) as raw:
        await _node_subscribed(watcher)
        await raw.send(orjson.dumps({"v": 1, "type": "hello", "name": "raw", "role": "client"}))
        assert orjson.loads(await asyncio.wait_for(raw.recv(), 10))[0]["type"] == "welcome"
        advertise = {
            "v": 1,
            "type": "advertisement",
            "id": "a",
            "filter": [["class", "eq", "T"]],
        }
        await raw.send(orjson.dumps([advertise]))
        assert orjson.loads(await asyncio.wait_for(raw.recv(), 10))[0]["type"] == "ok"
        frame = [
            _publication("good0", now),
            *(_publication(f"poison{i}", stamp) for i, stamp in enumerate(POISON)),
            _publication("good1", now),
        ]
        await raw.send(orjson.dumps(frame))
        errors: list[dict[str, Any]] = []
        while len(errors) < len(POISON):
            errors += orjson.loads(await asyncio.wait_for(raw.recv(), 10))
        for i, stamp in enumerate(POISON):
            assert errors[i]["type"] == "error" and errors[i]["ref"] == f"poison{i}"
            assert f"timestamp {stamp} is out of range" in errors[i]["text"]
        await eventually(lambda: {"good0", "good1"} <= setup.stored())
        await raw.send(orjson.dumps([_publication("good2", now)]))  # a later batch
        await eventually(lambda: "good2" in setup.stored())
    assert setup.stored() == {"good0", "good1", "good2"}
    assert setup.store.rejected() == []  # refused at the broker: nothing reached the database


def _publications(start: int, stop: int) -> list[Publication]:
    now = datetime.now(UTC)
    return [Publication(f"n{i}", {"class": "T", "n": i}, now) for i in range(start, stop)]


async def _publish_fast(pub: Client, start: int, stop: int) -> None:
    for first in range(start, stop, 500):
        await pub.publish_many(_publications(first, min(first + 500, stop)))
    await pub.query("advertisements")  # a round trip: all of it was read


async def test_a_node_frozen_while_publishers_run_at_full_speed_stores_everything(
    setup: Setup,
) -> None:
    count = 20_000

    async with Client(setup.url, "pub") as pub:
        await pub.advertise("[class,eq,'T'],[n,isPresent,0]")
        await _node_subscribed(pub)
        setup.db.pause()  # long enough for the broker to drop it (heartbeat 1 s)
        await _publish_fast(pub, 0, count)
        await eventually(lambda: not setup.attached())
        setup.db.resume()
        await eventually(lambda: len(setup.stored()) == count, timeout=60)
    assert setup.stored() == {f"n{i}" for i in range(count)}


async def test_a_node_killed_and_started_again_loses_nothing(setup: Setup) -> None:
    count = 10_000

    async with Client(setup.url, "pub") as pub:
        await pub.advertise("[class,eq,'T'],[n,isPresent,0]")
        await _node_subscribed(pub)
        await _publish_fast(pub, 0, count // 2)
        setup.db.kill()  # what it had received and not written is not acknowledged
        await _publish_fast(pub, count // 2, count)
        await asyncio.to_thread(setup.db.start)
        await eventually(lambda: len(setup.stored()) == count, timeout=60)
    assert setup.stored() == {f"n{i}" for i in range(count)}


async def test_a_node_killed_mid_ingest_keeps_all_it_acknowledged_and_stores_each_once(
    setup: Setup,
) -> None:
    """Killed while it writes large commits: every publication its broker has an
    acknowledgement for is in the store, and the rest comes again, each stored once."""
    count = 60_000

    async with Client(setup.url, "pub") as pub:
        await pub.advertise("[class,eq,'T'],[n,isPresent,0]")
        await _node_subscribed(pub)
        publishing = asyncio.get_running_loop().create_task(_publish_fast(pub, 0, count))
        await eventually(lambda: _acked(setup.url) >= 2_000, timeout=60)
        setup.db.kill()
        acked = _acked(setup.url)  # deliveries are numbered in the order published
        assert {f"n{i}" for i in range(acked)} <= setup.stored()
        assert acked < count  # killed mid-ingest
        await publishing
        await asyncio.to_thread(setup.db.start)
        await eventually(lambda: setup.store.count() == count, timeout=60)
    assert setup.stored() == {f"n{i}" for i in range(count)}
    assert setup.store.count() == count


def _acked(url: str) -> int:
    """The last delivery of the node's durable subscription to T its broker has an
    acknowledgement for."""
    health = url.replace("ws://", "http://").replace("/ws", "/health")
    with urllib.request.urlopen(health) as reply:
        durables = orjson.loads(reply.read())["durables"]
    (stored,) = [d for d in durables if d["name"].startswith("store-")]
    return int(stored["acked"])


async def test_the_broker_of_a_node_killed_and_restarted_loses_nothing_guaranteed(
    tmp_path: Path,
) -> None:
    """Guaranteed publications from another broker, while the node's broker is down, are
    recovered from the publisher's broker when it comes back on its journal."""
    (port,) = free_ports(1)
    node_broker = BrokerProcess(
        "B", port=port, options=["--heartbeat", "1", "--data", str(tmp_path / "B")]
    )
    url_b = node_broker.start()
    publisher_broker = BrokerProcess(
        "A", neighbours=[url_b], options=["--heartbeat", "1", "--data", str(tmp_path / "A")]
    )
    url_a = publisher_broker.start()
    db_url = f"sqlite:///{tmp_path / 'db1.sqlite'}"
    db = DatabaseProcess("DB1", url_b, db_url, stores=[T])
    store = Store(db_url)
    count = 6_000

    def stored() -> set[str]:
        return {p.id for p in store.query(Filter((Predicate("class", Op.EQ, "T"),)))}

    try:
        db.start()
        async with Client(url_a, "pub", reconnect=True) as pub:
            await pub.advertise("[class,eq,'T'],[n,isPresent,0]")
            await eventually(lambda: "DB1@B" in _clients(url_b))
            for start in range(0, count, 500):
                await pub.publish_many(_publications(start, start + 500), guaranteed=True)
                if start == count // 3:
                    node_broker.kill()
                if start == 2 * count // 3:
                    await asyncio.to_thread(node_broker.start)  # the same port, its journal
            await pub.flush(60)
            await eventually(lambda: len(stored()) == count, timeout=60)
        assert stored() == {f"n{i}" for i in range(count)}
    finally:
        db.stop()
        publisher_broker.stop()
        node_broker.stop()
        store.close()


def _clients(url: str) -> list[str]:
    health = url.replace("ws://", "http://").replace("/ws", "/health")
    with urllib.request.urlopen(health) as reply:
        return list(orjson.loads(reply.read())["clients"])
