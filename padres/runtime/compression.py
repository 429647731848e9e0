"""Compressed WebSocket connections: permessage-deflate (RFC 7692), as browsers speak it.

A broker accepts the extension from every client and neighbour that offers it, and compresses
what it sends them at ``Compression.level``; one that does not offer it is served as before,
at no cost. Deflate keeps its dictionary from frame to frame (context takeover), so a stream
of similar notifications shrinks about tenfold even in small frames: a stock quote's
notification of about 290 bytes takes about 31 at level 1 in frames of 20 (docs/benchmarks.md).

Level 1 is the cheapest and gives most of what deflate can; higher levels cost two or three
times the CPU for a sixth fewer bytes. The window is 4 KiB (12 bits) and the memory level 5,
as the ``websockets`` library sets them by default: a compressing connection holds about
32 KiB of zlib state to deflate rather than the 256 KiB of zlib's defaults, and a few KiB to
inflate, for a few bytes more per message.

The limit on a frame's size (``max_size``) applies to the frame once inflated: a small
compressed frame that would inflate beyond it is refused as it is decompressed (close code
1009, "message too big"), never held whole in memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from websockets.extensions.base import ClientExtensionFactory, ServerExtensionFactory
from websockets.extensions.permessage_deflate import (
    ClientPerMessageDeflateFactory,
    ServerPerMessageDeflateFactory,
)

__all__ = ["LEVEL", "client_extensions", "server_extensions"]

LEVEL: Final = 1
"""The zlib level a connection compresses at unless told otherwise: the cheapest."""
WINDOW_BITS: Final = 12
"""Deflate's window, as a power of two, both ways."""
MEMORY_LEVEL: Final = 5
"""zlib's ``memLevel`` of the compressor (1 to 9: more memory, a little faster)."""


def _settings(level: int) -> dict[str, int]:
    if not 1 <= level <= 9:
        raise ValueError(f"compression level {level}: give 1 (fastest) to 9 (smallest)")
    return {"level": level, "memLevel": MEMORY_LEVEL}


def server_extensions(level: int | None) -> Sequence[ServerExtensionFactory]:
    """What a broker's WebSocket server negotiates: permessage-deflate at ``level`` with any
    client that offers it; nothing if ``level`` is None."""
    if level is None:
        return []
    return [
        ServerPerMessageDeflateFactory(
            server_max_window_bits=WINDOW_BITS,
            client_max_window_bits=WINDOW_BITS,
            compress_settings=_settings(level),
        )
    ]


def client_extensions(level: int | None) -> Sequence[ClientExtensionFactory] | None:
    """What a client (or a broker dialling a neighbour) offers: permessage-deflate, compressing
    what it sends at ``level``; None (no ``Sec-WebSocket-Extensions`` header at all: an empty
    one is refused as malformed) if ``level`` is None."""
    if level is None:
        return None
    return [
        ClientPerMessageDeflateFactory(
            server_max_window_bits=WINDOW_BITS,
            client_max_window_bits=WINDOW_BITS,
            compress_settings=_settings(level),
        )
    ]
