"""``padres bench fuzz``: a broker process under a stream of bad frames, and a client beside it.

A publisher and a subscriber exchange a publication every 10 ms, alone for a few seconds
(``quiet``), then beside the fuzzer. The fuzzer says hello, then sends frames for ``seconds``:
valid messages,
valid frames with bits flipped, truncated, with values of the wrong type, numbers out of range,
deep nesting, invalid UTF-8, ids with control characters, and oversized requests (a
subscription of 10,000 predicates, 5,000 advertisements in one frame, an advertisement of
100,000 predicates, 100,000 attributes, 20,000 messages in a frame). Most of them are
refused: a broker with its default limits slows the fuzzer, then disconnects it (``slowed``);
a broker started for the campaign otherwise lifts that limit, so that every frame reaches it.
Whenever the broker closes the fuzzer's connection saying why, it dials again.

What must hold, and is reported as ``violations`` otherwise: the broker process lives; the
fuzzer's connection stays open (or is closed with a reason); after its last frame, a request
on it is answered, so every frame was taken; no ``error`` reply is longer than
``MAX_ERROR_TEXT`` (a refusal quotes what it refuses cut short) or reports an internal error
(a bug); the subscriber gets every publication once. The subscriber's latency (p50, p99, max)
shows whether the fuzzer held up the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from functools import cache
from typing import Any, Final

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from padres.client.connection import Client, Delivery
from padres.model.protocol import Notify
from padres.runtime.node import REFUSED_TOO_OFTEN
from padres.testing.processes import BrokerProcess

__all__ = ["MAX_ERROR_TEXT", "frames", "report", "run"]

MAX_ERROR_TEXT: Final = 2000
"""Characters an ``error`` reply may hold at most, whatever it refuses."""
_TIME: Final = "2026-11-21T13:44:02Z"
_VICTIM: Final = "victim-pub"
_FIN: Final = "fuzz-fin"
"""The id of the fuzzer's last request: its answer (ok or error) ends the campaign."""

Frame = bytes
Maker = Callable[[random.Random], Frame]


def _valid(rng: random.Random) -> dict[str, Any]:
    """A valid message of the language (or a query), as its JSON object."""
    n = rng.randrange(1000)
    cls = rng.choice(["T", "V", "STOCK", f"C{n}"])
    flt: list[list[Any]] = [
        ["class", "eq", cls],
        [f"x{n % 7}", rng.choice(["<", ">=", "=", "isPresent"]), n],
    ]
    flt[1] = flt[1][:2] if flt[1][1] == "isPresent" else flt[1]
    return rng.choice(
        [
            {"type": "subscription", "id": f"s{n}", "filter": flt},
            {"type": "advertisement", "id": f"a{n}", "filter": flt},
            {"type": "unsubscribe", "subscription_id": f"s{n}"},
            {"type": "unadvertise", "advertisement_id": f"a{n}"},
            {"type": "query", "what": "subscriptions"},
            {
                "type": "publication",
                "id": f"p{n}",
                "timestamp": _TIME,
                "attributes": {"class": cls, f"x{n % 7}": n, "s": "text"},
            },
            {
                "type": "composite_subscription",
                "id": f"c{n}",
                "expression": {"all": [flt, [["class", "eq", "U"], ["k", "eq", {"var": "K"}]]]},
            },
        ]
    )


def _encode(obj: Any) -> Frame:
    return json.dumps(obj).encode()


def _valid_frame(rng: random.Random) -> Frame:
    return _encode([_valid(rng) for _ in range(rng.randint(1, 20))])


def _bit_flips(rng: random.Random) -> Frame:
    data = bytearray(_valid_frame(rng))
    for _ in range(rng.randint(1, 8)):
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    return bytes(data)


def _truncated(rng: random.Random) -> Frame:
    data = _valid_frame(rng)
    return data[: rng.randrange(1, len(data))]


_WRONG: Final[list[Any]] = [
    None,
    True,
    -1,
    1.5,
    "",
    "x",
    [],
    {},
    [[]],
    {"var": 1},
    2**64,
    "0" * 1000,
    ["class"],
    {"all": []},
]


def _wrong_types(rng: random.Random) -> Frame:
    message = _valid(rng)
    key = rng.choice([*message, "v", "type", "extra"])
    message[key] = rng.choice(_WRONG)
    return _encode(message)


