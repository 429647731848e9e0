"""The web API and monitor of a padres broker: REST, Server-Sent Events and WebSocket, the live
monitor page, and Prometheus metrics, served on the broker's own port next to ``/ws``.

Every ``padres broker`` installs it (the ``padres.node`` entry point calls ``install``); the
endpoints are described in docs/web.md and at ``/docs`` on any broker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from padres.runtime.node import BrokerNode
from web import broker, history, publishing, subscribing
from web.clients import Clients
from web.metrics import Metrics
from web.overlay import PRIVATE, Overlay
from web.problems import install_handlers
from web.tracing import Tracer

__all__ = ["STATIC", "install"]

STATIC = Path(__file__).resolve().parent / "static"


def install(node: BrokerNode) -> None:
    """Mount the API, the monitor page and the metrics on ``node``'s app."""
    app = node.app
    clients = Clients(node)
    metrics = Metrics(node, private=PRIVATE)
    tracer = Tracer(metrics, private=PRIVATE)
    overlay = Overlay(clients, metrics, tracer)
    node.observers += [metrics.observe, tracer.observe, overlay.observe]
    node.services.append(overlay.run)
    install_handlers(app)
    # The monitor page of one broker reads the routing tables of the others.
    app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["GET"])
    for module in (publishing, subscribing, history, broker):
        app.include_router(module.router(clients))
    app.include_router(metrics.router())
    app.include_router(tracer.router(clients, overlay.watch))
    app.include_router(_monitor(overlay))
    app.mount("/static", StaticFiles(directory=STATIC), name="static")


def _monitor(overlay: Overlay) -> APIRouter:
    api = APIRouter(tags=["monitor"])

    @api.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    @api.get("/api/v1/overlay")
    async def view() -> dict[str, Any]:
        """The whole overlay: brokers (with what each reports), links, clients and databases,
        as learned from the brokers' BROKER_INFO publications."""
        return overlay.view()

    return api
