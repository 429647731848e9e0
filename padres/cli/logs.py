"""Logging for the long-running commands (``padres broker``, ``padres db``)."""

from __future__ import annotations

import logging


def setup_logging(quiet: bool) -> None:
    """Log to standard error: information, or with ``quiet`` warnings only."""
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