def _numbers(rng: random.Random) -> Frame:
    number = rng.choice(["1e999", "-1e999", "1e-999", "-2e-400", str(2**64), str(-(2**80)), "NaN"])
    where = rng.choice(["attribute", "operand"])
    if where == "attribute":
        text = (
            '{"type":"publication","id":"pn","timestamp":"' + _TIME + '",'
            '"attributes":{"class":"T","x":' + number + "}}"
        )
    else:
        text = '{"type":"subscription","id":"sn","filter":[["class","eq","T"],["x","<",' + number
        text += "]]}"
    return text.encode()


def _deep(rng: random.Random) -> Frame:
    depth = rng.choice([40, 1000, 100_000])
    if rng.random() < 0.5:
        return b"[" * depth + b"]" * depth
    levels = min(depth, 5000)  # a composite nested this deep, written out as text
    expression = '{"any":[' * levels + '[["class","eq","T"]]' + ',[["class","eq","U"]]]}' * levels
    text = '{"type":"composite_subscription","id":"deep","expression":' + expression + "}"
    return text.encode()


def _bad_text(rng: random.Random) -> Frame:
    choice = rng.randrange(4)
    if choice == 0:  # not UTF-8
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 200)))
    ident = rng.choice(["a\x00b", "a\u202eb", "a\u200bb", "a/b", "a\\b", "\ud800", "x" * 5000])
    if choice == 1:
        return _encode({"type": "subscription", "id": ident, "filter": [["class", "eq", "T"]]})
    if choice == 2:
        return _encode(
            {
                "type": "publication",
                "id": "pt",
                "timestamp": _TIME,
                "attributes": {"class": "T", "s": ident},
            }
        )
    return _encode({"type": "hello", "name": ident, "role": rng.choice(["client", "x"])})


def _oversized(rng: random.Random) -> Frame:
    frames = _oversized_frames()
    return frames[rng.randrange(len(frames))]


@cache
def _oversized_frames() -> tuple[Frame, ...]:
    """Made once (``run`` makes them first): making them takes long enough to hold up the
    clients beside the fuzzer."""
    return tuple(_make_oversized(choice) for choice in range(6))


def _make_oversized(choice: int) -> Frame:
    if choice == 0:  # a subscription of 10,000 predicates
        flt = [["class", "eq", "T"], *([f"a{i}", "<", i] for i in range(10_000))]
        return _encode({"type": "subscription", "id": "big", "filter": flt})
    if choice == 1:  # 5,000 advertisements of distinct classes in one frame
        return _encode(
            [
                {
                    "type": "advertisement",
                    "id": f"b{i}",
                    "filter": [["class", "eq", f"K{i}"]],
                }
                for i in range(5000)
            ]
        )
    if choice == 2:  # an advertisement of 100,000 predicates
        flt = [["class", "eq", "T"], *([f"a{i}", "isPresent"] for i in range(100_000))]
        return _encode({"type": "advertisement", "id": "huge", "filter": flt})
    if choice == 3:  # a publication of 100,000 attributes
        attributes = {"class": "T", **{f"a{i}": i for i in range(100_000)}}
        return _encode(
            {"type": "publication", "id": "wide", "timestamp": _TIME, "attributes": attributes}
        )
    if choice == 4:  # 20,000 messages in one frame
        return _encode([{"type": "query", "what": "advertisements"}] * 20_000)
    return _encode(  # a string value of two megabytes
        {
            "type": "publication",
            "id": "long",
            "timestamp": _TIME,
            "attributes": {"class": "T", "s": "x" * (2 << 20)},
        }
    )


_MAKERS: Final[dict[str, tuple[float, Maker]]] = {
    "valid": (3, _valid_frame),
    "bit_flips": (5, _bit_flips),
    "truncated": (3, _truncated),
    "wrong_types": (5, _wrong_types),
    "numbers": (2, _numbers),
    "deep": (1, _deep),
    "bad_text": (2, _bad_text),
    "oversized": (0.5, _oversized),
}


def frames(rng: random.Random) -> tuple[str, Frame]:
    """One fuzz frame, and what kind it is."""
    kinds = list(_MAKERS)
    kind = rng.choices(kinds, weights=[_MAKERS[k][0] for k in kinds])[0]
    return kind, _MAKERS[kind][1](rng)


