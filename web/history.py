"""``/api/v1/history``: a historic subscription through the overlay, its results paged with
opaque tokens or streamed as NDJSON.

The query runs as a client of its own with a subscription whose window lies in the past: the
broker asks the databases whose offers overlap it, and their answers come back to this client
alone (docs/historic.md). A paged query runs once; its rows are kept for ``KEPT`` seconds (at
most ``RESULTS`` queries of at most ``MAX_ROWS`` rows) and read page by page with the token each
page gives for the next. The NDJSON form streams the rows as they arrive, however many.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import orjson
from fastapi import APIRouter, Depends, Query
from fastapi.responses import StreamingResponse

from padres.errors import ConnectionLost, RequestFailed
from padres.model.codec import to_dict
from padres.model.messages import Filter, Subscription
from padres.model.printer import format_filter
from padres.model.protocol import CompositeNotify, Envelope, Notify, ReplayDone
from web.auth import Authenticator, Caller
from web.clients import Clients, connect
from web.inputs import window_filter
from web.pages import token, untoken
from web.problems import Problem

__all__ = ["KEPT", "MAX_ROWS", "RESULTS", "router"]

KEPT: Final = 600.0
RESULTS: Final = 32
MAX_ROWS: Final = 100_000
MAX_PAGE: Final = 10_000


@dataclass
class _Result:
    filter: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    done: dict[str, Any] = field(default_factory=dict)
    took: float = 0.0
    made: float = field(default_factory=time.monotonic)
    owner: str = ""
    """The account that ran the query, when the broker has accounts: only it reads the pages."""


def _window(flt: Filter) -> Filter:
    end = flt.window.end if flt.window else None
    if end is None or end > datetime.now(UTC):
        raise Problem(
            400, "not historic", "the time range must end by now ('to' in the past, or now)"
        )
    return flt


async def run(clients: Clients, flt: Filter, caller: Caller) -> AsyncIterator[Envelope]:
    """The deliveries of a historic subscription for ``flt`` made as ``caller`` (its history
    grants apply), up to its ``replay_done``."""
    qid = clients.new_id("h")
    clients.allowed(caller, Subscription(qid, flt))
    name = f"{caller.name}.web-{qid}" if caller.name else f"web-{qid}"
    client = await connect(clients.node, name, caller)
    try:
        handle = await client.subscribe(flt, id=qid, when_full="wait")
        async for message in handle.events():
            yield message
            if isinstance(message, ReplayDone):
                return
        raise ConnectionLost(client.closed_reason)
    except RequestFailed as exc:
        raise Problem(409, "refused by the broker", exc.text) from None
    except ConnectionLost as exc:
        raise Problem(409, "query ended", f"the historic query ended: {exc}") from None
    except TimeoutError:
        raise Problem(504, "no answer", "the broker did not answer the query in time") from None
    finally:
        await client.close()


def _row(message: Envelope) -> dict[str, Any] | None:
    if isinstance(message, Notify):
        return to_dict(message.publication)
    if isinstance(message, CompositeNotify):
        return {"publications": [to_dict(p) for p in message.publications]}
    return None


def _done(message: ReplayDone, started: float) -> dict[str, Any]:
    return {
        "count": message.count,
        "databases": list(message.databases),
        "failed": list(message.failed),
        "took": round(time.monotonic() - started, 6),
    }


def router(clients: Clients, auth: Authenticator) -> APIRouter:
    api = APIRouter(prefix="/api/v1", tags=["history"])
    calling = Depends(auth.caller)
    results: OrderedDict[str, _Result] = OrderedDict()

    def forget_old() -> None:
        now = time.monotonic()
        for key in [k for k, r in results.items() if now - r.made > KEPT]:
            del results[key]
        while len(results) >= RESULTS:
            results.popitem(last=False)

    async def collect(flt: Filter, caller: Caller) -> _Result:
        result = _Result(format_filter(flt), owner=caller.name)
        started = time.monotonic()
        async for message in run(clients, flt, caller):
            row = _row(message)
            if row is not None:
                if len(result.rows) >= MAX_ROWS:
                    raise Problem(
                        413,
                        "too many rows",
                        f"more than {MAX_ROWS:,} rows: narrow the query or use "
                        "/api/v1/history/stream, which streams any number",
                    )
                result.rows.append(row)
            elif isinstance(message, ReplayDone):
                result.done = _done(message, started)
        result.took = time.monotonic() - started
        return result

    def page(key: str, offset: int, size: int, caller: Caller) -> dict[str, Any]:
        result = results.get(key)
        if result is None or not caller.owns(result.owner):
            raise Problem(410, "expired", f"the results of this token are gone (kept {KEPT:g} s)")
        rows = result.rows[offset : offset + size]
        following = offset + len(rows)
        after = token(key, following) if following < len(result.rows) else None
        return {
            "filter": result.filter,
            "rows": rows,
            "total": len(result.rows),
            "offset": offset,
            "next_page_token": after,
            "took": round(result.took, 6),
            **result.done,
        }

    @api.get("/history")
    async def history(
        filter: str | None = Query(None, description="PADRES text, e.g. [class,eq,'STOCK']"),
        start: str | None = Query(None, alias="from", description="ISO 8601 or now-1h"),
        end: str | None = Query(None, alias="to", description="ISO 8601 or now (default)"),
        page_size: int = Query(100, ge=1, le=MAX_PAGE),
        page_token: str | None = Query(None, description="from the previous page"),
        caller: Caller = calling,
    ) -> dict[str, Any]:
        """Publications stored by the overlay's databases that match ``filter`` in
        ``[from, to)``, a page at a time; the first page runs the query."""
        if page_token is not None:
            key, offset = untoken(page_token)
            return page(key, offset, page_size, caller)
        if filter is None:
            raise Problem(400, "no filter", "give 'filter' (or 'page_token' for a next page)")
        result = await collect(_window(window_filter(filter, start, end)), caller)
        forget_old()
        key = clients.new_id("q")
        results[key] = result
        return page(key, 0, page_size, caller)

    @api.get(
        "/history/stream",
        response_class=StreamingResponse,
        responses={200: {"content": {"application/x-ndjson": {}}}},
    )
    async def stream(
        filter: str = Query(description="PADRES text, e.g. [class,eq,'STOCK']"),
        start: str | None = Query(None, alias="from"),
        end: str | None = Query(None, alias="to"),
        caller: Caller = calling,
    ) -> StreamingResponse:
        """The same as NDJSON: one publication per line as it arrives, then a last line
        ``{"done": {...}}`` with the count, the databases and the time taken."""
        flt = _window(window_filter(filter, start, end))

        async def lines() -> AsyncIterator[bytes]:
            started = time.monotonic()
            try:
                async for message in run(clients, flt, caller):
                    row = _row(message)
                    if row is not None:
                        yield orjson.dumps(row) + b"\n"
                    elif isinstance(message, ReplayDone):
                        yield orjson.dumps({"done": _done(message, started)}) + b"\n"
            except Problem as exc:
                yield orjson.dumps({"error": exc.detail}) + b"\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    return api
