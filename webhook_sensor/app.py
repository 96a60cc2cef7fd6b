"""The crawler's webhook: authenticate, validate, store one row, answer 200. Nothing else.

A delivery answered 200 is in the `deliveries` table (the INSERT commits before the answer);
a refused one stores nothing. Embedding happens later, in Dagster, never in the request.

POST /webhook is served by a plain ASGI handler in front of FastAPI (`WebhookApp.__call__`): the
hot path skips FastAPI's routing, dependency solving, Request and JSONResponse objects and its
middleware stack, which cost about a third of the receiver's own CPU per delivery. The FastAPI
route stays declared, so /openapi.json (and the schemathesis fuzz test) still describe it, and
answers the same way through the same code if it is ever reached directly (a mounted app).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from contextlib import asynccontextmanager
from urllib.parse import parse_qsl

import psycopg
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from rag_pipeline.settings import Settings, get_settings
from rag_pipeline.store import db, schema
from rag_pipeline.store.deliveries import INSERT_DELIVERY
from webhook_sensor import intake
from webhook_sensor.intake import HeaderIndex, Probe, Refused
from webhook_sensor.observability import NOTE_KEY, AccessLog, Metrics, access_logger
from webhook_sensor.openapi import WEBHOOK_OPENAPI

log = logging.getLogger("webhook_sensor")

WEBHOOK_PATH = "/webhook"
TOKEN_HEADER = "x-webhook-token"
# A delivery waits at most this long for a database connection, then gets 503 (the crawler retries).
POOL_TIMEOUT_S = 5.0
# While the database is unreachable at start, the receiver tries again this often (and answers 503).
CONNECT_RETRY_S = 1.0

# Answers are JSON like FastAPI's JSONResponse renders it (compact, UTF-8); the constant parts
# are encoded once.
_JSON_HEADERS = (b"content-type", b"application/json")
_PROBE_ANSWER = b'{"status":"ignored","reason":"monitoring probe"}'
_STORED_PREFIX = b'{"status":"stored","rid":'
_DUPLICATE_PREFIX = b'{"status":"duplicate","rid":'


def token_digest(token: str) -> bytes:
    # Compare digests, not the strings: equal lengths, so the comparison time says nothing.
    return hashlib.sha256(token.encode("utf-8", errors="surrogatepass")).digest()


def _json(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def given_token(query_string: bytes, headers: HeaderIndex) -> str:
    """X-Webhook-Token, else the `token` query parameter (the last one, as Starlette reads it).

    The header wins when both are given: it is what our own senders use, and a URL ends up in
    proxies' logs. The parameter stays accepted for crawlers that can only put it in their
    callback URL (Crawlbase)."""
    values = headers.getlist(TOKEN_HEADER)
    if values and values[0]:
        return values[0]
    token = ""
    if query_string:
        for name, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
            if name == "token":
                token = value
    return token


def check_token(query_string: bytes, headers: HeaderIndex, expected: bytes | tuple[bytes, ...] | None) -> None:
    """The token against each valid one (two during a rotation), every comparison made whatever
    the first one said: the time taken tells nothing."""
    if expected is None:
        return
    digests = (expected,) if isinstance(expected, bytes) else expected
    given = token_digest(given_token(query_string, headers))
    if not any([hmac.compare_digest(given, digest) for digest in digests]):
        raise Refused(401, "bad_token", "missing or wrong token")


class ClientGone(Exception):
    """The client hung up before its body arrived: nothing to store, nobody to answer."""


async def read_capped(headers: HeaderIndex, receive, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed `limit` (before reading it all)."""
    declared = headers.getlist("content-length")
    if declared and declared[0].isdigit() and int(declared[0]) > limit:
        raise Refused(413, "body_too_large", f"body exceeds {limit} bytes")
    chunks, size = [], 0
    while True:
        message = await receive()
        kind = message["type"]
        if kind == "http.request":
            part = message.get("body", b"")
            if part:
                size += len(part)
                if size > limit:
                    raise Refused(413, "body_too_large", f"body exceeds {limit} bytes")
                chunks.append(part)
            if not message.get("more_body", False):
                break
        elif kind == "http.disconnect":
            raise ClientGone()
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class WebhookApp(FastAPI):
    """FastAPI, with POST /webhook answered by `self.webhook_asgi` before FastAPI's machinery."""

    webhook_asgi = None

    async def __call__(self, scope, receive, send) -> None:
        if (self.webhook_asgi is not None and scope["type"] == "http" and scope["path"] == WEBHOOK_PATH
                and scope["method"] == "POST"):
            await self.webhook_asgi(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def create_app(settings: Settings | None = None, database_url: str | None = None) -> FastAPI:
    settings = settings or get_settings()
    token = settings.resolved_webhook_token()
    if not token and not settings.webhook_allow_no_token:
        raise RuntimeError("WEBHOOK_TOKEN is not set and there is no $RAG_HOME/webhook_token"
                           " (set WEBHOOK_ALLOW_NO_TOKEN=1 to run without one)")
    expected_digest = (tuple(token_digest(t) for t in (token, settings.webhook_token_previous) if t)
                       if token else None)
    metrics = Metrics.create()
    logger = access_logger()
    access = AccessLog(None, metrics=metrics, logger=logger, log_all=settings.webhook_access_log)
    max_body, max_page = settings.webhook_max_body_bytes, settings.webhook_max_page_bytes
    # Label children bound once: `.labels()` costs a lock and a look-up per call.
    counted = {outcome: metrics.deliveries.labels(outcome) for outcome in ("stored", "duplicate", "probe")}
    if not token:
        log.warning("WEBHOOK_ALLOW_NO_TOKEN=1: the webhook accepts deliveries without a token")

    async def connect(url: str, pool: AsyncConnectionPool, ready: asyncio.Event) -> None:
        """Schema checked (`rag-pipeline db migrate` makes it; the receiver never migrates), then the
        pool opened; until then every delivery gets 503. A database
        that is down when the receiver starts (restarting, a crash) must not stop the receiver:
        it keeps trying, and answers as soon as the database does."""
        failing = None
        while True:
            try:
                await asyncio.to_thread(schema.require_current, url)
                break
            except (db.DatabaseError, psycopg.OperationalError) as exc:
                unreachable = isinstance(exc, psycopg.OperationalError) or isinstance(exc.__cause__, psycopg.OperationalError)
                if not unreachable:   # a refusal, not an outage (a bad schema, a doctor's verdict)
                    app.state.connect_error = str(exc)
                    log.error("the database cannot serve deliveries: %s", exc)
                    raise
                if str(exc) != failing:
                    log.warning("database unavailable at start, retrying every %gs: %s", CONNECT_RETRY_S, exc)
                    failing = str(exc)
                app.state.connect_error = str(exc)
                await asyncio.sleep(CONNECT_RETRY_S)
        await pool.open(wait=False)
        app.state.connect_error = None
        ready.set()
        if failing:
            log.warning("database reachable again: accepting deliveries")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        url = database_url or db.server_url(settings)
        pool = AsyncConnectionPool(url, min_size=settings.webhook_pool_size, max_size=settings.webhook_pool_size,
                                   open=False, timeout=POOL_TIMEOUT_S, kwargs={"autocommit": True})
        app.state.pool = pool
        app.state.ready = asyncio.Event()
        app.state.connect_error = None
        connecting = asyncio.create_task(connect(url, pool, app.state.ready))
        # A reachable database is ready before the first request, as it always was; a refusal
        # (not an outage) fails the start with its reason.
        await asyncio.wait([connecting], timeout=POOL_TIMEOUT_S)
        if connecting.done() and connecting.exception() is not None:
            raise connecting.exception()
        try:
            yield
        finally:
            connecting.cancel()
            await pool.close()

    # The interactive docs are off unless made public (WEBHOOK_PUBLIC_DOCS): the schema stays in
    # the app (app.openapi()) for tools and tests.
    docs = settings.webhook_public_docs
    app = WebhookApp(title="rag-pipeline webhook", version="1", lifespan=lifespan,
                     description="Receives the crawler's deliveries and stores each one before answering 200.",
                     docs_url="/docs" if docs else None, redoc_url="/redoc" if docs else None,
                     openapi_url="/openapi.json" if docs else None)

    def refused_answer(exc: Refused, note: dict) -> tuple[int, bytes]:
        metrics.refusals.labels(exc.reason).inc()
        note["reason"] = exc.reason
        note["error"] = exc.message
        return exc.status, _json({"error": exc.message, "reason": exc.reason})

    async def deliver(scope, receive, note: dict) -> tuple[int, bytes]:
        """(status, JSON body) for one POST /webhook; every refusal counted and noted for the log."""
        try:
            headers = HeaderIndex(scope["headers"])
            check_token(scope.get("query_string", b""), headers, expected_digest)
            if intake.is_probe(headers):
                counted["probe"].inc()
                note["outcome"] = "probe"
                return 200, _PROBE_ANSWER
            raw = await read_capped(headers, receive, max_body)
            delivery = intake.parse(headers, raw, max_page_bytes=max_page)
            if isinstance(delivery, Probe):
                counted["probe"].inc()
                note["outcome"] = "probe"
                return 200, _PROBE_ANSWER
            note["rid"] = delivery.rid
            if not app.state.ready.is_set():
                raise Refused(503, "database_unavailable", "database unavailable, retry later")
            try:
                async with app.state.pool.connection() as conn:
                    cur = await conn.execute(INSERT_DELIVERY, delivery.row(), prepare=True)
                    stored = await cur.fetchone()
            except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout) as exc:
                # Down, restarting, or the connection cut mid-insert: nothing was acknowledged, and
                # the crawler's re-send is one row however often it comes (rid).
                log.warning("database unavailable: %s", exc)
                raise Refused(503, "database_unavailable", "database unavailable, retry later") from exc
        except Refused as exc:
            return refused_answer(exc, note)
        except ClientGone:
            return refused_answer(Refused(400, "client_disconnected", "client disconnected before its body"), note)
        except Exception:  # noqa: BLE001 - never reached by anything a client can send (the fuzz tests)
            log.exception("unexpected error on POST %s", WEBHOOK_PATH)
            return refused_answer(Refused(500, "internal_error", "internal error"), note)
        if stored:
            counted["stored"].inc()
            note["outcome"] = "stored"
            if delivery.invalid_utf8:
                metrics.invalid_utf8.inc()
                note["invalid_utf8"] = True
            return 200, _STORED_PREFIX + _json(delivery.rid) + b"}"
        counted["duplicate"].inc()
        note["outcome"] = "duplicate"
        return 200, _DUPLICATE_PREFIX + _json(delivery.rid) + b"}"

    async def webhook_asgi(scope, receive, send) -> None:
        start = time.perf_counter()
        note: dict = {}
        status, body = await deliver(scope, receive, note)
        try:
            await send({"type": "http.response.start", "status": status,
                        "headers": [_JSON_HEADERS, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
        finally:
            access.finish(scope, status, time.perf_counter() - start, note)

    app.webhook_asgi = webhook_asgi

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> JSONResponse:
        status, body = refused_answer(exc, request.scope.get(NOTE_KEY, {}))
        return Response(body, status_code=status, media_type="application/json")

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Never reached by anything a client can send (the fuzz tests hold us to that).
        log.exception("unexpected error on %s", request.url.path)
        return await refused(request, Refused(500, "internal_error", "internal error"))

    @app.post(WEBHOOK_PATH, openapi_extra=WEBHOOK_OPENAPI, response_class=JSONResponse)
    async def webhook(request: Request) -> Response:
        """Store one crawler delivery (token checked before the body is read)."""
        # Served by `webhook_asgi` before FastAPI routes anything; declared for the schema, and
        # answering alike should FastAPI ever route here (the app mounted under a prefix).
        status, body = await deliver(request.scope, request.receive, request.scope.get(NOTE_KEY, {}))
        return Response(body, status_code=status, media_type="application/json")

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        """200 when the database answers, else 503. Unauthenticated, so it says up or down only:
        why goes to the log (a database error names its host, port, user and database)."""
        if not app.state.ready.is_set():
            log.warning("healthz: unhealthy: %s", app.state.connect_error or "connecting to the database")
            return JSONResponse({"status": "unhealthy"}, status_code=503)
        try:
            async with app.state.pool.connection(timeout=2) as conn:
                await db.ping_async(conn)
        except Exception as exc:  # noqa: BLE001 - health must answer, whatever broke
            log.warning("healthz: unhealthy: %s", exc)
            return JSONResponse({"status": "unhealthy"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def prometheus_metrics(request: Request) -> Response:
        """Prometheus text format: deliveries by outcome, refusals by reason, latency histogram.
        Behind the webhook token (header or query) unless WEBHOOK_PUBLIC_METRICS."""
        if not settings.webhook_public_metrics:
            try:
                check_token(request.scope.get("query_string", b""), HeaderIndex(request.scope["headers"]), expected_digest)
            except Refused as exc:
                return JSONResponse({"error": exc.message}, status_code=exc.status)
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    app.add_middleware(AccessLog, metrics=metrics, logger=logger, log_all=settings.webhook_access_log)
    app.state.metrics = metrics
    return app

