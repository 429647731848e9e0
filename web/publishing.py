"""``/api/v1/publications`` and ``/api/v1/advertisements``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Request

from padres.errors import DecodeError
from padres.model.codec import loads
from padres.model.printer import format_filter
from web.auth import Authenticator, Caller
from web.bodies import AdvertisementBody
from web.clients import Clients
from web.inputs import advertisement_from, publications_from_json, publications_from_text
from web.problems import Problem

__all__ = ["router"]


_ITEM = {
    "oneOf": [
        {"type": "string", "description": "PADRES text"},
        {"type": "object", "description": "attributes", "additionalProperties": True},
    ]
}
_PUBLISH_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {"oneOf": [_ITEM, {"type": "array", "items": _ITEM}]},
                "example": ["[class,'STOCK'],[price,50]", {"class": "STOCK", "price": 5}],
            },
            "text/plain": {
                "schema": {"type": "string"},
                "example": "[class,'STOCK'],[price,50]\n[class,'STOCK'],[price,5]\n",
            },
        },
    }
}


def router(clients: Clients, auth: Authenticator) -> APIRouter:
    api = APIRouter(prefix="/api/v1", tags=["publish"])
    calling = Depends(auth.caller)

    @api.post("/publications", status_code=201, openapi_extra=_PUBLISH_BODY)
    async def publish(
        request: Request,
        caller: Caller = calling,
        client: str | None = Query(
            None, description="the publisher (default: web, or the user with accounts)"
        ),
        guaranteed: bool = Query(False, description="return once they are on the broker's disk"),
    ) -> dict[str, Any]:
        """Publish one publication or a batch: a JSON item or array of items (PADRES text or
        an object of attributes), or PADRES text, one publication per line. Nothing is
        published unless all are valid and advertised."""
        body = await request.body()  # bounded by ``Admission``
        kind = request.headers.get("content-type", "").split(";")[0].strip()
        if kind == "text/plain":
            pubs = publications_from_text(_text(body))
        elif kind in ("application/json", ""):
            try:
                data = loads(body)  # exact: no integer rounded to a float, no 1e-400 as 0
            except DecodeError as exc:
                raise Problem(400, "invalid JSON", f"the body is not JSON: {exc}") from None
            pubs = publications_from_json(data if isinstance(data, list) else [data])
        else:
            raise Problem(
                415, "unsupported media type", f"{kind}: send application/json or text/plain"
            )
        if not pubs:
            raise Problem(400, "no publications", "the body holds no publication")
        publisher = await clients.publish(caller.client(client), pubs, guaranteed, caller)
        return {"ids": [p.id for p in pubs], "publisher": publisher}

    @api.post("/advertisements", status_code=201)
    async def advertise(body: AdvertisementBody, caller: Caller = calling) -> dict[str, Any]:
        """Advertise what a publisher will publish; returns once routing has settled."""
        adv = advertisement_from(body.filter, clients.new_id("a"))
        client = caller.client(body.client)
        incomplete = await clients.advertise(client, adv, caller)
        return _advertisement(adv.id, client, format_filter(adv.filter)) | {
            "incomplete": list(incomplete)
        }

    @api.get("/advertisements")
    async def advertisements(caller: Caller = calling) -> list[dict[str, Any]]:
        """The advertisements made through this broker's API (the caller's, with accounts)."""
        return [
            _advertisement(a.id, a.client, format_filter(a.advertisement.filter))
            for a in clients.advertisements.values()
            if caller.account is None or caller.account.owns(a.client)
        ]

    @api.delete("/advertisements/{aid}", status_code=204)
    async def unadvertise(aid: str, caller: Caller = calling) -> None:
        """Withdraw an advertisement."""
        await clients.unadvertise(aid, caller)

    return api


def _advertisement(aid: str, client: str, text: str) -> dict[str, Any]:
    return {"id": aid, "client": client, "filter": text}


def _text(body: bytes) -> str:
    try:
        return body.decode()
    except UnicodeDecodeError as exc:
        raise Problem(400, "invalid text", f"the body is not UTF-8: {exc}") from None
