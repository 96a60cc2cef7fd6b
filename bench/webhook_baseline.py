"""The bench's yardstick: a minimal FastAPI + async psycopg receiver that does nothing but one
INSERT of the same row (no token, no validation, no metrics, no logs). Not a benchmark itself:
`bench/webhook_load.py` serves it with uvicorn (`webhook_baseline:app`) beside the real receiver."""

import os

if __name__ == "__main__":  # `make bench` runs every bench/*.py: this one is only served
    raise SystemExit(0)

from contextlib import asynccontextmanager  # noqa: E402

from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from psycopg_pool import AsyncConnectionPool  # noqa: E402

INSERT = """
INSERT INTO deliveries (rid, url, pushed_url, crawler_status, original_status, content_type, body, body_encoding)
VALUES (%s, %s, NULL, %s, %s, %s, %s, 'gzip') ON CONFLICT (rid) DO NOTHING RETURNING id
"""


@asynccontextmanager
async def lifespan(app: FastAPI):
    size = int(os.environ.get("WEBHOOK_POOL_SIZE", "4"))
    async with AsyncConnectionPool(os.environ["DATABASE_URL"], min_size=size, max_size=size,
                                   kwargs={"autocommit": True}) as pool:
        app.state.pool = pool
        yield


app = FastAPI(lifespan=lifespan)


@app.post("/webhook")
async def webhook(request: Request) -> JSONResponse:
    body = await request.body()
    h = request.headers
    async with app.state.pool.connection() as conn:
        cur = await conn.execute(INSERT, (h.get("rid"), h.get("url"), int(h.get("cb-status", "200")),
                                          int(h.get("original-status", "200")), h.get("content-type"), body),
                                 prepare=True)
        stored = await cur.fetchone()
    return JSONResponse({"status": "stored" if stored else "duplicate"})
