"""The web API and monitor of a padres broker: REST, Server-Sent Events and WebSocket, the live
monitor page, and Prometheus metrics, served on the broker's own port next to ``/ws``.

Every ``padres broker`` installs it (the ``padres.node`` entry point calls ``install``); the
endpoints are described in docs/web.md and at ``/docs`` on any broker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles

from padres.runtime.node import BrokerNode
from web import broker, dead_letters, history, publishing, subscribing
from web.admission import Admission
from web.auth import Authenticator
from web.clients import Clients
from web.metrics import Metrics
from web.overlay import PRIVATE, Overlay
from web.problems import install_handlers
from web.tracing import Tracer

__all__ = ["STATIC", "install"]

STATIC = Path(__file__).resolve().parent / "static"


def install(node: BrokerNode) -> None:
    """Mount the API, the monitor page and the metrics on ``node``'s app."""
    # The docs are served below from this package's own files (no CDN).
    app = FastAPI(title=f"padres broker {node.broker.id}", docs_url=None, redoc_url=None)
    node.mount(app)
    clients = Clients(node)
    metrics = Metrics(node, private=PRIVATE)
    tracer = Tracer(metrics, private=PRIVATE)
    overlay = Overlay(clients, metrics, tracer)
    node.observers += [metrics.observe, tracer.observe, overlay.observe]
    node.services += [overlay.run, clients.expire]
    install_handlers(app)
    # The monitor page of one broker reads the routing tables of the others (with accounts,
    # the page's ?access_token= goes along: see web.auth).
    app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["GET"])
    auth = Authenticator(node)
    app.add_middleware(Admission, auth=auth)
    for module in (publishing, subscribing, history):
        app.include_router(module.router(clients, auth))
    owner = [Depends(auth.client_owner)]
    app.include_router(dead_letters.router(clients), dependencies=owner)
    admin = [Depends(auth.admin)]
    app.include_router(broker.router(clients), dependencies=admin)
    app.include_router(metrics.router(), dependencies=admin)
    app.include_router(tracer.router(clients, overlay.brokers_now), dependencies=admin)
    app.include_router(_monitor(overlay), dependencies=admin)
    app.include_router(_docs())
    app.mount("/static", StaticFiles(directory=STATIC), name="static")


def _monitor(overlay: Overlay) -> APIRouter:
    api = APIRouter(tags=["monitor"])

    @api.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    @api.get("/api/v1/overlay")
    async def view() -> dict[str, Any]:
        """The whole overlay: brokers (with what each reports), links, clients and databases,
        as learned from the brokers' BROKER_INFO publications; the first request after a quiet
        time waits for the first round of them (a few seconds at most)."""
        return await overlay.fresh_view()

    return api


def _docs() -> APIRouter:
    """The API's description, open to everyone: it holds no data."""
    api = APIRouter()

    @api.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        """The OpenAPI description in Swagger UI, from this broker's own files."""
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title="padres API",
            swagger_js_url="/static/swagger-ui-bundle.js",
            swagger_css_url="/static/swagger-ui.css",
            swagger_favicon_url="/static/swagger-favicon.png",
        )

    return api
