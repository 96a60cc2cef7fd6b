"""The query API for applications: POST /search and POST /ask, answered as `search --json` and
`ask --json` answer (the same retrieval, filters and citations), behind a bearer token.

It runs as its own process (`rag-pipeline serve`), never inside the webhook receiver: a slow
question or a model load must not delay a crawler's delivery. The token, the in-flight limit and
the body cap are checked in front of FastAPI (`Guard`), so a request without the token is
answered 401 before its body is read or validated. A client that hangs up while its query runs
has the query cancelled (`CancelOnHangUp`): its connection goes back to the pool at once.
"""

from __future__ import annotations

import hmac
import logging
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Literal, TypeVar

import anyio
import psycopg
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from psycopg_pool import PoolTimeout
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from rag_pipeline.core.filters import FilterError, SearchFilters
from rag_pipeline.crawl.ratelimit import RateLimiter
from rag_pipeline.embedders.base import Embedder
from rag_pipeline.settings import Settings, get_settings
from rag_pipeline.store import db
from rag_pipeline.store.spaces import Space
from webhook_sensor.app import ClientGone, read_capped, token_digest
from webhook_sensor.intake import HeaderIndex, Refused

log = logging.getLogger("query_api")

MAX_BODY_BYTES = 64 * 1024
MAX_QUESTION_CHARS = 2000
MAX_SITES = 20
# A request waits at most this long for a database connection, then gets 503.
POOL_TIMEOUT_S = 5.0
# How often a request whose query runs looks whether its client is still there, and how often the
# cancel is sent again while the work goes on (one that lands between two statements is ignored).
HANG_UP_POLL_S = 0.1
CANCEL_AGAIN_S = 0.5
# Paths anyone may read: health for load balancers, the schema and its docs.
PUBLIC_PATHS = frozenset({"/healthz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


class ApiError(Exception):
    """An answer other than 200: status, a reason a program can switch on, a message a person reads."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


class RateLimited(Refused):
    def __init__(self, wait_s: float):
        super().__init__(429, "rate_limited", f"too many requests for this token; retry in {wait_s:.1f} s")
        self.retry_after = max(1, math.ceil(wait_s))


def _error(status: int, reason: str, message: str, *, retry_after: int | None = None, **extra) -> JSONResponse:
    headers = {"Retry-After": "1"} if status == 503 else None
    if status == 401:
        headers = {"WWW-Authenticate": "Bearer"}
    if retry_after is not None:
        headers = {"Retry-After": str(retry_after)}
    return JSONResponse({"error": message, "reason": reason, **extra}, status_code=status, headers=headers)


class _Filtered(BaseModel):
    """The question and the filters both endpoints take."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS)
    mode: Literal["vector", "lexical", "hybrid"] | None = Field(
        None, description="By meaning, by words, or both fused (null: the server's SEARCH_MODE).")
    max_age: str | None = Field(None, description="Only pages verified within this age: 30m, 12h, 7d, 2w.",
                                examples=["7d"])
    changed_since: str | None = Field(None, description="Only pages whose content changed at or after this "
                                      "date (YYYY-MM-DD, or an ISO date and time; UTC unless it says).",
                                      examples=["2026-11-01"])
    site: list[str] = Field(default_factory=list, max_length=MAX_SITES,
                            description="URL globs (* and ?); a page matching any one passes.",
                            examples=[["https://docs.example.com/*"]])
    _filters: SearchFilters = PrivateAttr(default_factory=SearchFilters)

    @field_validator("question")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the question is empty")
        return value

    @model_validator(mode="after")
    def _parse_filters(self):
        try:
            self._filters = SearchFilters.parse(self.max_age, self.changed_since, self.site)
        except FilterError as exc:
            raise ValueError(str(exc)) from None
        return self

    @property
    def filters(self) -> SearchFilters:
        return self._filters


class SearchRequest(_Filtered):
    k: int = Field(5, ge=1, le=100, description="Results wanted.")
    per_page: int | None = Field(1, ge=1, le=100,
                                 description="Passages of one page at most (null: no limit); 1 makes every result another source.")


class AskRequest(_Filtered):
    k: int = Field(8, ge=1, le=50, description="Passages retrieved; the best that fit ANSWER_MAX_CONTEXT_TOKENS are sent.")


class CitationOut(BaseModel):
    url: str
    page_url: str
    excerpt: str
    chunk_index: int
    score: float
    last_verified_at: str | None
    last_changed_at: str | None


class SearchResponse(BaseModel):
    question: str
    # `hnsw` and `gin`, or `exact (…)` while an index makes way for a bulk load: exact, only slower.
    vector_scan: str
    lexical_scan: str
    results: list[CitationOut]


class ErrorResponse(BaseModel):
    error: str
    reason: str


T = TypeVar("T")


class ClientGoneAway(Exception):
    """The client hung up while its request was served: its work was cancelled."""


class CancelOnHangUp:
    """One request's blocking database work, run in a worker thread while the event loop watches
    the client: when it hangs up, the query running on the request's pooled connection is
    cancelled in PostgreSQL (`cancel_safe`), so the connection goes back to the pool at once
    instead of after the scan (or QUERY_STATEMENT_TIMEOUT_S). The connection is cancelled only
    while the work holds it (`holding`): never once it is back in the pool and someone else's."""

    def __init__(self, request: Request):
        self.request = request
        self.gone = False
        self._lock = threading.Lock()
        self._conn: psycopg.Connection | None = None

    @contextmanager
    def holding(self, conn: psycopg.Connection) -> Iterator[psycopg.Connection]:
        """In the worker thread, around the work on ``conn``: what a hang-up cancels."""
        with self._lock:
            if self.gone:
                raise ClientGoneAway()
            self._conn = conn
        try:
            yield conn
        finally:
            with self._lock:
                self._conn = None

    async def run(self, work: Callable[[], T]) -> T:
        """``work()`` in a worker thread, cancelled if the client hangs up; its result or its error."""
        failed: BaseException | None = None
        async with anyio.create_task_group() as watchers:    # raised out of here, an error comes wrapped
            watchers.start_soon(self._watch)
            try:
                result = await run_in_threadpool(work)
            except Exception as exc:  # noqa: BLE001 - raised below, as it is
                failed = exc
            watchers.cancel_scope.cancel()
        if self.gone:
            raise ClientGoneAway() from failed
        if failed is not None:
            raise failed
        return result

    async def _watch(self) -> None:
        while not await self.request.is_disconnected():
            await anyio.sleep(HANG_UP_POLL_S)
        self.gone = True
        while True:         # until the work ends (run cancels this task): a statement may start after a cancel
            await anyio.to_thread.run_sync(self._cancel)
            await anyio.sleep(CANCEL_AGAIN_S)

    def _cancel(self) -> None:
        with self._lock:
            if self._conn is None:
                return
            try:
                self._conn.cancel_safe(timeout=5.0)
            except Exception as exc:  # noqa: BLE001 - the statement timeout still ends the query
                log.warning("could not cancel the query of a client that hung up: %s", exc)


class SpaceEmbedders:
    """One embedder per embedding space for the life of the process (a local model loads once)."""

    def __init__(self, settings: Settings):
        self._settings = settings
        self._lock = threading.Lock()
        self._by_space: dict[tuple[int, str, int], Embedder] = {}

    def __call__(self, space: Space) -> Embedder:
        from rag_pipeline.embedders.factory import make_embedder_for_space

        key = (space.space_id, space.model, space.dimensions)
        with self._lock:
            embedder = self._by_space.get(key)
            if embedder is None:
                embedder = self._by_space[key] = make_embedder_for_space(self._settings, space)
            return embedder


class Guard:
    """In front of FastAPI: the bearer token (401), the in-flight limit (503) and the body cap
    (413, before the body is read when Content-Length says so), for every path but the public ones."""

    def __init__(self, app, expected_digest: bytes | None, max_inflight: int, rate: float = 20.0, burst: int = 40):
        self.app, self.expected_digest, self.max_inflight = app, expected_digest, max_inflight
        self.inflight = 0
        self.rate, self.burst = rate, burst
        self.buckets: dict[bytes, RateLimiter] = {}    # per token (its digest): one client cannot starve the rest

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        headers = HeaderIndex(scope["headers"])
        try:
            self._check_rate(self._check_token(headers))
            if self.inflight >= self.max_inflight:
                raise Refused(503, "busy", f"{self.max_inflight} requests in flight already; retry shortly")
            body = await read_capped(headers, receive, MAX_BODY_BYTES)
        except Refused as exc:
            await _error(exc.status, exc.reason, exc.message,
                         retry_after=getattr(exc, "retry_after", None))(scope, receive, send)
            return
        except ClientGone:
            return
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        self.inflight += 1
        try:
            await self.app(scope, replay, send)
        finally:
            self.inflight -= 1

    def _check_token(self, headers: HeaderIndex) -> bytes:
        """The token's digest (what its rate is counted under); 401 for a missing or wrong one."""
        if self.expected_digest is None:
            return b""
        values = headers.getlist("authorization")
        scheme, _, given = (values[0] if values else "").partition(" ")
        digest = token_digest(given.strip())
        if scheme.lower() != "bearer" or not hmac.compare_digest(digest, self.expected_digest):
            raise Refused(401, "bad_token", "missing or wrong token: send Authorization: Bearer <QUERY_API_TOKEN>")
        return digest

    def _check_rate(self, digest: bytes) -> None:
        bucket = self.buckets.get(digest)
        if bucket is None:
            bucket = self.buckets[digest] = RateLimiter(self.rate, self.burst)
        wait_s = bucket.try_acquire()
        if wait_s > 0:
            raise RateLimited(wait_s)


def create_app(settings: Settings | None = None, database_url: str | None = None) -> FastAPI:
    settings = settings or get_settings()
    token = settings.resolved_query_api_token()
    if not token and not settings.query_api_allow_no_token:
        raise RuntimeError("QUERY_API_TOKEN is not set and there is no $RAG_HOME/query_api_token"
                           " (set QUERY_API_ALLOW_NO_TOKEN=1 to run without one)")
    if not token:
        log.warning("QUERY_API_ALLOW_NO_TOKEN=1: the query API answers without a token")
    url = database_url or db.server_url(settings, create=False)
    embedders = SpaceEmbedders(settings)
    chat_lock = threading.Lock()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.chat = None
        try:
            yield
        finally:
            if app.state.chat is not None:
                app.state.chat.close()

    app = FastAPI(title="rag-pipeline query API", version="1", lifespan=lifespan,
                  description="Search and answers over the live index, citing URL, excerpt and freshness. "
                              "Every path but /healthz and the schema needs `Authorization: Bearer <token>`.")

    def connection():
        return db.get_pool(url, max_size=settings.query_api_pool_size,
                           statement_timeout_s=settings.query_statement_timeout_s).connection(timeout=POOL_TIMEOUT_S)

    def chat():
        from rag_pipeline.query import answers

        with chat_lock:
            if app.state.chat is None:
                try:
                    app.state.chat = answers.make_chat(settings)
                except answers.NotConfigured as exc:
                    raise ApiError(503, "ask_not_configured", str(exc)) from exc
            return app.state.chat

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.reason, exc.message)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for error in exc.errors():
            if error.get("type") == "json_invalid":   # not "0: JSON decode error"
                problems.append("the body is not valid JSON")
                continue
            if error.get("loc") == ("body",) and error.get("type") in ("model_attributes_type", "dict_type"):
                problems.append("the body must be a JSON object")
                continue
            where = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
            message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
            problems.append(f"{where}: {message}" if where else message)
        return _error(422, "invalid_request", "; ".join(problems) or "invalid request")

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s", request.url.path)
        return _error(500, "internal_error", "internal error")

    async def served(request: Request, work: Callable[[psycopg.Connection], T]) -> T:
        """Run ``work`` on a pooled connection in a worker thread, cancelled if the client hangs up
        (`CancelOnHangUp`); what cannot be answered becomes its 5xx."""
        from rag_pipeline.query.chat import ChatError
        from rag_pipeline.query.retrieval import RetrievalError

        watch = CancelOnHangUp(request)

        def run() -> T:
            with connection() as conn, watch.holding(conn):
                return work(conn)

        try:
            return await watch.run(run)
        except ClientGoneAway as exc:
            log.info("client hung up on %s: its query was cancelled", request.url.path)
            # Nobody reads this answer; 499 (nginx's "client closed request") keeps it out of the 5xx.
            raise ApiError(499, "client_closed", "the client closed the connection") from exc
        except RetrievalError as exc:
            raise ApiError(503, "index_unavailable", str(exc)) from exc
        except psycopg.errors.QueryCanceled as exc:
            log.warning("query cancelled after QUERY_STATEMENT_TIMEOUT_S: %s", exc)
            raise ApiError(503, "query_timeout", f"the search took longer than {settings.query_statement_timeout_s:g} s; "
                                                 "ask a shorter question") from exc
        except ChatError as exc:
            # The upstream's own text and address stay in the log: a client learns only that it failed.
            log.warning("chat model failed: %s", exc)
            raise ApiError(502, "chat_failed", "the chat model did not answer; retry later") from exc
        except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout) as exc:
            log.warning("database unavailable: %s", exc)
            raise ApiError(503, "database_unavailable", "database unavailable, retry later") from exc

    errors = {status: {"model": ErrorResponse} for status in (401, 413, 422, 503)}

    @app.post("/search", response_model=SearchResponse, responses=errors)
    async def search(body: SearchRequest, request: Request) -> dict:
        """The top-k passages of live pages for the question, best first, with their freshness."""
        from rag_pipeline.query.retrieval import retrieve

        from rag_pipeline.store.spaces import search_scan
        from rag_pipeline.store.text_search import lexical_scan

        hits, scan, lexical = await served(request, lambda conn: (
            retrieve(conn, settings, body.question, body.k, per_page=body.per_page, filters=body.filters,
                     embedder_for=embedders, mode=body.mode), search_scan(conn), lexical_scan(conn)))
        return {"question": body.question, "vector_scan": scan, "lexical_scan": lexical,
                "results": [h.as_dict() for h in hits]}

    @app.post("/ask", responses={**errors, 502: {"model": ErrorResponse}})
    async def ask(body: AskRequest, request: Request) -> dict:
        """An answer from live pages by the chat model, citing only the sources it used."""
        from rag_pipeline.query import answers

        model = await run_in_threadpool(chat)
        result = await served(request, lambda conn: answers.answer(
            conn, settings, body.question, body.k, model, filters=body.filters, embedder_for=embedders,
            mode=body.mode))
        return {**result.as_dict(), "warnings": answers.warnings(result)}

    @app.get("/healthz")
    def healthz() -> JSONResponse:
        """200 when the index database answers, else 503."""
        try:
            with connection() as conn:
                db.ping(conn)
        except Exception as exc:  # noqa: BLE001 - health must answer, whatever broke
            # Unauthenticated: up or down only; the reason (host, port, user) goes to the log.
            log.warning("healthz: unhealthy: %s", exc)
            return _error(503, "database_unavailable", "database unavailable")
        return JSONResponse({"status": "ok"})

    app.add_middleware(Guard, expected_digest=token_digest(token) if token else None,
                       max_inflight=settings.query_api_max_inflight, rate=settings.query_api_rate,
                       burst=settings.query_api_burst)
    return app
