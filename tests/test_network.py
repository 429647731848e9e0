"""Real broker processes on loopback, real WebSocket clients: routing, failures, bad input."""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect

from padres.bench.network import settled
from padres.client.connection import Client, ClientState, Delivery
from padres.errors import ConnectError, ConnectionLost, RequestFailed
from padres.language.parser import parse_filter, parse_publication
from padres.matching.matcher import matches
from padres.model.messages import Publication
from padres.model.protocol import MAX_FRAME_BYTES, Notify
from padres.testing.processes import BrokerProcess, free_ports
from tests.support import eventually, health


def _start(
    brokers: dict[str, BrokerProcess], name: str, neighbours: Sequence[str] = (), port: int = 0
) -> str:
    proc = BrokerProcess(name, port=port, neighbours=neighbours, options=["--heartbeat", "1"])
    brokers[name] = proc
    return proc.start()


async def _routes_at(client: Client, count: int) -> None:
    """Wait until the client's broker holds ``count`` subscriptions (routing has settled)."""

    async def ready() -> bool:
        return len(await client.query("subscriptions")) >= count

    await eventually(ready)


def _padres(*args: str) -> list[str]:
    """The command line running ``padres ARGS`` with this interpreter."""
    return [sys.executable, "-m", "padres.cli", *args]


class _Inbox:
    def __init__(self) -> None:
        self.got: list[Delivery] = []

    def __call__(self, delivery: Delivery) -> None:
        self.got.append(delivery)

    def ids(self) -> list[str]:
        return sorted(d.publication.id for d in self.got if isinstance(d, Notify))


_FILTERS = [
    "[class,eq,'STOCK'],[price,>,10]",
    "[class,eq,'STOCK'],[price,<,30]",
    "[class,eq,'STOCK'],[symbol,eq,'AAPL']",
    "[class,eq,'STOCK'],[symbol,str-prefix,'M'],[price,>=,20]",
]


def _quotes() -> list[Publication]:
    out = []
    for i in range(40):
        symbol = ("AAPL", "MSFT", "IBM", "MMM")[i % 4]
        out.append(
            parse_publication(f"[class,'STOCK'],[symbol,'{symbol}'],[price,{i}]", id=f"q{i}")
        )
    return out


async def _scenario(urls: dict[str, str], publisher_at: str, subscribers_at: list[str]) -> None:
    """Subscribers at several brokers; every delivery exactly as the filters say, once."""
    async with contextlib.AsyncExitStack() as stack:
        await _run_scenario(stack, urls, publisher_at, subscribers_at)


async def _run_scenario(
    stack: contextlib.AsyncExitStack,
    urls: dict[str, str],
    publisher_at: str,
    subscribers_at: list[str],
) -> None:
    pub = await stack.enter_async_context(Client(urls[publisher_at], "pub"))
    subs = []
    for i, at in enumerate(subscribers_at):
        client = await stack.enter_async_context(Client(urls[at], f"sub{i}"))
        inbox = _Inbox()
        await client.subscribe(_FILTERS[i % len(_FILTERS)], inbox, id="s")
        subs.append((client, inbox, parse_filter(_FILTERS[i % len(_FILTERS)])))
    await pub.advertise("[class,eq,'STOCK'],[symbol,isPresent,''],[price,isPresent,0]")
    await settled(pub, quiet=0.5, timeout=20)  # the subscriptions have reached its broker
    quotes = _quotes()
    await pub.publish_many(quotes)
    expected = [sorted(q.id for q in quotes if matches(f, q)) for _, _, f in subs]

    async def done() -> bool:
        return all(
            len(inbox.got) >= len(e) for (_, inbox, _), e in zip(subs, expected, strict=True)
        )

    await eventually(done)
    await asyncio.sleep(0.2)  # anything extra would arrive now
    assert [inbox.ids() for _, inbox, _ in subs] == expected


async def test_padres_demo_star_delivers_exactly_what_matches(
    brokers: dict[str, BrokerProcess],
) -> None:
    b = _start(brokers, "B")
    urls = {"B": b, **{n: _start(brokers, n, [b]) for n in "ACDE"}}
    await _scenario(urls, "A", ["C", "D", "E", "B", "A", "E"])


