"""What the language refuses, and the limits on sizes and counts: in the message types, the
parser, the codec, a broker's core and its runtime."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from datetime import UTC, datetime

import httpx
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from padres.broker import Broker, BrokerConfig
from padres.broker.quotas import Quotas
from padres.broker.sqlite_journal import SqliteJournal
from padres.client.connection import Client
from padres.errors import DecodeError, InvalidMessage, PadresError, ParseError, RequestFailed
from padres.language.batch import BatchReader
from padres.language.parser import (
    parse_composite,
    parse_message,
    parse_publication,
    parse_subscription,
)
from padres.matching.matcher import matches
from padres.model.codec import decode
from padres.model.messages import (
    MAX_ATTRIBUTES,
    MAX_COUNT,
    MAX_DEPTH,
    MAX_PARTS,
    MAX_PREDICATES,
    MAX_STRING_BYTES,
    Advertisement,
    AllOf,
    Filter,
    Predicate,
    Publication,
    Subscription,
    Unsubscribe,
    check_id,
)
from padres.model.protocol import (
    Durable,
    Error,
    Guaranteed,
    Hello,
    Notify,
    Ok,
    Rejected,
    Role,
    Welcome,
    decode_frame,
    encode_frame,
)
from padres.runtime import node as node_module
from padres.runtime.node import BrokerNode
from padres.testing.processes import BrokerProcess
from rete.operators import Op, Value
from tests.support import eventually

NOW = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
CLASS = Predicate("class", Op.EQ, "T")


def _pub(**attributes: Value) -> Publication:
    return Publication("p1", {"class": "T", **attributes}, NOW)


def _json_pub(value: str) -> str:
    return (
        '{"type":"publication","id":"p","timestamp":"2026-11-21T10:00:00Z",'
        '"attributes":{"class":"T","x":' + value + "}}"
    )


# -- sizes and counts ----------------------------------------------------------------------------


def test_a_filter_holds_at_most_max_predicates() -> None:
    preds = (CLASS, *(Predicate(f"a{i}", Op.LT, i) for i in range(MAX_PREDICATES - 1)))
    Filter(preds)
    with pytest.raises(InvalidMessage, match=f"257 predicates; the limit is {MAX_PREDICATES}"):
        Filter((*preds, Predicate("z", Op.IS_PRESENT)))
    text = "[class,eq,T]," + ",".join(f"[a{i},<,{i}]" for i in range(10_000))
    with pytest.raises(ParseError, match="10,001 predicates") as caught:
        parse_subscription(text, id="s1")
    assert len(str(caught.value)) < 500  # the excerpt is a window of the line, not all of it


def test_a_publication_holds_at_most_max_attributes_and_strings_of_max_bytes() -> None:
    with pytest.raises(InvalidMessage, match=f"the limit is {MAX_ATTRIBUTES:,}"):
        _pub(**{f"a{i}": i for i in range(MAX_ATTRIBUTES)})
    _pub(s="x" * MAX_STRING_BYTES)
    with pytest.raises(InvalidMessage, match="1,048,578 bytes long; the limit is 1,048,576"):
        _pub(s="é" * (MAX_STRING_BYTES // 2 + 1))
    with pytest.raises(InvalidMessage, match="limit is 1,048,576 bytes"):
        Predicate("s", Op.STR_PREFIX, "x" * (MAX_STRING_BYTES + 1))


def test_composites_are_bounded_in_depth_and_parts() -> None:
    flt = Filter((CLASS,))
    expression = AllOf((flt, flt))
    for _ in range(MAX_DEPTH - 1):
        expression = AllOf((expression, flt))
    with pytest.raises(InvalidMessage, match=f"nested deeper than {MAX_DEPTH} groups"):
        AllOf((expression, flt))
    deep = "(" * 1000 + "{[class,eq,T]}&{[class,eq,U]}" + ")" * 1000
    with pytest.raises(ParseError, match=f"nested deeper than {MAX_DEPTH} groups"):
        parse_composite(deep, id="c1")
    wide = " & ".join(["{[class,eq,T]}"] * (MAX_PARTS + 1))
    with pytest.raises(ParseError, match=f"65 filters; the limit is {MAX_PARTS}"):
        parse_composite(wide, id="c1")
    for levels in (33, 100):
        nested = '{"any":[' * levels + '[["class","eq","T"]]' + ',[["class","eq","U"]]]}' * levels
        frame = '{"type":"composite_subscription","id":"c","expression":' + nested + "}"
        (refused,) = decode_frame(frame)
        assert "nested deeper than 32" in str(refused.error)  # type: ignore[union-attr]
        assert refused.ref == "c"  # type: ignore[union-attr]
    with pytest.raises(DecodeError, match="nested too deep"):
        decode_frame("[" * 100_000 + "]" * 100_000)


def test_refusals_quote_what_they_refuse_cut_short() -> None:
    with pytest.raises(InvalidMessage) as caught:
        check_id("x" * 100_000, "subscription id")
    assert len(str(caught.value)) < 300 and "100,002 characters" in str(caught.value)
    frame = orjson.dumps({"type": "y" * 100_000})
    (refused,) = decode_frame(frame)
    assert len(str(refused.error)) < 1500  # type: ignore[union-attr]
    sub = {"type": "subscription", "id": "s" * 100_000, "filter": [["class", "eq", "T"]]}
    (refused,) = decode_frame(orjson.dumps(sub))
    assert refused.ref == "" and len(str(refused.error)) < 300  # type: ignore[union-attr]


# -- values ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "number", ["1e-99999", "-2.5e-400", "0." + "0" * 400 + "1", "1e99999", "-1e400"]
)
def test_numbers_out_of_float_range_are_refused_not_rounded(number: str) -> None:
    with pytest.raises(ParseError, match="out of the range of a 64-bit float"):
        parse_publication(f"[class,T],[x,{number}]", id="p")
    with pytest.raises(ParseError, match="out of the range of a 64-bit float"):
        parse_subscription(f"[class,eq,T],[x,<,{number}]", id="s")
    with pytest.raises(DecodeError):
        decode(_json_pub(number))


def test_zero_and_the_extremes_still_read_exactly() -> None:
    assert parse_publication("[class,T],[x,0.0e-99999]", id="p").attributes["x"] == 0.0
    assert parse_publication("[class,T],[x,5e-324]", id="p").attributes["x"] == 5e-324
    assert decode(_json_pub("-0.0e-500")).attributes["x"] == 0.0  # type: ignore[union-attr]
    assert decode(_json_pub("4.9e-324")).attributes["x"] == 5e-324  # type: ignore[union-attr]
    top = 2**63 - 1
    assert parse_publication(f"[class,T],[x,{top}]", id="p").attributes["x"] == top
    assert type(decode(_json_pub(str(top))).attributes["x"]) is int  # type: ignore[union-attr]
    for beyond in (2**63, -(2**63) - 1, 10**30):
        with pytest.raises(ParseError, match="does not fit in 64 bits"):
            parse_publication(f"[class,T],[x,{beyond}]", id="p")
        with pytest.raises(DecodeError, match="does not fit in 64 bits"):
            decode(_json_pub(str(beyond)))
    # a string that reads like a tiny number is a string
    assert decode(_json_pub('"1e-400"')).attributes["x"] == "1e-400"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "ident",
    ["a\x00b", "a\u202eb", "a\u200bb", "a\u2060b", "a\x1bb", "a\x7fb", "a/b", "a\\b", "\ud800"],
)
def test_ids_with_control_format_or_path_characters_are_refused(ident: str) -> None:
    with pytest.raises(InvalidMessage, match="visible characters"):
        check_id(ident, "subscription id")
    with pytest.raises(InvalidMessage):
        Hello(ident)


def test_ids_may_be_any_visible_text() -> None:
    for ident in ("s1", "B1#0.3", "c1@B1", "zürich-1", "株価", "a:b", "x" * 256):
        assert check_id(ident, "id") == ident


@pytest.mark.parametrize("text", ["a\x00b", "\ud800", "a\udcffb"])
def test_strings_hold_no_nul_and_no_lone_surrogate(text: str) -> None:
    with pytest.raises(InvalidMessage, match=r"NUL|not valid Unicode"):
        _pub(s=text)
    for op in (Op.STR_PREFIX, Op.STR_POSTFIX, Op.EQ, Op.STR_CONTAINS):
        with pytest.raises(InvalidMessage, match=r"NUL|not valid Unicode"):
            Predicate("s", op, text)


def test_prefix_and_suffix_match_alike_live_and_in_the_store() -> None:
    """The historic store's SQL for str-prefix and str-postfix and the live matcher agree on
    the strings the language lets through (LIKE's wildcards included)."""
    from historic.store import Store

    texts = ["a%b", "a_b", "ab", "a\\b", "%", "_", "a\tb", "é%", "a\nb"]
    store = Store("sqlite://")
    try:
        store.write(
            [Publication(f"p{i}", {"class": "T", "s": s}, NOW) for i, s in enumerate(texts)]
        )
        for op in (Op.STR_PREFIX, Op.STR_POSTFIX, Op.STR_CONTAINS):
            for operand in ("a%", "%", "_", "a_", "\\", "b", "%b", "\t"):
                flt = Filter((CLASS, Predicate("s", op, operand)))
                live = {s for s in texts if matches(flt, _pub(s=s))}
                stored = {str(p.attributes["s"]) for p in store.query(flt)}
                assert stored == live, (op, operand)
    finally:
        store.close()


_NASTY = st.text(
    alphabet=st.sampled_from([*list("[]{}(),'$&|<>=-.e+\\ 0123456789TxS"), "\x00", "\u202e"]),
    max_size=80,
)


@given(st.one_of(_NASTY, st.text(max_size=80)))
def test_the_parser_raises_only_parse_errors(text: str) -> None:
    for parse in (parse_message, parse_composite, parse_subscription, parse_publication):
        with contextlib.suppress(ParseError):
            parse(text, id="x1")
    for command in ("p ", "s ", "a ", "cs ", "us ", ""):
        with contextlib.suppress(ParseError):
            BatchReader(timestamp=NOW).parse_line(command + text, 1, "fuzz.txt")


@given(st.one_of(st.binary(max_size=200), _NASTY.map(str.encode), st.text(max_size=80)))
def test_the_codec_raises_only_decode_errors(data: bytes | str) -> None:
    with contextlib.suppress(DecodeError):
        decode_frame(data)


def test_padres_parse_refuses_bytes_that_are_not_utf8_without_a_traceback() -> None:
    for options in ([], ["--json"]):
        done = subprocess.run(
            [sys.executable, "-m", "padres.cli", "parse", *options, "-"],
            input=b"[class,'A'],[x,1]\n[class,'A\xff'],[x,1]\n",
            capture_output=True,
            timeout=30,
        )
        assert done.returncode == 1
        assert b"not UTF-8 text near line 2" in done.stderr
        assert b"Traceback" not in done.stderr


# -- quotas and costs in a broker ----------------------------------------------------------------


def test_quotas_refuse_beyond_the_limit_and_keep_what_is_held() -> None:
    broker = Broker("B1", BrokerConfig(quotas=Quotas(subscriptions=2, advertisements=1)))
    broker.handle(Hello("c"), "h1")
    for i in range(2):
        assert broker.handle(Subscription(f"s{i}", Filter((CLASS,))), "h1") == [("h1", Ok(f"s{i}"))]
    ((_, refused),) = broker.handle(Subscription("s2", Filter((CLASS,))), "h1")
    assert isinstance(refused, Error) and refused.ref == "s2"
    assert "too many subscriptions" in refused.text and "limit per client is 2" in refused.text
    assert broker.handle(Advertisement("a0", Filter((CLASS,))), "h1")[0] == ("h1", Ok("a0"))
    ((_, refused),) = broker.handle(Advertisement("a1", Filter((CLASS,))), "h1")
    assert isinstance(refused, Error) and "too many advertisements" in refused.text
    assert len(broker.routes) == 2  # what was held before is still there
    with pytest.raises(ValueError, match="at least 1"):
        Quotas(subscriptions=0)


def test_durable_subscriptions_count_while_their_client_is_away() -> None:
    """A client cannot pile up durable subscriptions by reconnecting: they stay at the broker,
    and count against its quota until they are ended; one taken up again is not refused."""
    broker = Broker("B1", BrokerConfig(quotas=Quotas(subscriptions=2)))
    for hop in ("h1", "h2"):
        broker.handle(Hello("c"), hop)
        sub = Subscription(f"d{hop}", Filter((CLASS,)))
        assert broker.handle(Durable(sub), hop)[-1] == (hop, Ok(f"d{hop}"))
        broker.close(hop)
    broker.handle(Hello("c"), "h3")
    ((_, refused),) = broker.handle(Subscription("s", Filter((CLASS,))), "h3")
    assert isinstance(refused, Error) and "this client holds 2" in refused.text
    again = broker.handle(Durable(Subscription("dh1", Filter((CLASS,)))), "h3")
    assert again[-1] == ("h3", Ok("dh1"))  # its own, taken up again
    broker.handle(Unsubscribe("dh1"), "h3")
    assert broker.handle(Subscription("s", Filter((CLASS,))), "h3")[-1] == ("h3", Ok("s"))


@pytest.mark.parametrize("acked", [2**63 - 1, 2**53 + 1, 2**64])
def test_counts_on_the_wire_are_bounded_so_a_journal_never_overflows(acked: int) -> None:
    """A ``durable`` whose ``acked`` is past ``MAX_COUNT`` is refused, naming the field; one at
    the bound is taken, and the broker's journal commits it and what follows."""
    frame = encode_frame([Durable(Subscription("d", Filter((CLASS,))), acked=5)])
    (refused,) = decode_frame(frame.replace(b'"acked":5', b'"acked":%d' % acked))
    assert isinstance(refused, Rejected) and "acked" in str(refused.error)
    broker = Broker("B1", journal=SqliteJournal())
    broker.handle(Hello("c"), "h1")
    taken = broker.handle(Durable(Subscription("d", Filter((CLASS,))), acked=MAX_COUNT), "h1")
    assert taken[-1] == ("h1", Ok("d"))
    broker.journal.commit()
    broker.handle(Advertisement("a", Filter((CLASS,))), "h1")
    broker.handle(Guaranteed(_pub(n=1)), "h1")
    broker.journal.commit()


def test_a_client_name_leaves_room_for_its_broker_in_the_publisher_id() -> None:
    """A client's publications carry ``name@broker`` as their publisher, which must be an id
    every receiver accepts."""
    broker = Broker("B1")
    [(_, refused)] = broker.handle(Hello("a" * 254), "h1")
    assert isinstance(refused, Error) and "at most 253 characters here" in refused.text
    [(_, welcome)] = broker.handle(Hello("a" * 253), "h2")
    assert isinstance(welcome, Welcome) and len(welcome.session) == 256
    broker.handle(parse_subscription("[class,eq,'T']", id="s"), "h2")
    broker.handle(Advertisement("a", Filter((Predicate("class", Op.EQ, "T"),))), "h2")
    out = broker.handle(parse_publication("[class,'T']", id="p"), "h2")
    [delivered] = decode_frame(encode_frame([m for _, m in out]))  # checked as a client would
    assert isinstance(delivered, Notify) and delivered.publication.publisher == welcome.session


def test_the_largest_requests_cost_little() -> None:
    """Insertion is linear: the largest filter allowed, against the largest advertisement."""
    broker = Broker("B1")
    broker.handle(Hello("p"), "h1")
    broker.handle(Hello("s"), "h2")
    wide = (CLASS, *(Predicate(f"a{i}", Op.IS_PRESENT) for i in range(MAX_PREDICATES - 1)))
    broker.handle(Advertisement("a1", Filter(wide)), "h1")
    started = time.perf_counter()
    for j in range(20):
        narrow = (CLASS, *(Predicate(f"a{i}", Op.LT, i + j) for i in range(MAX_PREDICATES - 1)))
        assert broker.handle(Subscription(f"s{j}", Filter(narrow)), "h2")[0] == ("h2", Ok(f"s{j}"))
    for i in range(2000):
        broker.handle(Advertisement(f"c{i}", Filter((Predicate("class", Op.EQ, f"C{i}"),))), "h1")
    assert time.perf_counter() - started < 5.0


# -- the runtime ---------------------------------------------------------------------------------


async def test_a_broker_refuses_oversized_requests_and_keeps_the_connection(
    brokers: dict[str, BrokerProcess],
) -> None:
    proc = BrokerProcess(
        "B1",
        options=["--heartbeat", "1", "--max-frame-messages", "100", "--max-subscriptions", "3"],
    )
    brokers["B1"] = proc
    url = proc.start()

    async with connect(url, max_size=None) as raw:
        await raw.send(orjson.dumps({"type": "hello", "name": "raw"}))
        assert orjson.loads(await raw.recv())[0]["type"] == "welcome"
        await raw.send(orjson.dumps([{"type": "query", "what": "subscriptions"}] * 101))
        text = orjson.loads(await raw.recv())[0]["text"]
        assert "101 messages; the limit is 100" in text
        await raw.send(orjson.dumps([{"type": "query", "what": "subscriptions"}] * 30))
        replies: list[dict[str, str]] = []
        while len(replies) < 30:  # in one frame or several
            replies += orjson.loads(await raw.recv())
        refused = [m for m in replies if m["type"] == "error"]
        assert refused and "queries a second" in refused[0]["text"]
        assert refused[0]["ref"] == "?subscriptions"
        await raw.send(orjson.dumps({"type": "hello", "name": "x\u202e"}))
        assert "visible characters" in orjson.loads(await raw.recv())[0]["text"]
    async with Client(url, "c") as client:
        for i in range(3):
            await client.subscribe("[class,eq,'T']", id=f"s{i}")
        with pytest.raises(RequestFailed, match="limit per client is 3"):
            await client.subscribe("[class,eq,'T']", id="s3")
        await client.unsubscribe("s0")
        await client.subscribe("[class,eq,'T']", id="s3")
    assert proc.alive


def test_errors_are_padres_errors() -> None:
    assert issubclass(DecodeError, PadresError) and issubclass(ParseError, PadresError)


def test_the_web_api_reads_numbers_exactly(brokers: dict[str, BrokerProcess]) -> None:
    """A JSON body's numbers are read as the codec reads them: an integer beyond 64 bits is
    refused, never rounded to a float; a number too small for a float is refused, never 0."""
    proc = BrokerProcess("B1")
    brokers["B1"] = proc
    base = proc.start().replace("ws://", "http://").removesuffix("/ws")
    for number, why in [
        ("99999999999999999999", "does not fit in 64 bits"),
        ("1e-400", "too small for a 64-bit float"),
    ]:
        body = '{"class": "T", "x": ' + number + "}"
        response = httpx.post(
            f"{base}/api/v1/publications",
            content=body,
            headers={"content-type": "application/json"},
            timeout=10,
        )
        assert response.status_code == 400, response.text
        assert why in response.text


async def test_a_long_frame_is_handled_in_slices_with_others_served_between(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A frame of 3,000 advertisements, handed to a node as one frame, in slices of a
    millisecond: the event loop runs other tasks between them, and every advertisement is
    taken, in order."""
    monkeypatch.setattr(node_module, "SLICE", 0.001)
    node = BrokerNode(Broker("B1"))
    replies: list[bytes] = []

    async def send(data: bytes) -> None:
        replies.append(data)

    hop = node.attach(send, lambda reason: None)
    node.submit(hop, [Hello("c")])
    frame = orjson.dumps(
        [
            {"type": "advertisement", "id": f"a{i}", "filter": [["class", "eq", f"C{i}"]]}
            for i in range(3000)
        ]
    )
    ticks = 0

    async def other() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    beside = asyncio.get_running_loop().create_task(other())
    await asyncio.sleep(0)
    started = ticks
    await node.receive(hop, frame)
    slices = ticks - started
    beside.cancel()
    assert len(node.broker.trees) == 3000
    assert slices >= 10  # served between the slices
    await asyncio.sleep(0.1)  # the outbox writes what the core answered
    oks = [m["ref"] for data in replies for m in orjson.loads(data) if m["type"] == "ok"]
    assert oks == [f"a{i}" for i in range(3000)]


async def test_a_connection_that_says_it_is_a_broker_has_its_publications_checked(
    brokers: dict[str, BrokerProcess],
) -> None:
    """Only the neighbours a broker dials itself are spared the checks of the language."""
    url = brokers.setdefault("B1", BrokerProcess("B1")).start()
    bad = {
        "type": "route_publish",
        "tree": "t1",
        "publication": {
            "type": "publication",
            "id": "p1",
            "attributes": {"class": "T", "time": 1},
            "timestamp": "2026-11-21T13:44:02Z",
        },
    }

    async with connect(url) as raw:
        await raw.send(orjson.dumps({"type": "hello", "name": "B9", "role": "broker"}))
        assert orjson.loads(await raw.recv())[0]["type"] == "hello"  # a link now
        await raw.send(orjson.dumps([bad]))
        while True:  # past what the broker sends a new neighbour
            replies = orjson.loads(await raw.recv())
            errors = [m["text"] for m in replies if m["type"] == "error"]
            if errors:
                break
        assert "'time' is the publication's timestamp" in errors[0]
    assert brokers["B1"].alive


def test_a_neighbour_a_broker_dialled_cannot_greet_as_a_client() -> None:
    """A broker trusts what comes from a neighbour it dialled (``checked_before``): that
    connection may not become a client's, whose publications would then go unchecked."""
    broker = Broker("B1")
    broker.open_link("n1")
    [(hop, refused)] = broker.handle(Hello("evil", Role.CLIENT), "n1")
    assert hop == "n1" and isinstance(refused, Error) and "greet as a broker" in refused.text
    assert not broker.sessions


async def test_a_connection_says_hello_once_and_soon_or_is_closed() -> None:
    """A frame with two hellos is refused whole (each would cost a password check); a
    connection with no hello accepted ``hello_within`` seconds after it came is closed."""
    node = BrokerNode(Broker("B1"), heartbeat=1, limits=node_module.Limits(hello_within=1.0))
    port: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    serving = asyncio.ensure_future(node.serve(ready=port.set_result))
    url = f"ws://127.0.0.1:{await port}/ws"
    try:
        async with connect(url) as silent, connect(url) as greeted:
            await silent.send(orjson.dumps([{"type": "hello", "name": f"c{i}"} for i in range(2)]))
            assert "it holds 2 hellos" in orjson.loads(await silent.recv())[0]["text"]
            await greeted.send(orjson.dumps({"type": "hello", "name": "c"}))
            assert orjson.loads(await greeted.recv())[0]["type"] == "welcome"
            started = time.monotonic()
            last = orjson.loads(await asyncio.wait_for(silent.recv(), 5))[0]
            assert "no hello accepted within 1 s" in last["text"]
            await asyncio.wait_for(silent.wait_closed(), 5)
            assert silent.close_code == 1008 and time.monotonic() - started < 3.5
            await greeted.send(orjson.dumps({"type": "query", "what": "subscriptions"}))
            assert orjson.loads(await greeted.recv())[0]["type"] != "error"  # still served
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving


async def test_connections_that_have_not_said_who_they_are_are_bounded_and_timed() -> None:
    """Per address: the fourth WebSocket that has not said hello is refused at once, and a
    greeted one no longer counts; an HTTP connection dribbling its headers (slowloris) is
    closed ``hello_within`` seconds after it began, and counts meanwhile."""
    limits = node_module.Limits(hello_within=1.0, strangers_per_address=3)
    node = BrokerNode(Broker("B1"), heartbeat=1, limits=limits)
    port: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    serving = asyncio.ensure_future(node.serve(ready=port.set_result))
    url = f"ws://127.0.0.1:{await port}/ws"
    try:
        async with connect(url) as first, connect(url), connect(url):
            with pytest.raises(InvalidStatus):  # a fourth stranger: refused before accepting
                async with connect(url):
                    pass
            await first.send(orjson.dumps({"type": "hello", "name": "c"}))
            assert orjson.loads(await first.recv())[0]["type"] == "welcome"
            async with connect(url):  # room again: the greeted one left the strangers
                assert len(node.strangers) == 3
        await asyncio.sleep(0.1)
        reader, writer = await asyncio.open_connection("127.0.0.1", await port)
        started = time.monotonic()
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        await writer.drain()
        assert len(node.strangers) == 1
        for _ in range(30):  # a header line now and then, never the end of them
            await asyncio.sleep(0.1)
            if reader.at_eof():
                break
            with contextlib.suppress(ConnectionError):
                writer.write(b"X-Slow: 1\r\n")
                await writer.drain()
        assert await asyncio.wait_for(reader.read(), 3) == b""  # closed, nothing answered
        assert time.monotonic() - started < 2.0
        assert len(node.strangers) == 0
        writer.close()
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving


async def test_a_client_whose_requests_are_refused_is_slowed_then_disconnected() -> None:
    """A client sending only refused requests (unsubscribing what it never subscribed) gets
    its burst answered at once, then its frames are read at the refusal rate, and once it
    has been slowed for ``refusals_slowed`` seconds it is disconnected with an error saying
    why; a bystander publishing and subscribing meanwhile loses nothing. Dialling again from
    the same address brings no new burst."""
    limits = node_module.Limits(refusals_per_second=50, refusals_burst=100, refusals_slowed=2.0)
    node = BrokerNode(Broker("B1"), heartbeat=1, limits=limits)
    port: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    serving = asyncio.ensure_future(node.serve(ready=port.set_result))
    url = f"ws://127.0.0.1:{await port}/ws"
    got: list[int] = []
    try:
        async with Client(url, "bystander") as bystander, connect(url) as abuser:
            await bystander.advertise("[class,eq,'T'],[n,isPresent,0]")
            await bystander.subscribe("[class,eq,'T']", lambda d: got.append(0))
            await abuser.send(orjson.dumps({"type": "hello", "name": "abuser"}))
            assert orjson.loads(await abuser.recv())[0]["type"] == "welcome"
            frame = orjson.dumps(
                [{"type": "unsubscribe", "subscription_id": f"s{i}"} for i in range(50)]
            )
            answered: list[float] = []
            started = time.monotonic()

            async def abuse() -> None:
                with contextlib.suppress(ConnectionClosed):
                    while True:
                        await abuser.send(frame)
                        for message in orjson.loads(await abuser.recv()):
                            answered.append(time.monotonic() - started)
                            last = message["text"]
                            if "disconnected" in last:
                                return

            abusing = asyncio.ensure_future(abuse())
            for n in range(40):
                await bystander.publish({"class": "T", "n": n})
                await asyncio.sleep(0.05)
            await asyncio.wait_for(abusing, 10)
            await asyncio.wait_for(abuser.wait_closed(), 5)
            assert abuser.close_code == 1008
            # the burst at once; then about 50 a second, for about 2 s
            assert sum(t < 0.5 for t in answered) <= 200
            assert 150 <= len(answered) <= 400
            await eventually(lambda: len(got) == 40)
            await bystander.publish({"class": "T", "n": 40})
            await eventually(lambda: len(got) == 41)
        async with connect(url) as again:  # from the same address: no new burst
            await again.send(orjson.dumps({"type": "hello", "name": "abuser"}))
            assert orjson.loads(await again.recv())[0]["type"] == "welcome"
            await again.send(frame)
            await again.send(frame)
            await again.recv()
            first = time.monotonic()
            await again.recv()
            assert time.monotonic() - first > 0.5  # the second frame waited for the first
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
