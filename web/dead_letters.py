"""``/api/v1/exceptions/{client}/{subscription}``: the exception queue of a subscription of a
client of this broker: list it, show an entry, replay entries through the subscriber's handler,
purge them."""

from __future__ import annotations

import itertools
from typing import Annotated, Any, Final

from fastapi import APIRouter, Path, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from padres.errors import ConnectionLost, RequestFailed
from padres.model.codec import to_dict
from padres.model.protocol import MAX_ENTRIES_NAMED, ExceptionAction, ExceptionReport, Exceptions
from web.clients import Clients
from web.problems import Problem

__all__ = ["SESSION", "router"]

SESSION: Final = "web-exceptions"
"""The name of the client the API asks the broker through."""
MOST: Final = 2**63 - 1
"""The largest entry id."""

EntryPath = Annotated[int, Path(ge=1, le=MOST, description="an entry's id")]


class ReplayBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    entries: list[Annotated[int, Field(ge=1, le=MOST)]] = Field(
        default_factory=list,
        max_length=MAX_ENTRIES_NAMED,
        description="the entries to replay (all when empty)",
    )


def router(clients: Clients) -> APIRouter:
    api = APIRouter(prefix="/api/v1/exceptions", tags=["exceptions"])
    refs = itertools.count(1)
    queue = "/{client}/{subscription}"

    async def ask(
        client: str,
        subscription: str,
        action: ExceptionAction = ExceptionAction.LIST,
        entries: tuple[int, ...] = (),
        after: int = 0,
        limit: int = 100,
    ) -> ExceptionReport:
        asking = await clients.publisher(SESSION)
        request = Exceptions(
            f"x{next(refs)}", subscription, action, entries, client, after=after, limit=limit
        )
        try:
            return await asking.exception_page(request)
        except RequestFailed as exc:
            status = 404 if exc.text.startswith("no entry") else 409
            raise Problem(status, "refused by the broker", exc.text) from None
        except ConnectionLost as exc:
            raise Problem(409, "session ended", str(exc)) from None
        except TimeoutError:
            raise Problem(504, "no answer", "the broker did not answer in time") from None

    @api.get(queue)
    async def listing(
        client: str,
        subscription: str,
        after: int = Query(0, ge=0, le=MOST, description="list the entries after this one"),
        limit: int = Query(100, ge=1, le=1000),
    ) -> dict[str, Any]:
        """The entries of the queue (``more``: ask again with ``after`` the last id), its
        ``length`` and ``bytes``, and how many of its oldest entries were ``dropped``."""
        report = await ask(client, subscription, after=after, limit=limit)
        body = to_dict(report)
        return {"client": client, **{k: v for k, v in body.items() if k not in _WIRE}}

    @api.get(queue + "/{entry}")
    async def entry(client: str, subscription: str, entry: EntryPath) -> dict[str, Any]:
        """One entry: the publication, the last ``error``, the ``attempts``, when it last
        failed (``at``, Unix seconds) and whether it is being replayed."""
        report = await ask(client, subscription, entries=(entry,))
        found: dict[str, Any] = to_dict(report)["entries"][0]
        return found

    @api.post(queue + "/replay")
    async def replay(client: str, subscription: str, body: ReplayBody) -> dict[str, Any]:
        """Deliver the entries (all by default) again through the subscriber's handler, now
        or when the subscriber is back: handled, an entry goes; failed again, it stays."""
        entries = tuple(body.entries)
        report = await ask(client, subscription, ExceptionAction.REPLAY, entries)
        return {"affected": report.affected}

    @api.delete(queue)
    async def purge(client: str, subscription: str) -> dict[str, Any]:
        """Remove every entry."""
        report = await ask(client, subscription, ExceptionAction.PURGE)
        return {"affected": report.affected}

    @api.delete(queue + "/{entry}", status_code=204)
    async def purge_one(client: str, subscription: str, entry: EntryPath) -> Response:
        report = await ask(client, subscription, ExceptionAction.PURGE, (entry,))
        if not report.affected:
            detail = f"no entry {entry} in the exception queue of {subscription!r} of {client}"
            raise Problem(404, "no such entry", detail)
        return Response(status_code=204)

    return api


_WIRE: Final = {"type", "v", "ref", "affected"}
"""Fields of the broker's report that mean nothing to a listing."""