async def test_cyclic_mesh_delivers_each_publication_once(
    brokers: dict[str, BrokerProcess],
) -> None:
    urls: dict[str, str] = {}
    for name in ("M1", "M2", "M3", "M4"):
        urls[name] = _start(brokers, name, list(urls.values()))  # each links to all before it
    await _scenario(urls, "M1", ["M2", "M3", "M4", "M4", "M1"])


async def test_killed_broker_comes_back_and_routing_heals(
    brokers: dict[str, BrokerProcess],
) -> None:
    b = _start(brokers, "B")
    urls = {n: _start(brokers, n, [b]) for n in "ACD"}
    async with contextlib.AsyncExitStack() as stack:
        pub = await stack.enter_async_context(Client(urls["A"], "pub"))
        await pub.advertise("[class,eq,'T'],[n,isPresent,0]")
        inboxes = []
        for at in "CD":
            client = await stack.enter_async_context(Client(urls[at], f"sub{at}"))
            inbox = _Inbox()
            await client.subscribe("[class,eq,'T']", inbox, id="s")
            inboxes.append(inbox)
        await eventually(lambda: health(b)["subscriptions"] == 2)
        await _routes_at(pub, 1)
        await pub.publish("[class,'T'],[n,1]", id="before")
        await eventually(lambda: all(i.ids() == ["before"] for i in inboxes))

        brokers["B"].kill()
        await asyncio.sleep(0.5)
        assert len(await pub.query("subscriptions")) == 0  # withdrawn with the link
        # Started off the event loop: a blocked loop would miss the clients' heartbeats.
        await asyncio.to_thread(brokers["B"].start)  # same port: the neighbours dial it again

        await eventually(lambda: health(b)["neighbours"] == ["A", "C", "D"])
        # C's and D's subscriptions come back once A's advertisement has reached them again
        # through B: a few round trips after the links are back, longer on a busy machine.
        await eventually(lambda: health(b)["subscriptions"] == 2, timeout=30)
        await _routes_at(pub, 1)
        await pub.publish("[class,'T'],[n,2]", id="after")
        await eventually(lambda: all(i.ids() == ["after", "before"] for i in inboxes))


async def test_heartbeats_detect_a_hung_broker_and_its_routes_come_back(
    brokers: dict[str, BrokerProcess],
) -> None:
    b = _start(brokers, "B")
    a = _start(brokers, "A", [b])
    c = _start(brokers, "C", [b])
    async with Client(a, "pub") as pub, Client(c, "sub") as sub:
        inbox = _Inbox()
        await pub.advertise("[class,eq,'T']")
        await sub.subscribe("[class,eq,'T']", inbox, id="s")
        await _routes_at(pub, 1)
        brokers["C"].pause()  # C hangs: its socket stays open, but it answers nothing
        await eventually(lambda: health(b)["neighbours"] == ["A"], timeout=10)
        assert await pub.query("subscriptions") == ()  # withdrawn: C stopped answering
        brokers["C"].resume()  # C notices its link is gone, dials again, resends
        await eventually(lambda: health(b)["neighbours"] == ["A", "C"], timeout=15)
        await _routes_at(pub, 1)
        await pub.publish("[class,'T']", id="back")
        await eventually(lambda: inbox.ids() == ["back"])


async def test_links_are_measured_and_a_frozen_neighbour_is_suspect_before_it_is_given_up(
    brokers: dict[str, BrokerProcess],
) -> None:
    """Each broker pings its neighbours four times a second (``padres.runtime.probe``): the
    links' costs show in ``/health``. A neighbour frozen (SIGSTOP) is suspect within about a
    second, while its link is still up (given up after two heartbeats)."""
    b = BrokerProcess("B", options=["--heartbeat", "5"])
    brokers["B"] = b
    a = BrokerProcess("A", neighbours=[b.start()], options=["--heartbeat", "5"])
    brokers["A"] = a
    a.start()

    def link(url: str, name: str) -> dict[str, Any]:
        links: dict[str, dict[str, Any]] = health(url)["paths"]["links"]
        return links.get(name, {})

    await eventually(lambda: 0 < link(a.url, "B").get("cost_ms", 0) < 500)
    assert link(b.url, "A")["suspect"] is False
    b.pause()
    frozen = time.monotonic()
    try:
        await eventually(lambda: link(a.url, "B").get("suspect") is True, timeout=5)
        suspected = time.monotonic() - frozen
        assert health(a.url)["neighbours"] == ["B"]  # the link is still up
    finally:
        b.resume()
    assert 0.7 < suspected < 3.0, suspected
    await eventually(lambda: link(a.url, "B").get("suspect") is False, timeout=5)


