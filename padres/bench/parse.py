"""Parse speed on the real stock quotes: PADRES text against JSON wire decoding (the baseline)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from padres.bench import machine, median_seconds
from padres.datasets import stockquote_files
from padres.parser import parse_publication
from padres.wire import decode, encode


def run(data: Path | None, repeat: int, limit: int | None) -> dict[str, Any]:
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
    return {
        "benchmark": "parse",
        "lines": len(lines),
        "files": len(files),
        "repeat": repeat,
        "text_lines_per_s": len(lines) / text_s,
        "json_lines_per_s": len(lines) / json_s,
        "text_to_json_ratio": json_s / text_s,
        "machine": machine(),
    }


def report(result: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"parse: {result['lines']:,} real stock quotes from {result['files']} files, "
            f"median of {result['repeat']} runs",
            f"  PADRES text -> Publication   {result['text_lines_per_s']:>12,.0f} lines/s",
            f"  JSON wire   -> Publication   {result['json_lines_per_s']:>12,.0f} lines/s"
            "  (baseline)",
            f"  text / JSON speed ratio      {result['text_to_json_ratio']:>12.2f}",
        ]
    )