class _Fuzzer:
    """The fuzzing client, over one connection after another: what it sent and what came
    back."""

    def __init__(self) -> None:
        self.sent: Counter[str] = Counter()
        self.errors = 0
        self.longest_error = 0
        self.internal: list[str] = []
        """Errors that are a broker's bug, not the fuzzer's fault."""
        self.answered = asyncio.Event()
        self.closed = ""
        """How the broker closed the last connection (its code and reason), if it did."""
        self.reason = ""
        self.closes: Counter[str] = Counter()
        """Connections the broker closed, with a reason (then dialled again), by reason."""

    async def read(self, ws: ClientConnection) -> None:
        self.closed = self.reason = ""
        with contextlib.suppress(ConnectionClosed):
            async for data in ws:
                for message in _messages(data):
                    if message.get("type") == "error":
                        text = str(message.get("text", ""))
                        self.errors += 1
                        self.longest_error = max(self.longest_error, len(text))
                        if text.startswith("internal error"):
                            self.internal.append(text[:200])
                    if message.get("ref") == _FIN:
                        self.answered.set()
        self.reason = ws.close_reason or ""
        self.closed = f"{ws.close_code} {self.reason}".strip()
        if self.reason:
            self.closes[self.closed.split(":")[0][:60]] += 1


def _messages(data: bytes | str) -> list[dict[str, Any]]:
    items = orjson.loads(data)
    return [m for m in (items if isinstance(items, list) else [items]) if isinstance(m, dict)]