async def test_a_broker_that_cannot_be_reached_is_a_connect_error() -> None:
    (port,) = free_ports(1)
    with pytest.raises(ConnectError, match=f"cannot connect to ws://127.0.0.1:{port}"):
        await Client(f"ws://127.0.0.1:{port}", "nobody").connect()


async def test_reconnecting_clients_survive_a_broker_restart(
    brokers: dict[str, BrokerProcess],
) -> None:
    url = _start(brokers, "B")
    async with (
        Client(url, "pub", reconnect=True) as pub,
        Client(url, "sub", reconnect=True) as sub,
    ):
        await pub.advertise("[class,eq,'T']")
        handle = await sub.subscribe("[class,eq,'T']", id="s")
        await pub.publish("[class,'T']", id="before")
        assert (await handle.get(5)).publication.id == "before"  # type: ignore[union-attr]
        brokers["B"].kill()
        await eventually(lambda: pub.state is ClientState.CONNECTING)
        with pytest.raises(ConnectionLost):
            await pub.publish("[class,'T']", id="lost")  # nobody to send it to
        brokers["B"].start()  # same port
        await eventually(lambda: ClientState.OPEN is pub.state is sub.state, timeout=15)
        await pub.publish("[class,'T']", id="after")  # advertisement made again
        assert (await handle.get(5)).publication.id == "after"  # type: ignore[union-attr]


async def test_bad_frames_get_errors_and_the_broker_keeps_serving(
    brokers: dict[str, BrokerProcess],
) -> None:
    url = _start(brokers, "B")
    async with Client(url, "watcher") as watcher, Client(url, "pub") as pub:
        inbox = _Inbox()
        await watcher.subscribe("[class,eq,'T']", inbox)
        async with connect(url) as raw:
            await raw.send(b"{not json")
            assert "not valid JSON" in orjson.loads(await raw.recv())[0]["text"]
            early = {"v": 1, "type": "subscription", "id": "x", "filter": [["class", "eq", "T"]]}
            await raw.send(orjson.dumps(early))
            reply = orjson.loads(await raw.recv())[0]
            assert reply["type"] == "error" and "hello" in reply["text"]
            await raw.send(orjson.dumps({"v": 1, "type": "hello", "name": "raw", "role": "client"}))
            assert orjson.loads(await raw.recv())[0]["type"] == "welcome"
            bad = {"v": 1, "type": "subscription", "id": "s9", "filter": [["price", ">", "x"]]}
            await raw.send(orjson.dumps([bad]))
            reply = orjson.loads(await raw.recv())[0]
            assert reply["type"] == "error" and reply["ref"] == "s9" and "$.filter" in reply["text"]
            await raw.send(b"[" + b" " * (MAX_FRAME_BYTES + 10) + b"]")
            assert "exceeds the limit" in orjson.loads(await raw.recv())[0]["text"]
        with pytest.raises(RequestFailed, match="already exists"):
            await pub.advertise("[class,eq,'T']", id="a")
            await pub.advertise("[class,eq,'T']", id="a")
        await pub.publish("[class,'T']", id="still-served")
        await eventually(lambda: inbox.ids() == ["still-served"])
        await pub.close()
        await watcher.close()


