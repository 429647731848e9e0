"""Reading the archive's inputs: which files, in what format, and each line as a publication.

Three formats:

- ``text``: PADRES publications, one a line (``[class,'STOCK'],[symbol,'AAPL'],...``). The
  publication time is the line's ``[time,'...']``, or an attribute named by ``time_attribute``
  read with ``time_format`` (``strptime``; ``date`` and ``%d-%b-%y`` for the stock quotes'
  ``28-Dec-04``, UTC); the attribute stays. A line's id is its file's name and line number.
- ``json``: publications in the wire format (``padres parse --json``), one a line; id,
  publisher and timestamp are their own.
- a database node's store: what ``spark.export`` writes, which is ``json``.

Inputs are read in *pieces* of about ``PIECE_BYTES``, each a run of whole lines (``pieces``,
on the driver, which counts the lines before each piece so that ids stay the file's name and
line number), so no task holds more than a piece of a large file. ``cut`` does so and, in the
same pass, fingerprints the file (``InputFile``: size, modification time, SHA-256), which the
catalog keeps so that a later load of the same input is recognised before it is parsed.
``parse_piece`` runs on Spark's executors; it yields a ``Parsed`` or a ``Bad`` record per line,
never raises, so one job finds every bad line and the driver reports the first ones.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import Final, NamedTuple

from padres.errors import PadresError
from padres.language.parser import parse_publication
from padres.model.codec import decode
from padres.model.messages import Publication
from rete.operators import Value
from spark.errors import InputError

__all__ = [
    "PIECE_BYTES",
    "Bad",
    "Format",
    "InputFile",
    "Parsed",
    "Period",
    "Piece",
    "Reading",
    "cut",
    "expand",
    "parse_line",
    "parse_piece",
    "pieces",
]

PIECE_BYTES: Final = 16 << 20
"""About how many bytes of an input one task reads and parses at a time."""

_NO_TIME: Final = datetime.min.replace(tzinfo=UTC)
_BAD_ID: Final = re.compile(r"[^A-Za-z0-9_.:/\-]")


class Format(StrEnum):
    TEXT = "text"
    JSON = "json"


class Period(StrEnum):
    """How finely files divide time: one directory per year, month or day."""

    YEAR = "year"
    MONTH = "month"
    DAY = "day"

    def of(self, at: datetime) -> str:
        if self is Period.YEAR:
            return f"{at.year:04d}"
        if self is Period.MONTH:
            return f"{at.year:04d}-{at.month:02d}"
        return f"{at.year:04d}-{at.month:02d}-{at.day:02d}"


@dataclass(frozen=True, slots=True)
class Reading:
    """How to read the lines of the inputs."""

    format: Format = Format.TEXT
    time_attribute: str | None = None
    time_format: str | None = None
    publisher: str = ""
    period: Period = Period.MONTH


class Parsed(NamedTuple):
    """One publication as the load writes it: its header, and its attributes but the class."""

    class_name: str
    period: str
    time: datetime
    id: str
    publisher: str
    values: tuple[tuple[str, Value], ...]


class Bad(NamedTuple):
    """A line that is not a publication, and why."""

    where: str
    error: str


def expand(inputs: Sequence[str], reading: Reading) -> list[Path]:
    """The files the inputs name (a directory stands for its ``*.txt`` or ``*.jsonl``
    files), or ``InputError`` naming the first that is missing or unreadable."""
    if not inputs:
        raise InputError("no input given")
    suffix = "*.txt" if reading.format is Format.TEXT else "*.jsonl"
    found: list[Path] = []
    for name in inputs:
        path = Path(name)
        if path.is_dir():
            inside = sorted(p for p in path.glob(suffix) if p.is_file())
            if not inside:
                raise InputError(f"input directory {name} holds no {suffix} file")
            found.extend(inside)
        elif path.is_file():
            found.append(path)
        else:
            raise InputError(f"input {name} does not exist")
    for path in found:
        try:
            with path.open("rb") as f:
                f.read(1)
        except OSError as exc:
            raise InputError(f"cannot read input {path}: {exc.strerror or exc}") from exc
    return found


@lru_cache(maxsize=1 << 16)
def _time(given: str, time_format: str | None) -> datetime:
    """A time attribute's value read as a UTC time (cached: dates repeat)."""
    if time_format is None:
        at = datetime.fromisoformat(given)
    else:
        at = datetime.strptime(given, time_format)
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def _publication(reading: Reading, name: str, number: int, line: str) -> Publication:
    if reading.format is Format.JSON:
        message = decode(line)
        if not isinstance(message, Publication):
            raise InputError(f"a {type(message).__name__} where a publication belongs")
        return message
    ident = f"{_BAD_ID.sub('_', name)}-{number}"
    return parse_publication(line, id=ident, timestamp=_NO_TIME, publisher=reading.publisher)


