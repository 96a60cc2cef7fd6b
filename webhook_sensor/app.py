"""The crawler's webhook: authenticate, validate, store one row, answer 200. Nothing else.

A delivery answered 200 is in the `deliveries` table (the INSERT commits before the answer);
a refused one stores nothing. Embedding happens later, in Dagster, never in the request.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from contextlib import asynccontextmanager

import psycopg
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from rag_pipeline.settings import Settings, get_settings
from rag_pipeline.store import db
from rag_pipeline.store.deliveries import INSERT_DELIVERY
from webhook_sensor import intake
from webhook_sensor.intake import Probe, Refused
from webhook_sensor.observability import NOTE_KEY, AccessLog, Metrics, access_logger
from webhook_sensor.openapi import WEBHOOK_OPENAPI

log = logging.getLogger("webhook_sensor")

TOKEN_HEADER = "x-webhook-token"
# A delivery waits at most this long for a database connection, then gets 503 (the crawler retries).
POOL_TIMEOUT_S = 5.0


def _digest(token: str) -> bytes:
    # Compare digests, not the strings: equal lengths, so the comparison time says nothing.
    return hashlib.sha256(token.encode("utf-8", errors="surrogatepass")).digest()


def check_token(request: Request, expected_digest: bytes | None) -> None:
    if expected_digest is None:
        return
    given = request.query_params.get("token") or request.headers.get(TOKEN_HEADER) or ""
    if not hmac.compare_digest(_digest(given), expected_digest):
        raise Refused(401, "bad_token", "missing or wrong token")


async def read_capped(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed `limit` (before reading it all)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise Refused(413, "body_too_large", f"body exceeds {limit} bytes")
    chunks, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise Refused(413, "body_too_large", f"body exceeds {limit} bytes")
        chunks.append(part)
    return b"".join(chunks)


def create_app(settings: Settings | None = None, database_url: str | None = None) -> FastAPI:
    settings = settings or get_settings()
    token = settings.webhook_token or None
    if not token and not settings.webhook_allow_no_token:
        raise RuntimeError("WEBHOOK_TOKEN is not set (set WEBHOOK_ALLOW_NO_TOKEN=1 to run without one)")
    token_digest = _digest(token) if token else None
    metrics = Metrics.create()
    logger = access_logger()
    if not token:
        log.warning("WEBHOOK_ALLOW_NO_TOKEN=1: the webhook accepts deliveries without a token")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        url = database_url or db.server_url(settings)
        for attempt in range(3):
            try:
                db.prepare(url)
                break
            except psycopg.errors.UniqueViolation:
                # Workers starting together on a fresh server race to create the database and the
                # migrations table: one wins, the others try again and find it done.
                if attempt == 2:
                    raise
        pool = AsyncConnectionPool(url, min_size=settings.webhook_pool_size, max_size=settings.webhook_pool_size,
                                   open=False, timeout=POOL_TIMEOUT_S, kwargs={"autocommit": True})
        await pool.open(wait=True)
        app.state.pool = pool
        try:
            yield
        finally:
            await pool.close()

    app = FastAPI(title="rag-pipeline webhook", version="1", lifespan=lifespan,
                  description="Receives the crawler's deliveries and stores each one before answering 200.")

    def refuse(request: Request, exc: Refused) -> JSONResponse:
        metrics.refusals.labels(exc.reason).inc()
        request.scope.get(NOTE_KEY, {}).update(reason=exc.reason, error=exc.message)
        return JSONResponse({"error": exc.message, "reason": exc.reason}, status_code=exc.status)

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> JSONResponse:
        return refuse(request, exc)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Never reached by anything a client can send (the fuzz tests hold us to that).
        log.exception("unexpected error on %s", request.url.path)
        return refuse(request, Refused(500, "internal_error", "internal error"))

    @app.post("/webhook", openapi_extra=WEBHOOK_OPENAPI, response_class=JSONResponse)
    async def webhook(request: Request) -> JSONResponse:
        """Store one crawler delivery (token checked before the body is read)."""
        check_token(request, token_digest)
        note = request.scope.get(NOTE_KEY, {})
        headers = intake.HeaderIndex(request.scope["headers"])
        if intake.is_probe(headers):
            metrics.deliveries.labels("probe").inc()
            note.update(outcome="probe")
            return JSONResponse({"status": "ignored", "reason": "monitoring probe"})
        raw = await read_capped(request, settings.webhook_max_body_bytes)
        delivery = intake.parse(headers, raw, max_page_bytes=settings.webhook_max_page_bytes)
        if isinstance(delivery, Probe):
            metrics.deliveries.labels("probe").inc()
            note.update(outcome="probe")
            return JSONResponse({"status": "ignored", "reason": "monitoring probe"})
        note["rid"] = delivery.rid
        try:
            async with app.state.pool.connection() as conn:
                cur = await conn.execute(INSERT_DELIVERY, delivery.row(), prepare=True)
                stored = await cur.fetchone()
        except (psycopg.OperationalError, PoolTimeout) as exc:
            log.warning("database unavailable: %s", exc)
            raise Refused(503, "database_unavailable", "database unavailable, retry later") from exc
        outcome = "stored" if stored else "duplicate"
        metrics.deliveries.labels(outcome).inc()
        if delivery.invalid_utf8 and stored:
            metrics.invalid_utf8.inc()
            note["invalid_utf8"] = True
        note["outcome"] = outcome
        return JSONResponse({"status": outcome, "rid": delivery.rid})

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        """200 when the database answers, else 503."""
        try:
            async with app.state.pool.connection(timeout=2) as conn:
                await conn.execute("SELECT 1")
        except Exception as exc:  # noqa: BLE001 - health must answer, whatever broke
            return JSONResponse({"status": "unhealthy", "error": str(exc)}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        """Prometheus text format: deliveries by outcome, refusals by reason, latency histogram."""
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    app.add_middleware(AccessLog, metrics=metrics, logger=logger, log_all=settings.webhook_access_log)
    app.state.metrics = metrics
    return app
