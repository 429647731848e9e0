"""Reading the command line's input files: paths, directories of ``*.txt`` and ``-`` for stdin."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from padres.errors import CommandError

__all__ = ["expand", "positive", "read_lines"]


def expand(paths: Sequence[str]) -> list[str]:
    """Each path as given, a directory replaced by its ``*.txt`` files in name order."""
    out: list[str] = []
    for raw in paths:
        path = Path(raw)
        if raw != "-" and path.is_dir():
            files = sorted(str(p) for p in path.glob("*.txt"))
            if not files:
                raise CommandError(f"{raw}: directory holds no .txt files")
            out.extend(files)
        else:
            out.append(raw)
    return out


def read_lines(path: str) -> Iterator[str]:
    """The lines of a UTF-8 text file (``-`` for standard input), with clear errors."""
    try:
        if path == "-":
            yield from _checked(_stdin(), "<stdin>")
            return
        with open(path, encoding="utf-8") as handle:
            yield from _checked(handle, path)
    except FileNotFoundError:
        raise CommandError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise CommandError(f"{path}: is a directory") from None
    except PermissionError:
        raise CommandError(f"{path}: permission denied") from None


def _stdin() -> Iterable[str]:
    """The lines of standard input as strict UTF-8, whatever the locale: invalid bytes are an
    error, not characters standing for them (as Python's C and POSIX locales make them)."""
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:  # replaced by a text stream (in tests): its text is text already
        return sys.stdin
    return (line.decode("utf-8") for line in buffer)


def _checked(lines: Iterable[str], name: str) -> Iterator[str]:
    lineno = 0
    try:
        for lineno, line in enumerate(lines, 1):  # noqa: B007 - lineno is read in the handler
            yield line
    except UnicodeDecodeError as exc:
        raise CommandError(
            f"{name}: not UTF-8 text near line {lineno + 1} ({exc.reason})"
        ) from None


def positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    """An argparse ``type``: a number of ``kind`` above zero, or a clear error."""

    def convert(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, not {text}")
        return value

    return convert
