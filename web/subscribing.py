"""``/api/v1/subscriptions``: subscribe, read the deliveries as Server-Sent Events or over a
WebSocket, unsubscribe."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Final

import orjson
from fastapi import APIRouter, Depends, Header, Query, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse

from padres.errors import InvalidMessage
from padres.model.messages import Subscription, check_id
from padres.model.printer import format_filter, format_message
from padres.model.protocol import CompositeNotify, Envelope, Error, Notify, Scope, envelope_to_dict
from web.auth import Authenticator, Caller
from web.bodies import SubscriptionBody
from web.clients import Clients, RestSubscription, SubscriptionEnded
from web.inputs import composite_from, filter_from
from web.problems import Problem, bad_input, located

__all__ = ["KEEPALIVE", "describe", "router"]

KEEPALIVE: Final = 15.0
"""Seconds without a delivery after which an event stream sends a comment line."""


def _event_name(message: Envelope) -> str:
    return str(envelope_to_dict(message)["type"])


def _event_id(sub: RestSubscription, message: Envelope) -> int:
    """A durable subscription's deliveries are numbered by the broker (``seq``); the others
    by the order they were read."""
    if isinstance(message, Notify | CompositeNotify) and message.seq:
        return message.seq
    return sub.delivered


async def _with_keepalives(
    deliveries: AsyncIterator[Envelope],
) -> AsyncIterator[Envelope | None]:
    """The deliveries, with a None after each ``KEEPALIVE`` seconds without one: a stream
    that stays quiet is then not closed by a proxy, and a reader that left is noticed."""
    pending: asyncio.Future[Envelope] = asyncio.ensure_future(anext(deliveries))
    try:
        while True:
            done, _ = await asyncio.wait({pending}, timeout=KEEPALIVE)
            if not done:
                yield None
                continue
            try:
                message = pending.result()
            except StopAsyncIteration:
                return
            yield message
            pending = asyncio.ensure_future(anext(deliveries))
    finally:
        pending.cancel()


def describe(sub: RestSubscription) -> dict[str, Any]:
    base = f"/api/v1/subscriptions/{sub.id}"
    if isinstance(sub.message, Subscription):
        text = format_filter(sub.message.filter)
    else:
        text = format_message(sub.message)
    return {
        "id": sub.id,
        "kind": sub.kind,
        "text": text,
        "durable": sub.durable,
        "priority": sub.priority,
        "scope": sub.scope.value,
        "reading": sub.reading,
        "delivered": sub.delivered,
        "events": f"{base}/events",
        "websocket": f"{base}/ws",
    }


def _made(body: SubscriptionBody, sid: str) -> RestSubscription:
    if (body.filter is None) == (body.expression is None):
        raise Problem(400, "invalid subscription", "give exactly one of 'filter' and 'expression'")
    scope = Scope(body.scope)
    if body.filter is None:
        if body.priority or scope is not Scope.GLOBAL:
            why = "'priority' and 'scope' are options of atomic subscriptions ('filter')"
            raise Problem(400, "invalid subscription", why)
        expression = body.expression or ""
        return RestSubscription(sid, "composite", composite_from(expression, sid), body.durable)
    flt = filter_from(body.filter)
    try:
        sub = Subscription(sid, flt)
        return RestSubscription(sid, "subscription", sub, body.durable, body.priority, scope)
    except InvalidMessage as exc:  # pragma: no cover - the filter is valid by now
        raise bad_input([located(exc, "filter")], "subscription") from None


def router(clients: Clients, auth: Authenticator) -> APIRouter:
    api = APIRouter(prefix="/api/v1", tags=["subscribe"])
    calling = Depends(auth.caller)

    @api.post("/subscriptions", status_code=201)
    async def subscribe(body: SubscriptionBody, caller: Caller = calling) -> dict[str, Any]:
        """Subscribe (atomic, composite, or durable); returns once routing has settled. Read
        the deliveries at ``events`` (SSE) or ``websocket``."""
        sid = body.name or clients.new_id("s")
        try:
            check_id(sid, "subscription name")
        except InvalidMessage as exc:
            raise bad_input([located(exc, "name")], "subscription") from None
        if sid in clients.subscriptions:
            raise Problem(409, "exists", f"subscription {sid!r} already exists")
        sub = _made(body, sid)
        incomplete = await clients.subscribe(sub, caller)
        return describe(sub) | {"incomplete": list(incomplete)}

    @api.get("/subscriptions")
    async def subscriptions(caller: Caller = calling) -> list[dict[str, Any]]:
        """The subscriptions made through this broker's API (the caller's, with accounts)."""
        return [describe(s) for s in clients.subscriptions.values() if caller.owns(s.owner)]

    @api.get("/subscriptions/{sid}")
    async def subscription(sid: str, caller: Caller = calling) -> dict[str, Any]:
        return describe(clients.get(sid, caller))

    @api.delete("/subscriptions/{sid}", status_code=204)
    async def unsubscribe(sid: str, caller: Caller = calling) -> None:
        """End a subscription (a durable one for good)."""
        await clients.unsubscribe(sid, caller)

    @api.get(
        "/subscriptions/{sid}/events",
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {}}}},
    )
    async def events(
        sid: str,
        last_event_id: int | None = Header(
            None, ge=0, description="resume a durable subscription after this delivery"
        ),
        caller: Caller = calling,
    ) -> StreamingResponse:
        """The deliveries as Server-Sent Events: ``notify``, ``tx_notify``,
        ``composite_notify``, ``replay_done`` and ``error`` events, each a wire message as
        JSON; a durable subscription's event ids are its delivery numbers."""
        sub = clients.get(sid, caller)  # a 404 or a 409 before the stream starts
        if sub.reading:
            raise Problem(409, "already read", f"another stream reads subscription {sid!r}")

        async def sse() -> AsyncIterator[bytes]:
            try:
                async with clients.stream(sid, last_event_id, caller) as deliveries:
                    yield b": subscribed\n\n"
                    async for message in _with_keepalives(deliveries):
                        if message is None:
                            yield b": keepalive\n\n"
                            continue
                        head = f"id: {_event_id(sub, message)}\nevent: {_event_name(message)}\n"
                        data = orjson.dumps(envelope_to_dict(message))
                        yield head.encode() + b"data: " + data + b"\n\n"
            except (SubscriptionEnded, Problem) as exc:
                data = orjson.dumps(envelope_to_dict(Error(f"subscription ended: {exc}")))
                yield b"event: error\ndata: " + data + b"\n\n"

        return StreamingResponse(
            sse(), media_type="text/event-stream", headers={"Cache-Control": "no-store"}
        )

    @api.websocket("/subscriptions/{sid}/ws")
    async def websocket(
        ws: WebSocket,
        sid: str,
        last_event_id: int | None = Query(None, ge=0),
        caller: Caller = calling,
    ) -> None:
        """The deliveries over a WebSocket, one wire message per text frame; a frame from
        the client is ignored, closing ends the stream."""
        await ws.accept()

        async def pump() -> None:
            async with clients.stream(sid, last_event_id, caller) as deliveries:
                async for message in deliveries:
                    await ws.send_text(orjson.dumps(envelope_to_dict(message)).decode())

        async def listen() -> None:
            while (await ws.receive())["type"] != "websocket.disconnect":
                pass

        loop = asyncio.get_running_loop()
        pumping, listening = loop.create_task(pump()), loop.create_task(listen())
        try:
            await asyncio.wait([pumping, listening], return_when=asyncio.FIRST_COMPLETED)
            if pumping.done():
                pumping.result()
        except Problem as exc:
            await ws.close(1008, exc.detail[:120])
        except SubscriptionEnded as exc:
            await ws.close(1008, f"subscription ended: {exc}"[:120])
        except WebSocketDisconnect:
            pass
        finally:
            for task in (pumping, listening):
                task.cancel()

    return api
