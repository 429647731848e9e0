"""What a link did not send: the plain publications among the encoded messages its queue was
left with when it ended, summarised for ``Broker.lost``.

A link queue holds messages as they will be written (``padres.runtime.send_queue.encode``).
Only a few fields of each are read here, into a small struct whose other fields msgspec skips
(``_Head``): about a microsecond a message. A full link queue (64 MiB by default) takes 0.26 s
when it holds 233,000 publications of 288 bytes, 0.06 s when it holds 60,000 of 1.1 KB, so
``summarise`` lets the event loop serve the other connections every ``SLICE`` seconds: none
waits more than about 30 ms.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Final

import msgspec

from padres.broker.losses import Tally

__all__ = ["SLICE", "summarise", "take"]

SLICE: Final = 0.02
"""Seconds ``summarise`` reads before it lets the event loop serve others."""
_CHECK: Final = 256
"""Messages read between two looks at the clock."""


class _Publication(msgspec.Struct):
    id: str = ""
    publisher: str = ""


class _Head(msgspec.Struct):
    """What is read of a queued message: its type, and, of a ``route_publish``, its tree,
    journal position and publication's id and publisher (every other field is skipped)."""

    type: str = ""
    tree: str = ""
    position: int = 0
    publication: _Publication | None = None


_DECODER: Final = msgspec.json.Decoder(_Head)


def take(tally: Tally, data: bytes) -> None:
    """Add the encoded message ``data`` to ``tally`` if it is a plain publication on its way
    down a tree (a ``route_publish`` with no journal position)."""
    try:
        head = _DECODER.decode(data)
    except msgspec.DecodeError:  # not one of ours: nothing to report
        return
    pub = head.publication
    if head.type == "route_publish" and not head.position and pub is not None:
        tally.add(head.tree, pub.publisher, pub.id)


async def summarise(messages: deque[bytes], budget: float = SLICE) -> Tally:
    """The plain publications among ``messages`` (emptied as it goes, so their memory goes
    too), in their order; the event loop serves others every ``budget`` seconds."""
    tally = Tally()
    started = time.perf_counter()
    read = 0
    while messages:
        take(tally, messages.popleft())
        read += 1
        if read % _CHECK == 0 and time.perf_counter() - started >= budget:
            await asyncio.sleep(0)
            started = time.perf_counter()
    return tally
