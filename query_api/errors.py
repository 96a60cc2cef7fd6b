"""Every answer of the query API but a 200 has one shape, `{"error": …, "reason": …}`, whatever
gave it: the guard in front (token, rate, body), validation, routing (404, 405) or the work
(timeouts, the database, the chat model). `error` is for a person; `reason` is a stable word a
program can switch on. FastAPI's own `{"detail": …}` is never sent."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

log = logging.getLogger("query_api")

# What a 404 lists: the paths an application calls.
SERVED = "POST /search, POST /ask and GET /healthz"


class ApiError(Exception):
    """An answer other than 200: status, a reason a program can switch on, a message a person reads."""

    def __init__(self, status: int, reason: str, message: str, *, retry_after: int | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message
        self.retry_after, self.headers = retry_after, headers


def error_response(status: int, reason: str, message: str, *, retry_after: int | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """The one error shape, with the headers its status calls for (WWW-Authenticate, Retry-After)."""
    extra = dict(headers or {})
    if status == 401:
        extra["WWW-Authenticate"] = "Bearer"
    if status == 503:
        extra.setdefault("Retry-After", "1")
    if retry_after is not None:
        extra["Retry-After"] = str(retry_after)
    return JSONResponse({"error": message, "reason": reason}, status_code=status, headers=extra or None)


def validation_message(errors: Iterable[dict]) -> str:
    """Pydantic's errors as one line a person reads: `field: what is wrong`, joined by `; `."""
    problems = []
    for error in errors:
        if error.get("type") == "json_invalid":   # not "0: JSON decode error"
            problems.append("the body is not valid JSON")
            continue
        if error.get("loc") == ("body",) and error.get("type") in ("model_attributes_type", "dict_type"):
            problems.append('the body must be a JSON object, such as {"question": "…"}')
            continue
        where = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        problems.append(f"{where}: {message}" if where else message)
    return "; ".join(problems) or "invalid request"


def _routing_error(request: Request, exc: HTTPException) -> tuple[str, str]:
    """(reason, message) for what Starlette's router refused: a path or a method it does not serve."""
    path = request.url.path
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "POST")
        body = " with a JSON body" if "POST" in allowed else ""
        return "method_not_allowed", f"{request.method} is not served at {path}: use {allowed}{body}"
    if exc.status_code == 404:
        return "not_found", f"no such path {path}: the API serves {SERVED}"
    return "http_error", str(exc.detail)


def install(app: FastAPI) -> None:
    """The handlers that give every error the one shape."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.reason, exc.message, retry_after=exc.retry_after, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, "invalid_request", validation_message(exc.errors()))

    @app.exception_handler(HTTPException)
    async def routing(request: Request, exc: HTTPException) -> JSONResponse:
        reason, message = _routing_error(request, exc)
        return error_response(exc.status_code, reason, message, headers=exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s", request.url.path)
        return error_response(500, "internal_error", "internal error")
