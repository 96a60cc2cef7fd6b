"""Pages into a benchmark's database through the project's own path: stored as deliveries,
routed, and applied by `apply_batch` (the HNSW index built incrementally, as in production)."""

from __future__ import annotations

import gzip
import time
import uuid
from collections.abc import Iterable

from rag_pipeline.ingest import batch_apply as batch_apply
from rag_pipeline.ingest.routing import route_batch
from rag_pipeline.store import db, deliveries
import os

# This bench plays the crawler: its deliveries answer no push recorded here (docs/security.md).
os.environ.setdefault("WEBHOOK_ACCEPT_UNSOLICITED", "true")

MAX_PAGE_BYTES = 50_000_000


def apply_pages(url: str, pages: Iterable[tuple[str, str]], embedder, budget, *,
                per_batch: int, report_every: int) -> int:
    """(page URL, markdown) pairs applied ``per_batch`` at a time; returns the chunks indexed."""
    started = time.perf_counter()
    items = list(pages)
    with db.connection(url) as conn:
        for first in range(0, len(items), per_batch):
            with conn.transaction():
                for page_url, markdown in items[first:first + per_batch]:
                    deliveries.insert(conn, rid=uuid.uuid4().hex, url=page_url, pushed_url=None, crawler_status=200,
                                      original_status=200, content_type="text/markdown",
                                      body=gzip.compress(markdown.encode()), body_encoding="gzip")
            route_batch(conn, per_batch, MAX_PAGE_BYTES)
            work = deliveries.queued_work(conn, per_batch)
            events = list(batch_apply.apply_batch(
                conn, work, batch_key=None, embedder_for=lambda _space: embedder,
                chunk_budget=lambda _space: budget, max_page_bytes=MAX_PAGE_BYTES,
                retry=batch_apply.RetryPolicy(3, 1.0)))
            failed = [e for e in events if isinstance(e, batch_apply.Failed)]
            if failed:
                raise SystemExit(f"loading failed: {failed[0].failure.reason}")
            done = min(len(items), first + per_batch)
            if done % report_every < per_batch or done == len(items):
                print(f"  {done:,} pages applied ({time.perf_counter() - started:.0f} s)", flush=True)
        conn.execute("ANALYZE")
        return conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
