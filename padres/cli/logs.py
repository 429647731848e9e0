"""Logging for the long-running commands (``padres broker``, ``padres db``, ``padres archive
serve``): one setup, to standard error, as readable lines or as JSON objects, one a line."""

from __future__ import annotations

import argparse
import logging
from datetime import UTC, datetime
from typing import Final

import orjson

__all__ = ["FORMATS", "add_log_options", "setup_logging"]

FORMATS: Final = ("text", "json")


class _Json(logging.Formatter):
    """A record as one JSON object: its time (UTC, ISO 8601), level, logger and message, and
    the traceback of an exception logged with it."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


def add_log_options(p: argparse.ArgumentParser) -> None:
    """``--quiet`` and ``--log-format``, for a command that logs as it runs."""
    p.add_argument("--quiet", action="store_true", help="log warnings only")
    p.add_argument(
        "--log-format",
        choices=FORMATS,
        default="text",
        help="readable lines (text, the default), or one JSON object a line (json: time, "
        "level, logger, message) for a log collector",
    )


def setup_logging(quiet: bool, fmt: str = "text") -> None:
    """Log to standard error: information, or with ``quiet`` warnings only; ``fmt`` is
    ``text`` (readable lines) or ``json`` (one object a line, for a log collector)."""
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(_Json())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, handlers=[handler])
