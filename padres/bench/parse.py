"""Parse speed on the real stock quotes: PADRES text against JSON wire decoding (the baseline),
and the codec on a frame of routed publications as brokers send them to each other."""

from __future__ import annotations

import cProfile
import io
import pstats
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import orjson

from padres.bench import machine, median_seconds
from padres.language.datasets import stockquote_files
from padres.language.parser import parse_publication
from padres.model.codec import decode, encode
from padres.model.messages import Publication
from padres.model.protocol import RoutePublish, decode_frame, encode_frame

FRAME: Final = 512
"""Messages in the frame timed: a batch as a broker sends it down a tree."""


def _frame(pubs: list[Publication]) -> list[RoutePublish]:
    batch = (pubs * (FRAME // max(len(pubs), 1) + 1))[:FRAME]
    return [RoutePublish(p, "B1#a.1", i + 1) for i, p in enumerate(batch)]


def _profile_decode(frame: bytes, top: int = 20) -> str:
    """cProfile of decoding ``frame`` 20 times: its ``top`` entries by own time."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(20):
        decode_frame(frame)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def run(data: Path | None, repeat: int, limit: int | None, profile: bool = False) -> dict[str, Any]:
    files = stockquote_files(data)
    lines = [line for f in files for line in f.read_text(encoding="utf-8").splitlines() if line]
    if limit:
        lines = lines[:limit]
    now = datetime.now(UTC)

    def parse_text() -> None:
        for i, line in enumerate(lines):
            parse_publication(line, id=f"p{i}", timestamp=now)

    frames = [
        encode(parse_publication(line, id=f"p{i}", timestamp=now)) for i, line in enumerate(lines)
    ]

    def decode_json() -> None:
        for frame in frames:
            decode(frame)

    text_s = median_seconds(parse_text, repeat)
    json_s = median_seconds(decode_json, repeat)
    routed = _frame(
        [
            parse_publication(line, id=f"p{i}", timestamp=now, publisher="shop")
            for i, line in enumerate(lines[:FRAME])
        ]
    )
    frame = encode_frame(routed)
    rounds = max(repeat, 5) * 4
    per_message = 1e6 / len(routed)
    result = {
        "benchmark": "parse",
        "lines": len(lines),
        "files": len(files),
        "repeat": repeat,
        "text_lines_per_s": len(lines) / text_s,
        "json_lines_per_s": len(lines) / json_s,
        "text_to_json_ratio": json_s / text_s,
        "frame_messages": len(routed),
        "frame_bytes": len(frame),
        "frame_decode_us": median_seconds(lambda: decode_frame(frame), rounds) * per_message,
        "frame_encode_us": median_seconds(lambda: encode_frame(routed), rounds) * per_message,
        "frame_json_loads_us": median_seconds(lambda: orjson.loads(frame), rounds) * per_message,
        "machine": machine(),
    }
    if profile:
        result["frame_decode_profile"] = _profile_decode(frame)
    return result


def report(result: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"parse: {result['lines']:,} real stock quotes from {result['files']} files, "
            f"median of {result['repeat']} runs",
            f"  PADRES text -> Publication   {result['text_lines_per_s']:>12,.0f} lines/s",
            f"  JSON wire   -> Publication   {result['json_lines_per_s']:>12,.0f} lines/s"
            "  (baseline)",
            f"  text / JSON speed ratio      {result['text_to_json_ratio']:>12.2f}",
            f"codec: a frame of {result['frame_messages']} route_publish messages "
            f"({result['frame_bytes']:,} bytes), per message",
            f"  decode_frame                 {result['frame_decode_us']:>12.2f} us",
            f"  encode_frame                 {result['frame_encode_us']:>12.2f} us",
            f"  orjson.loads alone (floor)   {result['frame_json_loads_us']:>12.2f} us",
            result.get("frame_decode_profile", ""),
        ]
    ).rstrip()