def _timestamp(reading: Reading, pub: Publication) -> datetime:
    if reading.time_attribute is None:
        if pub.timestamp == _NO_TIME:
            raise InputError(
                "no publication time: give the line a [time,'...'] or name an attribute"
            )
        return pub.timestamp.astimezone(UTC)
    given = pub.attributes.get(reading.time_attribute)
    if type(given) is not str:
        raise InputError(f"no string attribute {reading.time_attribute!r} to take the time from")
    try:
        return _time(given, reading.time_format)
    except ValueError as exc:
        raise InputError(f"time {given!r} of {reading.time_attribute!r}: {exc}") from None


def parse_line(reading: Reading, name: str, line: str, index: int) -> Parsed | Bad | None:
    """The ``index``-th line (from 0) of input ``name``, parsed (None for a blank line or a
    ``#`` comment)."""
    if not line.strip() or line.lstrip().startswith("#"):
        return None
    try:
        pub = _publication(reading, name, index + 1, line)
        at = (
            pub.timestamp.astimezone(UTC)
            if reading.format is Format.JSON
            else _timestamp(reading, pub)
        )
    except PadresError as exc:
        return Bad(f"{name} line {index + 1}", str(exc).splitlines()[0])
    values = tuple(item for item in pub.attributes.items() if item[0] != "class")
    return Parsed(pub.class_name, reading.period.of(at), at, pub.id, pub.publisher, values)


class Piece(NamedTuple):
    """Bytes ``start`` to ``end`` of input ``path``: whole lines, the first of them the file's
    line ``first`` (from 0)."""

    path: str
    start: int
    end: int
    first: int


def pieces(
    path: Path, size: int = PIECE_BYTES, seen: Callable[[bytes], None] | None = None
) -> Iterator[Piece]:
    """``path`` cut into pieces of about ``size`` bytes, each ending at the end of a line;
    ``seen`` is given every byte read, in order."""
    start = line = 0
    with path.open("rb") as f:
        while True:
            data = f.read(size)
            if not data:
                return
            data += f.readline()  # to the end of the line the read stopped in
            if seen is not None:
                seen(data)
            yield Piece(str(path), start, start + len(data), line)
            line += data.count(b"\n")
            start += len(data)


@dataclass(frozen=True, slots=True)
class InputFile:
    """An input file as a load read it: its absolute path, size, modification time and the
    SHA-256 of its content (what recognises it again, wherever it lies)."""

    path: str
    size: int
    modified: datetime
    sha256: str


def cut(
    path: Path, size: int = PIECE_BYTES, read: Callable[[int], None] = lambda _: None
) -> tuple[list[Piece], InputFile]:
    """``path``'s pieces (``pieces``) and its fingerprint, in one pass over the file; ``read``
    is told how many bytes each step read."""
    digest = hashlib.sha256()

    def seen(data: bytes) -> None:
        digest.update(data)
        read(len(data))

    try:
        status = path.stat()
        found = list(pieces(path, size, seen))
    except OSError as exc:
        raise InputError(f"cannot read input {path}: {exc.strerror or exc}") from exc
    modified = datetime.fromtimestamp(status.st_mtime, UTC)
    return found, InputFile(str(path.resolve()), status.st_size, modified, digest.hexdigest())


def parse_piece(reading: Reading, piece: Piece) -> Iterator[Parsed | Bad]:
    """Every line of ``piece``, parsed (a line that is not UTF-8 is a bad one)."""
    name = Path(piece.path).name
    with open(piece.path, "rb") as f:
        f.seek(piece.start)
        data = f.read(piece.end - piece.start)
    for index, raw in enumerate(data.split(b"\n"), start=piece.first):
        try:
            line = raw.decode()
        except UnicodeDecodeError as exc:
            yield Bad(f"{name} line {index + 1}", f"not UTF-8: {exc.reason} at byte {exc.start}")
            continue
        parsed = parse_line(reading, name, line.removesuffix("\r"), index)
        if parsed is not None:
            yield parsed
