"""``padres parse``: check PADRES lines or batch files, print them normalized or as JSON."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime

from padres.cli.inputs import expand, read_lines
from padres.errors import ParseError
from padres.language.batch import BatchReader
from padres.model.codec import encode
from padres.model.printer import format_batch_line


def arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Check every line; print each message as a normalized batch line (or JSON with "
        "--json); report every bad line with its position and exit 1 if there was one."
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="files or directories; - for stdin")
    p.add_argument("--json", action="store_true", help="print the JSON wire form, one per line")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    reader = BatchReader(timestamp=datetime.now(UTC))
    errors = 0
    out = sys.stdout
    for path in expand(args.files):
        for lineno, line in enumerate(read_lines(path), 1):
            try:
                message = reader.parse_line(line, lineno, "<stdin>" if path == "-" else path)
            except ParseError as exc:
                errors += 1
                print(exc, file=sys.stderr)
                continue
            if message is not None:
                out.write(
                    (encode(message).decode() if args.json else format_batch_line(message)) + "\n"
                )
    if errors:
        print(f"{errors} invalid line{'s' if errors > 1 else ''}", file=sys.stderr)
        return 1
    return 0
