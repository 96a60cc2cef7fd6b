"""The crawler's webhook: authenticate, validate, store one row, answer 200. Nothing else.

A delivery answered 200 is in the `deliveries` table (the INSERT commits before the answer);
a refused one stores nothing. Embedding happens later, in Dagster, never in the request.
"""

from __future__ import annotations

import hmac
import logging
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from psycopg_pool import AsyncConnectionPool

from rag_pipeline.core.bodies import BodyError, gunzip_capped, is_gzip
from rag_pipeline.core.delivery import Verdict, classify, parse_status
from rag_pipeline.settings import Settings, get_settings
from rag_pipeline.store import db
from rag_pipeline.store.deliveries import INSERT_DELIVERY

log = logging.getLogger("webhook_sensor")

PROBE_USER_AGENT = "Crawlbase Monitoring Bot"
PROBE_RID = "dummyrequest"
TOKEN_HEADER = "x-webhook-token"
# Crawlbase spells its headers either way; the CB form wins over PC, hyphens over underscores.
CRAWLER_STATUS_HEADERS = ("cb-status", "cb_status", "pc-status", "pc_status")
ORIGINAL_STATUS_HEADERS = ("original-status", "original_status")
PUSHED_URL_HEADERS = ("pushed-url", "pushed_url")


class Refused(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


def first_header(request: Request, names: tuple[str, ...]) -> str | None:
    for name in names:
        value = request.headers.get(name)
        if value is not None and value.strip():
            return value.strip()
    return None


def check_token(request: Request, expected: str | None) -> None:
    if expected is None:
        return
    given = request.query_params.get("token") or request.headers.get(TOKEN_HEADER) or ""
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise Refused(401, "missing or wrong token")


async def read_capped(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise Refused(413, f"body exceeds {limit} bytes")
    chunks, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise Refused(413, f"body exceeds {limit} bytes")
        chunks.append(part)
    return b"".join(chunks)


def parse_delivery(request: Request, raw: bytes, settings: Settings) -> dict:
    rid = first_header(request, ("rid",))
    if not rid:
        raise Refused(400, "missing rid header")
    url = first_header(request, ("url",))
    if not url:
        raise Refused(400, "missing url header")
    if urlsplit(url).scheme.lower() not in ("http", "https") or not urlsplit(url).netloc:
        raise Refused(400, "url header is not an http(s) URL")
    try:
        crawler_status = parse_status(first_header(request, CRAWLER_STATUS_HEADERS))
        original_status = parse_status(first_header(request, ORIGINAL_STATUS_HEADERS))
    except ValueError as exc:
        raise Refused(400, f"bad status header: {exc}") from exc

    gzipped = is_gzip(raw, request.headers.get("content-encoding"))
    if gzipped:
        try:
            page = gunzip_capped(raw, settings.webhook_max_page_bytes)
        except BodyError as exc:
            raise Refused(413 if exc.too_large else 400, exc.reason) from exc
    else:
        page = raw
    if not page.strip() and classify(crawler_status, original_status) is Verdict.CONTENT:
        raise Refused(400, "empty body for a successful crawl")
    return {
        "rid": rid,
        "url": url,
        "pushed_url": first_header(request, PUSHED_URL_HEADERS),
        "crawler_status": crawler_status,
        "original_status": original_status,
        "content_type": request.headers.get("content-type"),
        "body": raw,  # stored as received (compressed) once validated: cheap to write
        "body_encoding": "gzip" if gzipped else "identity",
    }


def create_app(settings: Settings | None = None, database_url: str | None = None) -> FastAPI:
    settings = settings or get_settings()
    token = settings.webhook_token
    if not token and not settings.webhook_allow_no_token:
        raise RuntimeError("WEBHOOK_TOKEN is not set (set WEBHOOK_ALLOW_NO_TOKEN=1 to run without one)")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        url = database_url or db.server_url(settings)
        db.prepare(url)
        pool = AsyncConnectionPool(url, min_size=2, max_size=8, open=False, kwargs={"autocommit": True})
        await pool.open(wait=True)
        app.state.pool = pool
        try:
            yield
        finally:
            await pool.close()

    app = FastAPI(title="rag-pipeline webhook", lifespan=lifespan)

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> JSONResponse:
        log.warning("refused %s: %s", exc.status, exc.reason)
        return JSONResponse({"error": exc.reason}, status_code=exc.status)

    @app.post("/webhook")
    async def webhook(request: Request) -> JSONResponse:
        check_token(request, token)  # before the body is read or decompressed
        agent = request.headers.get("user-agent", "")
        if agent.startswith(PROBE_USER_AGENT) or request.headers.get("rid") == PROBE_RID:
            return JSONResponse({"status": "ignored", "reason": "monitoring probe"})
        raw = await read_capped(request, settings.webhook_max_body_bytes)
        row = parse_delivery(request, raw, settings)
        async with app.state.pool.connection() as conn:
            cur = await conn.execute(INSERT_DELIVERY, row)
            stored = await cur.fetchone()
        return JSONResponse({"status": "stored" if stored else "duplicate", "rid": row["rid"]})

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        try:
            async with app.state.pool.connection(timeout=2) as conn:
                await conn.execute("SELECT 1")
        except Exception as exc:  # noqa: BLE001 - health must answer, whatever broke
            return JSONResponse({"status": "unhealthy", "error": str(exc)}, status_code=503)
        return JSONResponse({"status": "ok"})

    return app
