"""Errors of the web API as problem documents (RFC 9457, ``application/problem+json``).

Every refusal names what was wrong: ``title`` says what kind of problem, ``detail`` the
particulars, and extension members locate it: ``errors`` lists each bad input, with ``where``
(a field, ``line 3``, ``publications[2]``) and, for PADRES text, ``line``, ``column``,
``excerpt`` and ``caret``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from padres.errors import DecodeError, InvalidMessage, ParseError

__all__ = ["PROBLEM", "Problem", "bad_input", "install_handlers", "problem_response"]

PROBLEM: Final = "application/problem+json"
log = logging.getLogger("padres.web")


class Problem(Exception):
    """Raised by the API to answer with a problem document (and ``headers``, if given)."""

    def __init__(
        self,
        status: int,
        title: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.title = title
        self.detail = detail
        self.headers = headers
        self.extra = extra

    def response(self) -> Response:
        """This problem, as the response that answers it."""
        return problem_response(self.status, self.title, self.detail, self.headers, **self.extra)


def located(exc: InvalidMessage, where: str) -> dict[str, Any]:
    """One bad input, located: ``where`` it is, and for PADRES text the line, column and caret
    (``line`` counts within that input)."""
    entry: dict[str, Any] = {"where": where}
    if isinstance(exc, ParseError):
        entry |= {
            "reason": exc.reason,
            "line": exc.line,
            "column": exc.column,
            "excerpt": exc.source.rstrip("\n"),
            "caret": " " * (exc.column - 1) + "^",
        }
    elif isinstance(exc, DecodeError):
        entry |= {"reason": exc.reason, "path": exc.path}
    else:
        entry["reason"] = str(exc)
    return entry


def bad_input(errors: list[dict[str, Any]], what: str) -> Problem:
    """A 400 for the ``errors`` (see ``located``) found in ``what``; nothing was accepted."""
    first = errors[0]
    where = first["where"]
    if "line" in first and not where.startswith("line"):
        where += f", line {first['line']}"
    if "column" in first:
        where += f", column {first['column']}"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return Problem(
        400,
        f"invalid {what}",
        f"{where}: {first['reason']}{more}; nothing was accepted",
        errors=errors,
    )


def problem_response(
    status: int, title: str, detail: str, headers: dict[str, str] | None = None, **extra: Any
) -> Response:
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, **extra}
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


def install_handlers(app: FastAPI) -> None:
    """Answer every error of ``app`` with a problem document."""

    async def on_problem(request: Request, exc: Problem) -> Response:
        return exc.response()

    async def on_http(request: Request, exc: HTTPException) -> Response:
        title = {404: "not found", 405: "method not allowed"}.get(exc.status_code, "refused")
        detail = str(exc.detail)
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no resource at {request.url.path}"
        elif exc.status_code == 405:
            detail = f"{request.method} is not allowed on {request.url.path}"
        return problem_response(exc.status_code, title, detail)

    async def on_validation(request: Request, exc: RequestValidationError) -> Response:
        errors = [
            {"where": ".".join(str(part) for part in e["loc"]), "reason": e["msg"]}
            for e in exc.errors()
        ]
        first = errors[0] if errors else {"where": "request", "reason": "invalid"}
        return problem_response(
            422, "invalid request", f"{first['where']}: {first['reason']}", errors=errors
        )

    async def on_bug(request: Request, exc: Exception) -> Response:
        log.exception("web: %s %s failed", request.method, request.url.path)
        return problem_response(
            500, "internal error", f"{type(exc).__name__}: {exc}", instance=request.url.path
        )

    # Starlette types its handlers as taking any Exception; each gets the class it is for.
    handlers: dict[type[Exception], Callable[[Request, Any], Awaitable[Response]]] = {
        Problem: on_problem,
        HTTPException: on_http,
        RequestValidationError: on_validation,
        Exception: on_bug,
    }
    for kind, handler in handlers.items():
        app.add_exception_handler(kind, handler)