def test_pub_and_sub_commands(brokers: dict[str, BrokerProcess]) -> None:
    """Two ``padres sub`` side by side (each named apart), one given the broker as
    ``host:port``; a ``padres pub`` of three publications."""
    b = _start(brokers, "B")
    a = _start(brokers, "A", [b])
    subs = [
        subprocess.Popen(
            _padres(
                "sub",
                "--broker",
                address,
                "--json",
                "--count",
                "2",
                "--timeout",
                "20",
                "[class,eq,'T'],[v,>,1]",
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for address in (b, b.removeprefix("ws://").removesuffix("/ws"))
    ]
    for sub in subs:
        assert sub.stderr is not None
        assert b"subscribed" in sub.stderr.readline()
    pub = subprocess.run(
        _padres(
            "pub", "--broker", a, "[class,'T'],[v,1]", "[class,'T'],[v,2]", "[class,'T'],[v,3]"
        ),
        capture_output=True,
        timeout=60,
    )
    assert pub.returncode == 0, pub.stderr
    for sub in subs:
        out, _ = sub.communicate(timeout=30)
        lines = [orjson.loads(line) for line in out.splitlines()]
        assert [line["publication"]["attributes"]["v"] for line in lines] == [2, 3]
        assert all(line["subscriptions"] == ["s1"] for line in lines)


def test_client_shell_speaks_padres_commands(
    brokers: dict[str, BrokerProcess], tmp_path: Path
) -> None:
    url = _start(brokers, "B")
    batch = tmp_path / "more.txt"
    batch.write_text("p [class,'T'],[v,7]\n", encoding="utf-8")
    script = "\n".join(
        [
            "help",
            "a [class,eq,'T'],[v,isPresent,0]",
            "s [class,eq,'T'],[v,>,5]",
            "s [class,eq,'T'],[v,>,8]",
            "p [class,'T'],[v,9]",
            "p [class,'T'],[v,1]",
            f"batch {batch}",
            "s [class,eq,'T'],[v,>,'oops']",
            "printsubs",
            "printadvs",
            "us s1",
            "us s2",
            "us s9",
            "quit",
            "",
        ]
    )
    shell = subprocess.run(
        _padres("client", "--broker", url, "--name", "me"),
        input=script,
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = shell.stdout
    assert shell.returncode == 0, shell.stderr
    assert "connected to B as me@B" in out and "printsubs" in out  # help text
    assert "advertised a1: [class,eq,'T'],[v,isPresent]" in out
    assert "subscribed s1: [class,eq,'T'],[v,>,5]" in out
    assert "s1 <- [class,'T'],[v,7]" in out
    # A publication matching two subscriptions is printed once, naming both.
    assert out.count("[class,'T'],[v,9]") == 1 and "s1,s2 <- [class,'T'],[v,9]" in out
    assert "[v,1]" not in out
    assert "error: line 1, column" in out and "takes a number" in out  # 'oops' is refused
    assert "[class,eq,'T'],[v,>,5] from=" in out  # printsubs: the broker's table
    assert "tree=" in out  # printadvs
    assert "unsubscribed s1" in out and "error: no subscription 's9'" in out


def test_pub_reports_refused_publications(brokers: dict[str, BrokerProcess]) -> None:
    url = _start(brokers, "B")
    pub = subprocess.run(
        _padres(
            "pub",
            "--broker",
            url,
            "--adv",
            "[class,eq,'T'],[v,<,5]",
            "[class,'T'],[v,1]",
            "[class,'T'],[v,9]",
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert pub.returncode == 1
    assert re.search(r"error \((p2\.\w+)\): publication '\1' matches none of the adv", pub.stderr)
    assert "published 1 of 2 publications" in pub.stderr


def test_a_batch_publishing_right_after_advertising_loses_nothing(
    brokers: dict[str, BrokerProcess],
) -> None:
    """PADRES' demo star: a subscriber at A, a batch at D that advertises and publishes at once.
    The advertisement is acknowledged only once the subscription from A is back at D."""
    b = _start(brokers, "B")
    a, _, d, _ = (_start(brokers, name, [b]) for name in "ACDE")
    sub = subprocess.Popen(
        _padres(
            "sub",
            "--broker",
            a,
            "--count",
            "3",
            "--timeout",
            "20",
            "[class,eq,'STOCK'],[symbol,eq,'IBM']",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert sub.stderr is not None
    assert "subscribed" in sub.stderr.readline()
    batch = "\n".join(
        [
            "a [class,eq,'STOCK'],[symbol,isPresent,'x'],[price,isPresent,1]",
            *(
                f"p [class,'STOCK'],[symbol,'{symbol}'],[price,{i}]"
                for i, symbol in enumerate(["IBM", "MSFT", "IBM", "AAPL", "IBM"])
            ),
            "",
        ]
    )
    shell = subprocess.run(
        _padres("client", "--broker", d), input=batch, capture_output=True, text=True, timeout=60
    )
    assert shell.returncode == 0, shell.stderr
    out, _ = sub.communicate(timeout=30)
    assert sub.returncode == 0
    prices = [line.rsplit("[price,", 1)[1].rstrip("]") for line in out.splitlines()]
    assert prices == ["0", "2", "4"]


async def test_each_run_of_padres_pub_publishes_under_ids_of_its_own(
    brokers: dict[str, BrokerProcess],
) -> None:
    """Every run numbers its publications from p1: a token of the run keeps two runs of one
    publisher apart, for the stores and durable subscriptions that tell them apart by id."""
    url = _start(brokers, "B")
    async with Client(url, "watcher") as watcher:
        seen = await watcher.subscribe("[class,eq,'T']")
        for _ in range(2):
            command = _padres("pub", "--broker", url, "--name", "shop", "[class,'T'],[v,1]")
            done = await asyncio.to_thread(subprocess.run, command, capture_output=True, timeout=60)
            assert done.returncode == 0, done.stderr
        ids = [(await seen.get(10)).publication.id for _ in range(2)]  # type: ignore[union-attr]
    assert ids[0] != ids[1] and all(i.startswith("p1.") for i in ids)


async def test_padres_pub_given_several_brokers_uses_the_first_that_answers(
    brokers: dict[str, BrokerProcess],
) -> None:
    url = _start(brokers, "B")
    (dead,) = free_ports(1)
    async with Client(url, "watcher") as watcher:
        seen = await watcher.subscribe("[class,eq,'T']")
        urls = ["--broker", f"ws://127.0.0.1:{dead}", "--broker", url]
        command = _padres("pub", *urls, "--name", "shop", "[class,'T'],[v,1]")
        done = await asyncio.to_thread(subprocess.run, command, capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        got = await seen.get(10)
    assert isinstance(got, Notify) and got.publication.publisher == "shop@B"
    dead_url = f"ws://127.0.0.1:{dead}"
    command = _padres("pub", "--broker", dead_url, "--wait", "1", "[class,'T'],[v,1]")
    started = time.monotonic()
    done = await asyncio.to_thread(subprocess.run, command, capture_output=True, timeout=60)
    assert done.returncode != 0 and f"cannot connect to {dead_url}" in done.stderr.decode()
    assert "(tried for 1 s)" in done.stderr.decode() and time.monotonic() - started < 10


async def test_padres_pub_advertises_each_class_it_publishes(
    brokers: dict[str, BrokerProcess],
) -> None:
    """Publications of two classes with the same attribute names: each class advertised, both
    published, and the command says so (it once refused the second)."""
    url = _start(brokers, "B")
    async with Client(url, "watcher") as watcher:
        seen = await watcher.subscribe("[class,eq,'A1']")
        also = await watcher.subscribe("[class,eq,'B1']")
        command = _padres("pub", "--broker", url, "[class,'A1'],[u,1]", "[class,'B1'],[u,1]")
        done = await asyncio.to_thread(subprocess.run, command, capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "published 2 of 2" in done.stderr.decode()
        for handle, name in ((seen, "A1"), (also, "B1")):
            got = await handle.get(10)
            assert isinstance(got, Notify) and got.publication.class_name == name


async def test_padres_pub_reads_json_lines(
    brokers: dict[str, BrokerProcess], tmp_path: Path
) -> None:
    """A file of JSON lines: attributes (given an id of the run) or wire publications (their
    own id and timestamp); a wrong line names where it is and nothing is sent."""
    url = _start(brokers, "B")
    lines = [
        '{"class": "T", "v": 1, "name": "plain"}',
        "[class,'T'],[v,2]",
        '{"v": 1, "type": "publication", "id": "mine", "timestamp": "2026-01-02T03:04:05Z",'
        ' "attributes": {"class": "T", "v": 3}}',
    ]
    good = tmp_path / "good.jsonl"
    good.write_text("\n".join(lines) + "\n")
    async with Client(url, "watcher") as watcher:
        seen = await watcher.subscribe("[class,eq,'T']")
        command = _padres("pub", "--broker", url, "--name", "shop", "--file", str(good))
        done = await asyncio.to_thread(subprocess.run, command, capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        got = [await seen.get(10) for _ in range(3)]
    pubs = [g.publication for g in got if isinstance(g, Notify)]
    assert [p.attributes["v"] for p in pubs] == [1, 2, 3]
    assert pubs[0].attributes["name"] == "plain" and pubs[0].id.startswith("p1.")
    assert pubs[2].id == "mine" and pubs[2].timestamp.year == 2026
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"class": "T", "v": 1}\n{"v": [1]}\n')
    command = _padres("pub", "--broker", url, "--file", str(bad))
    done = await asyncio.to_thread(subprocess.run, command, capture_output=True, timeout=60)
    assert done.returncode == 1 and f"{bad}:2:" in done.stderr.decode()
