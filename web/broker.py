"""``/api/v1/broker``, ``/api/v1/routing`` and ``/api/v1/databases``: what this broker holds."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import asdict
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Any, Final, Literal

from fastapi import APIRouter, Query, Response

from padres.errors import ConnectionLost, RequestFailed
from padres.language.parser import parse_filter
from padres.model.messages import Publication
from padres.model.printer import format_filter
from padres.model.protocol import Notify
from web.bodies import StoreBody
from web.clients import Clients, connect
from web.inputs import advertisement_from, filter_from
from web.pages import token, untoken
from web.problems import Problem

__all__ = ["CONTROL_TIMEOUT", "broker_info", "databases", "router"]

CONTROL_TIMEOUT: Final = 10.0
"""Seconds a STORE or STOP waits for the database's answer."""
TABLES: Final = {"prt": "subscriptions", "srt": "advertisements"}
"""PADRES' names: the publication routing table holds subscriptions, the subscription routing
table advertisements."""
CONTROL_ADVERTISEMENT: Final = (
    "[class,eq,'DB_CONTROL'],[db,isPresent,''],[command,isPresent,''],"
    "[spec,isPresent,''],[request,isPresent,'']"
)


def peer_names(clients: Clients) -> dict[str, str]:
    """hop -> the broker or client on it."""
    broker = clients.node.broker
    names = {hop: s.name for hop, s in broker.sessions.items()}
    return names | broker.peers


def broker_info(clients: Clients) -> dict[str, Any]:
    node = clients.node
    names = peer_names(clients)
    queues = node.queues()
    status = node.status()
    return {
        "id": node.broker.id,
        "uptime": status["uptime"],
        "neighbours": [
            {"id": names.get(hop, hop), "hop": hop, **q} for hop, q in queues.items() if q["link"]
        ],
        "clients": [
            {"name": names.get(hop, hop), "hop": hop, **q}
            for hop, q in queues.items()
            if not q["link"]
        ],
        "queues": {k: status[k] for k in ("queued", "queued_bytes", "dropped", "evicted")},
        "status": status,
        "version": version("padres"),
        "settings": {**asdict(node.limits), "heartbeat": node.heartbeat},
    }


def named_hops(row: str, names: dict[str, str]) -> str:
    """A routing row with the hops of its ``from=`` and ``to=`` written as the brokers and
    clients on them."""

    def name(found: re.Match[str]) -> str:
        hops = found.group(2).split(",")
        return f"{found.group(1)}={','.join(names.get(hop, hop) for hop in hops)}"

    return _HOPS.sub(name, row)


_HOPS: Final = re.compile(r"\b(from|to)=(\S+)")


def databases(clients: Clients) -> dict[str, list[str]]:
    """The databases that offer replay in the overlay, and what each stores (its offers)."""
    found: dict[str, list[str]] = {}
    for tree in clients.node.broker.archives:
        for adv in tree.advertisements.values():
            found.setdefault(tree.replay, []).append(format_filter(adv.filter))
    return {name: sorted(specs) for name, specs in sorted(found.items())}