class _Watch:
    """The subscriber: latencies of the publications it gets, once each."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.duplicates = 0
        self.latencies: list[float] = []

    def __call__(self, delivery: Delivery) -> None:
        if not isinstance(delivery, Notify):
            return
        pid = delivery.publication.id
        if not delivery.publication.publisher.startswith(f"{_VICTIM}@"):
            return  # the fuzzer's, of the same class
        if pid in self.seen:
            self.duplicates += 1
            return
        self.seen.add(pid)
        sent = delivery.publication.attributes.get("sent")
        if isinstance(sent, float):
            self.latencies.append(time.time() - sent)


async def _campaign(url: str, seconds: float, seed: int, quiet: float) -> dict[str, Any]:
    _oversized_frames()
    rng = random.Random(seed)
    watch = _Watch()
    fuzzer = _Fuzzer()
    published = 0
    async with (
        Client(url, _VICTIM, timeout=30) as pub,
        Client(url, "victim-sub", timeout=30) as sub,
    ):
        await pub.advertise("[class,eq,'V'],[seq,isPresent],[sent,isPresent]")
        await sub.subscribe("[class,eq,'V']", watch)
        stop = time.monotonic() + quiet + seconds

        async def publish() -> None:
            nonlocal published
            while time.monotonic() < stop:
                attributes = {"class": "V", "seq": published, "sent": time.time()}
                await pub.publish(attributes, id=f"v{published}")
                published += 1
                await asyncio.sleep(0.01)

        publisher = asyncio.get_running_loop().create_task(publish())
        await asyncio.sleep(quiet)  # the client beside it, before any fuzzing
        calm, watch.latencies = watch.latencies, []
        started = time.monotonic()
        answered = False
        while time.monotonic() < stop:
            async with connect(url, max_size=None, compression=None) as ws:
                await ws.send(orjson.dumps({"type": "hello", "name": "fuzzer"}))
                reader = asyncio.get_running_loop().create_task(fuzzer.read(ws))
                with contextlib.suppress(ConnectionClosed):
                    while time.monotonic() < stop and not reader.done():
                        kind, frame = frames(rng)
                        fuzzer.sent[kind] += 1
                        await ws.send(frame)
                        await asyncio.sleep(0)
                if time.monotonic() >= stop:
                    answered = await _fin(ws, fuzzer)
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
            if not fuzzer.reason:
                break  # closed without a reason: a violation
        sent_for = time.monotonic() - started
        await publisher
        deadline = time.monotonic() + 30
        while len(watch.seen) < published and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    latencies = sorted(watch.latencies) or [0.0]
    calm = sorted(calm) or [0.0]
    return {
        "seed": seed,
        "seconds": round(sent_for, 1),
        "frames": sum(fuzzer.sent.values()),
        "frames_by_kind": dict(sorted(fuzzer.sent.items())),
        "errors": fuzzer.errors,
        "longest_error": fuzzer.longest_error,
        "internal_errors": fuzzer.internal[:10],
        "fuzzer_closed": "" if answered else fuzzer.closed,
        "fuzzer_close_reason": "" if answered else fuzzer.reason,
        "fuzzer_answered": answered,
        "fuzzer_disconnects": sum(
            n for closed, n in fuzzer.closes.items() if closed.endswith(REFUSED_TOO_OFTEN)
        ),
        "fuzzer_closes": dict(fuzzer.closes),
        "published": published,
        "delivered": len(watch.seen),
        "duplicates": watch.duplicates,
        "quiet_p99_ms": _ms(_p99(calm)),
        "latency_p50_ms": _ms(statistics.median(latencies)),
        "latency_p99_ms": _ms(_p99(latencies)),
        "latency_max_ms": _ms(latencies[-1]),
    }


def _p99(ordered: list[float]) -> float:
    return ordered[int(0.99 * (len(ordered) - 1))]


def _ms(seconds: float) -> float:
    return round(1000 * seconds, 2)


async def _fin(ws: ClientConnection, fuzzer: _Fuzzer) -> bool:
    """Whether the fuzzer's connection still answers after everything it sent: the broker
    answers a request only once it has taken every frame before it."""
    if fuzzer.closed:
        return False
    with contextlib.suppress(ConnectionClosed, TimeoutError):
        fin = {"type": "subscription", "id": _FIN, "filter": [["class", "eq", "FIN"]]}
        await ws.send(orjson.dumps(fin))
        await asyncio.wait_for(fuzzer.answered.wait(), 60)
        return True
    return False


def run(
    seconds: float = 60.0,
    seed: int = 1,
    url: str | None = None,
    *,
    quiet: float = 2.0,
    slowed: bool = False,
) -> dict[str, Any]:
    """The campaign against the broker at ``url``, or a broker process started for it (whose
    log is searched for tracebacks), after ``quiet`` seconds of the client beside it alone;
    returns its figures and ``violations``, what did not hold. A broker started here lifts
    its limit on refused messages, so that every frame reaches it, unless ``slowed``: then
    the fuzzer is slowed and disconnected as any client would be, and dials again."""
    if url is not None:
        result = asyncio.run(_campaign(url, seconds, seed, quiet))
        result |= {"broker_alive": True, "broker_tracebacks": 0}
    else:
        options = ["--heartbeat", "1"] + ([] if slowed else ["--max-refusals", "1e9"])
        with tempfile.TemporaryFile() as log:
            proc = BrokerProcess("F1", options=options, log=log)
            try:
                result = asyncio.run(_campaign(proc.start(), seconds, seed, quiet))
                result["broker_alive"] = proc.alive
            finally:
                proc.stop()
            log.seek(0)
            result["broker_tracebacks"] = log.read().count(b"Traceback")
    result["violations"] = _violations(result)
    return result


def _violations(r: dict[str, Any]) -> list[str]:
    out = []
    if not r["broker_alive"]:
        out.append("the broker process died")
    if r["broker_tracebacks"]:
        out.append(f"the broker logged {r['broker_tracebacks']} tracebacks")
    if r["fuzzer_closed"] and not r["fuzzer_close_reason"]:
        out.append(f"the fuzzer's connection was closed without a reason ({r['fuzzer_closed']})")
    if not r["fuzzer_answered"] and not r["fuzzer_closed"]:
        out.append("the fuzzer's connection stopped answering")
    if r["internal_errors"]:
        out.append(f"internal errors: {r['internal_errors']}")
    if r["longest_error"] > MAX_ERROR_TEXT:
        out.append(f"an error reply of {r['longest_error']:,} characters")
    if r["delivered"] != r["published"] or r["duplicates"]:
        out.append(
            f"the subscriber got {r['delivered']} of {r['published']} publications "
            f"({r['duplicates']} twice)"
        )
    return out


def report(r: dict[str, Any]) -> str:
    kinds = ", ".join(f"{k} {n}" for k, n in r["frames_by_kind"].items())
    lines = [
        f"fuzz campaign (seed {r['seed']}): {r['frames']:,} frames in {r['seconds']} s ({kinds})",
        f"  fuzzer: {r['errors']:,} errors back, the longest {r['longest_error']:,} characters; "
        f"connection {'closed: ' + r['fuzzer_closed'] if r['fuzzer_closed'] else 'open'}, "
        f"{'answering' if r['fuzzer_answered'] else 'NOT answering'} at the end",
        f"  disconnected {r['fuzzer_disconnects']} times for too many refused requests; "
        f"closed by the broker (then dialled again): {r['fuzzer_closes'] or 'never'}",
        f"  beside it: {r['delivered']} of {r['published']} publications delivered, latency p50 "
        f"{r['latency_p50_ms']:.1f} ms, p99 {r['latency_p99_ms']:.1f} ms "
        f"(alone before: {r['quiet_p99_ms']:.1f} ms), max {r['latency_max_ms']:.1f} ms",
        f"  broker {'alive' if r['broker_alive'] else 'DEAD'}, "
        f"{r['broker_tracebacks']} tracebacks in its log; violations: "
        + ("; ".join(r["violations"]) or "none"),
    ]
    return "\n".join(lines)
