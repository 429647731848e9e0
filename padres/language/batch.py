"""PADRES batch files: one command per line.

``a`` advertise, ``p`` publish, ``s`` subscribe, ``cs`` composite subscribe, ``us ID``
unsubscribe, ``ua ID`` unadvertise. Blank lines and lines starting with ``#`` are skipped. A line
with no command is read as a bare message (see ``parse_message``). Messages get ids in order of
appearance per kind: ``p1, p2, ...``, ``s1, s2, ...`` (composite subscriptions included) and
``a1, a2, ...``, so ``us s2`` names the second subscription of the file.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from datetime import datetime
from itertools import count
from typing import Final

from padres.errors import InvalidMessage, ParseError
from padres.language.parser import (
    message_kind,
    parse_advertisement,
    parse_composite,
    parse_publication,
    parse_subscription,
)
from padres.model.messages import Message, Unadvertise, Unsubscribe

__all__ = ["BatchReader", "parse_batch"]

_COMMAND: Final = re.compile(r"\s*(cs|us|ua|a|p|s)(?:\s+|$)")


class BatchReader:
    """Parses batch lines, numbering messages across every file it reads."""

    def __init__(self, *, timestamp: datetime | None = None) -> None:
        self.timestamp = timestamp
        self._next = {"p": count(1), "s": count(1), "a": count(1)}

    def _id(self, kind: str) -> str:
        return f"{kind}{next(self._next[kind])}"

    def read(self, lines: Iterable[str], origin: str = "") -> Iterator[tuple[int, Message]]:
        """``(line number, message)`` for each message of ``lines``; a bad line raises."""
        for lineno, line in enumerate(lines, 1):
            message = self.parse_line(line, lineno, origin)
            if message is not None:
                yield lineno, message

    def parse_line(self, line: str, lineno: int = 1, origin: str = "") -> Message | None:
        """The message on ``line`` (None for a blank or comment line); errors carry ``lineno``."""
        body = line.rstrip("\r\n")
        if not body.strip() or body.lstrip().startswith("#"):
            return None
        m = _COMMAND.match(body)
        command = m.group(1) if m else ""
        offset = m.end() if m else 0
        try:
            return self._parse(command, body[offset:])
        except ParseError as exc:
            raise exc.at_line(lineno, offset=offset, source=body, origin=origin) from None
        except InvalidMessage as exc:
            raise ParseError(
                str(exc), source=body, column=offset + 1, line=lineno, origin=origin
            ) from None

    def _parse(self, command: str, text: str) -> Message:
        match command:
            case "p":
                return parse_publication(text, id=self._id("p"), timestamp=self.timestamp)
            case "s":
                return parse_subscription(text, id=self._id("s"))
            case "cs":
                return parse_composite(text, id=self._id("s"))
            case "a":
                return parse_advertisement(text, id=self._id("a"))
            case "us":
                return Unsubscribe(text.strip())
            case "ua":
                return Unadvertise(text.strip())
            case _:  # no command: a bare message
                return self._parse(message_kind(text), text)


def parse_batch(
    lines: Iterable[str], *, origin: str = "", timestamp: datetime | None = None
) -> Iterator[Message]:
    """Parse a batch file lazily; the first bad line raises ``ParseError``."""
    for _, message in BatchReader(timestamp=timestamp).read(lines, origin):
        yield message