def router(clients: Clients) -> APIRouter:
    api = APIRouter(prefix="/api/v1", tags=["broker"])
    advertising = asyncio.Lock()
    advertised: set[str] = set()

    @api.get("/broker")
    async def broker() -> dict[str, Any]:
        """This broker: its id, neighbours, clients, uptime and queues."""
        return broker_info(clients)

    @api.get("/routing")
    async def routing(
        table: Literal["prt", "srt"] = Query(
            "prt", description="prt: subscriptions; srt: advertisements"
        ),
        search: str = Query("", description="only rows holding this text (any case)"),
        page_size: int = Query(100, ge=1, le=10_000),
        page_token: str | None = Query(None),
    ) -> dict[str, Any]:
        """A routing table of this broker, searchable, a page at a time."""
        asking = await clients.publisher("web")
        names = peer_names(clients)
        rows = [named_hops(row, names) for row in await asking.query(TABLES[table])]
        if search:
            rows = [r for r in rows if search.lower() in r.lower()]
        offset = 0
        if page_token is not None:
            key, offset = untoken(page_token)
            if key != f"{table}|{search}":
                raise Problem(400, "invalid page token", "the token is for another listing")
        page = rows[offset : offset + page_size]
        following = offset + len(page)
        return {
            "broker": clients.node.broker.id,
            "table": table,
            "rows": page,
            "total": len(rows),
            "next_page_token": (
                token(f"{table}|{search}", following) if following < len(rows) else None
            ),
        }

    @api.get("/durables")
    async def durables() -> list[dict[str, Any]]:
        """The durable subscriptions kept at this broker: whose (``owner``, ``name``), whether
        its client is connected (or for how many seconds it has been ``away``), the
        deliveries and bytes ``queued`` for it, the last delivery it acknowledged, and the time
        of the ``oldest`` one waiting."""
        return clients.node.durables()

    @api.delete("/durables/{owner}/{name}", status_code=204)
    async def delete_durable(owner: str, name: str) -> Response:
        """Delete a durable subscription with what it queued; its client, if connected, is
        told with an error."""
        if not clients.node.drop_durable(owner, name):
            why = f"no durable subscription {name!r} of {owner!r} at this broker"
            raise Problem(404, "no such durable subscription", why)
        return Response(status_code=204)

    @api.delete("/clients/{name}", status_code=204)
    async def close_client(name: str) -> Response:
        """Close a client's connection (``name`` as the broker knows it, ``shop@B1``), telling
        it why: its subscriptions and advertisements go with it, its durable ones wait."""
        if not clients.node.disconnect(name, "closed by an administrator"):
            raise Problem(404, "no such client", f"no client {name!r} is connected here")
        return Response(status_code=204)

    @api.get("/databases")
    async def listing() -> list[dict[str, Any]]:
        """The databases of the overlay, learned from their replay offers, and what each
        stores."""
        return [{"id": name, "stores": specs} for name, specs in databases(clients).items()]

    async def command(db: str, verb: str, spec: str) -> dict[str, Any]:
        flt = filter_from(spec)
        known = {name.split("@")[0] for name in databases(clients)}
        if db not in known:
            raise Problem(404, "no such database", f"no database {db!r} offers replay here")
        publisher = await clients.publisher("web")
        async with advertising:
            if "control" not in advertised:
                adv = advertisement_from(CONTROL_ADVERTISEMENT, clients.new_id("a"))
                await clients.advertise("web", adv)
                advertised.add("control")
        rid = clients.new_id("r")
        listener = await connect(clients.node, f"web-{rid}")
        try:
            status = parse_filter(f"[class,eq,'DB_STATUS'],[request,eq,'{rid}']")
            answers = await listener.subscribe(status, id=rid)
            await publisher.publish(
                Publication(
                    rid,
                    {
                        "class": "DB_CONTROL",
                        "db": db,
                        "command": verb,
                        "spec": format_filter(flt),
                        "request": rid,
                    },
                    datetime.now(UTC),
                    publisher.session,
                )
            )
            started = time.monotonic()
            async with asyncio.timeout(CONTROL_TIMEOUT):
                async for message in answers:
                    if isinstance(message, Notify):
                        attrs = message.publication.attributes
                        return {
                            "database": db,
                            "command": verb,
                            "ok": attrs.get("ok"),
                            "detail": attrs.get("detail"),
                            "specs": str(attrs.get("specs", "")).splitlines(),
                            "took": round(time.monotonic() - started, 6),
                        }
        except RequestFailed as exc:
            raise Problem(409, "refused by the broker", exc.text) from None
        except (TimeoutError, ConnectionLost):
            pass
        finally:
            await listener.close()
        raise Problem(504, "no answer", f"database {db!r} did not answer {verb} in time")

    @api.post("/databases/{db}/store")
    async def store(db: str, body: StoreBody) -> dict[str, Any]:
        """Tell a database to store what ``filter`` matches from now on (STORE)."""
        return await command(db, "STORE", body.filter)

    @api.post("/databases/{db}/stop")
    async def stop(db: str, body: StoreBody) -> dict[str, Any]:
        """Tell a database to stop storing ``filter`` (STOP); what it stored stays."""
        return await command(db, "STOP", body.filter)

    return api
