"""The query API for applications: POST /search and POST /ask, answered as `search --json` and
`ask --json` answer (the same retrieval, filters and citations), behind a bearer token.

It runs as its own process (`rag-pipeline serve`), never inside the webhook receiver: a slow
question or a model load must not delay a crawler's delivery. The token, the in-flight limit and
the body are checked in front of FastAPI (`guard.Guard`), so a request without the token is
answered 401 before its body is read or validated. A client that hangs up while its query runs
has the query cancelled (`hangup.CancelOnHangUp`): its connection goes back to the pool at once.
Every error has one shape (`errors`); the request and response bodies are in `models`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import psycopg
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from psycopg_pool import PoolTimeout

from query_api import errors
from query_api.errors import ApiError
from query_api.guard import DOCS_PATHS, MAX_BODY_BYTES, PUBLIC_PATHS, Guard
from query_api.hangup import CancelOnHangUp, ClientGoneAway
from query_api.models import AskRequest, ErrorResponse, SearchRequest, SearchResponse
from rag_pipeline.embedders.base import Embedder
from rag_pipeline.settings import Settings, get_settings
from rag_pipeline.store import db
from rag_pipeline.store.spaces import Space
from webhook_sensor.app import token_digest

__all__ = ["create_app", "MAX_BODY_BYTES"]

log = logging.getLogger("query_api")

# A request waits at most this long for a database connection, then gets 503.
POOL_TIMEOUT_S = 5.0

T = TypeVar("T")


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

    # The interactive docs and the schema are not served unless made public (QUERY_API_PUBLIC_DOCS),
    # as the receiver's: the schema stays in the app (app.openapi()) for tools and tests.
    docs = settings.query_api_public_docs
    app = FastAPI(title="rag-pipeline query API", version="1", lifespan=lifespan,
                  description="Search and answers over the live index, citing URL, excerpt and freshness. "
                              "Every path but /healthz (and the schema, when public) needs "
                              "`Authorization: Bearer <token>`. Every error is `{\"error\": …, \"reason\": …}`.",
                  docs_url="/docs" if docs else None, redoc_url="/redoc" if docs else None,
                  openapi_url="/openapi.json" if docs else None)
    errors.install(app)

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

    responses = {status: {"model": ErrorResponse} for status in (401, 405, 413, 415, 422, 429, 503)}

    @app.post("/search", response_model=SearchResponse, responses=responses)
    async def search(body: SearchRequest, request: Request) -> dict:
        """The top-k passages of live pages for the question, best first, with their freshness."""
        from rag_pipeline.query.retrieval import retrieve

        from rag_pipeline.store.spaces import search_scan
        from rag_pipeline.store.text_search import lexical_scan

        hits, scan, lexical = await served(request, lambda conn: (
            retrieve(conn, settings, body.question, body.k, per_page=body.per_page_asked(), filters=body.filters,
                     embedder_for=embedders, mode=body.mode), search_scan(conn), lexical_scan(conn)))
        return {"question": body.question, "vector_scan": scan, "lexical_scan": lexical,
                "results": [h.as_dict() for h in hits]}

    @app.post("/ask", responses={**responses, 502: {"model": ErrorResponse}})
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
            return errors.error_response(503, "database_unavailable", "database unavailable")
        return JSONResponse({"status": "ok"})

    app.add_middleware(Guard, expected_digest=token_digest(token) if token else None,
                       max_inflight=settings.query_api_max_inflight, rate=settings.query_api_rate,
                       burst=settings.query_api_burst, public_paths=PUBLIC_PATHS | (DOCS_PATHS if docs else frozenset()))
    return app
