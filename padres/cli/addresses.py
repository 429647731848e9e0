"""Where the commands meet unless told otherwise: ``padres broker`` listens on ``DEFAULT_PORT``
of the loopback, and the client commands and the nodes dial ``DEFAULT_BROKER``."""

from __future__ import annotations

from typing import Final

__all__ = ["DEFAULT_BROKER", "DEFAULT_PORT"]

DEFAULT_PORT: Final = 8001
DEFAULT_BROKER: Final = f"ws://127.0.0.1:{DEFAULT_PORT}"
