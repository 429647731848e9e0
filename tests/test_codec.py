"""The one codec: every message type declared once, validated wherever it travels."""

from __future__ import annotations

import re
import typing
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import orjson
import pytest

from padres.bench import parse
from padres.errors import DecodeError
from padres.language.datasets import SAMPLE
from padres.language.parser import parse_composite, parse_publication
from padres.model.codec import decode, encode, from_dict, to_dict
from padres.model.messages import Publication
from padres.model.protocol import (
    Envelope,
    Notify,
    Rejected,
    decode_frame,
    encode_frame,
)
from padres.runtime.simulation import Simulation

DOCS = Path(__file__).parent.parent / "docs" / "protocol.md"
_PUB = {
    "v": 1,
    "type": "publication",
    "id": "p1",
    "publisher": "c1",
    "timestamp": "2026-01-01T00:00:00Z",
    "attributes": {"class": "A", "x": 1},
}


def _tags() -> list[str]:
    return [t.__struct_config__.tag for t in typing.get_args(Envelope)]


def test_every_message_type_has_its_own_tag_and_is_documented() -> None:
    tags = _tags()
    assert len(tags) == len(set(tags)) >= 30
    text = DOCS.read_text(encoding="utf-8")
    missing = [t for t in tags if f"`{t}`" not in text and f'"type": "{t}"' not in text]
    assert not missing, "message types missing from docs/protocol.md"


def _examples() -> list[str]:
    """The complete JSON messages in the code blocks of docs/protocol.md."""
    text = DOCS.read_text(encoding="utf-8")
    found: list[str] = []
    for block in re.findall(r"```json\n(.*?)```", text, flags=re.DOTALL):
        pending = ""
        for line in block.splitlines():
            pending += line
            try:
                orjson.loads(pending)
            except orjson.JSONDecodeError:
                continue
            found.append(pending)
            pending = ""
    return found


def test_the_examples_of_the_protocol_document_decode() -> None:
    examples = _examples()
    assert len(examples) >= 12
    for example in examples:
        (message,) = decode_frame(example)
        assert not isinstance(message, Rejected), (example, message)
        assert encode_frame([message]) == orjson.dumps([to_dict(message)])


def _reject(message: dict[str, object]) -> DecodeError:
    ok = {"v": 1, "type": "ok", "ref": "a"}
    first, bad, last = decode_frame(orjson.dumps([ok, message, ok]))
    assert not isinstance(first, Rejected) and not isinstance(last, Rejected)
    assert isinstance(bad, Rejected)
    return bad.error


@pytest.mark.parametrize(
    ("message", "path", "reason"),
    [
        (
            {"type": "notify", "publication": _PUB, "subscriptions": ["s1"], "seq": -1},
            "$.seq",
            ">= 0",
        ),
        ({"type": "ack", "subscription": "d", "seq": "3"}, "$.seq", "must be int, not str"),
        (
            {"type": "notify", "publication": _PUB | {"id": "p 1"}, "subscriptions": []},
            "$.publication",
            "invalid publication id",
        ),
        (
            {"type": "route_publish", "tree": "t", "publication": _PUB | {"timestamp": 5}},
            "$.publication.timestamp",
            "must be datetime, not int",
        ),
        (
            {
                "type": "route_publish",
                "tree": "t",
                "publication": _PUB | {"timestamp": "0001-01-01T00:00:00+01:00"},
            },
            "$.publication",
            "out of range",
        ),
        (
            {
                "type": "route_subscribe",
                "trees": ["t"],
                "subscription": {
                    "type": "subscription",
                    "id": "s1",
                    "filter": [["class", "eq", "A"], ["x", "~", 1]],
                },
            },
            "$.subscription.filter[1][1]",
            "unknown operator '~'",
        ),
        (
            {"type": "composite_notify", "subscription": "c", "publications": [_PUB, {}]},
            "$.publications[1]",
            "missing field 'id'",
        ),
        (
            {
                "type": "composite_notify",
                "subscription": "c",
                "publications": [],
                "bindings": {"X": [1]},
            },
            "$.bindings[...]",
            "must be",
        ),
        (
            {
                "type": "recovered",
                "request": "r",
                "tree": "t",
                "publications": [_PUB],
                "positions": [],
                "head": 1,
            },
            "$",
            "1 publications need as many positions, not 0",
        ),
        ({"type": "hello", "name": "has space"}, "$", "invalid client or broker name"),
        ({"type": "query", "what": "everything"}, "$", "query what must be"),
        ({"type": "ok", "ref": "a", "v": 2}, "$.v", "unsupported version 2"),
        ({"type": "gossip"}, "$.type", "unknown message type 'gossip'"),
        (
            {"type": "notify", "subscriptions": [], "publication": _PUB | {"type": "ok"}},
            "$.publication.type",
            "a message of type 'ok' does not belong here",
        ),
    ],
)
def test_every_envelope_validates_what_it_carries(
    message: dict[str, object], path: str, reason: str
) -> None:
    error = _reject({"v": 1} | message)
    assert error.path == path, error
    assert reason in error.reason


def test_the_simulation_carries_only_what_survives_the_wire() -> None:
    sim = Simulation(seed=1)
    sim.add_broker("B1")
    client = sim.attach("c1", "B1")
    pub = parse_publication("[class,'A']", id="p1", timestamp=datetime(2026, 1, 1, tzinfo=UTC))
    with pytest.raises(DecodeError, match=r"\$\.seq"):
        sim.send(client, Notify(pub, ("s1",), seq=-1))
    sim.run()
    assert sim.clients["c1"].acks == [] and sim.clients["c1"].errors == []


def test_older_spellings_are_read() -> None:
    """Offsets other than Z, fields in another order, and a filter written as an object."""
    plus = orjson.dumps({"attributes": {"class": "A"}, "v": 1, "type": "publication", "id": "p"})
    pub = decode(plus[:-1] + b',"timestamp":"2026-01-01T01:00:00+01:00"}')
    assert isinstance(pub, Publication)
    assert pub.timestamp == datetime(2026, 1, 1, 1, tzinfo=timezone(timedelta(hours=1)))
    assert pub.timestamp == datetime(2026, 1, 1, tzinfo=UTC)
    old = {
        "v": 1,
        "type": "composite_subscription",
        "id": "c1",
        "expression": {
            "all": [{"filter": [["class", "eq", "A"]]}, {"filter": [["class", "eq", "B"]]}]
        },
    }
    assert from_dict(old) == parse_composite("{[class,eq,'A']} & {[class,eq,'B']}", id="c1")


def test_the_encoding_follows_the_declaration() -> None:
    pub = parse_publication(
        "[class,'A'],[x,1.5]", id="p1", timestamp=datetime(2026, 1, 1, tzinfo=UTC)
    )
    assert encode(pub) == (
        b'{"type":"publication","id":"p1","attributes":{"class":"A","x":1.5},'
        b'"timestamp":"2026-01-01T00:00:00Z","publisher":"","v":1}'
    )
    assert orjson.loads(encode(pub)) == to_dict(pub)


def test_a_publication_cannot_be_changed() -> None:
    pub = decode(orjson.dumps(_PUB))
    assert isinstance(pub, Publication)
    with pytest.raises(TypeError, match="cannot be changed"):
        pub.attributes["x"] = 2  # type: ignore[index]
    with pytest.raises(AttributeError):
        pub.id = "p2"  # type: ignore[misc]


def test_bench_parse_times_the_codec_on_a_routed_frame() -> None:
    result = parse.run(SAMPLE, repeat=1, limit=100, profile=True)
    assert result["frame_messages"] == 512
    assert result["frame_json_loads_us"] > 0 and result["frame_encode_us"] > 0
    assert result["frame_decode_us"] > result["frame_json_loads_us"]  # it parses, and more
    assert "decode_frame" in result["frame_decode_profile"]
