"""One switch per page, in receipt order: no interleaving can resurrect or regress a page."""

from __future__ import annotations

import gzip
import uuid

from rag_pipeline.embedders.hash_embedder import HashEmbedder
from rag_pipeline.ingest import indexing
from rag_pipeline.ingest.routing import route_batch
from rag_pipeline.store import deliveries
from rag_pipeline.store import db, schema

URL = "https://example.com/doc"
MAX = 10_000_000


def put(conn, text: str, status: int = 200, crawler: int = 200) -> int:
    return deliveries.insert(
        conn, rid=uuid.uuid4().hex, url=URL, pushed_url=None, crawler_status=crawler,
        original_status=status, content_type="text/markdown", body=gzip.compress(text.encode()),
        body_encoding="gzip",
    )


def run_page(conn, embedder, *, steps=("pages", "chunks", "embeddings")):
    out = {}
    if "pages" in steps:
        out["pages"] = indexing.take_newest_delivery(conn, URL, MAX)
    if "chunks" in steps:
        out["chunks"] = indexing.stage_chunks(conn, URL, 512, 64)
    if "embeddings" in steps:
        out["embeddings"] = indexing.embed_and_switch(conn, URL, embedder)
    return out


def live_contents(conn) -> str:
    return " ".join(r[0] for r in conn.execute(
        "SELECT c.content FROM chunks c JOIN pages p USING (page_id) WHERE p.url = %s ORDER BY chunk_index",
        (URL,)).fetchall())


def test_a_404_routed_during_a_run_wins_over_the_run(database_url):
    embedder = HashEmbedder(dimensions=64)
    with db.connection(database_url) as conn:
        conn.autocommit = True
        put(conn, "# Doc\n\nfirst version")
        assert len(route_batch(conn, 100, MAX).queued) == 1
        run_page(conn, embedder, steps=("pages", "chunks"))   # the run is between chunks and embeddings
        put(conn, "gone", status=404)
        routed = route_batch(conn, 100, MAX)
        assert dict(routed.outcomes) == {"deleted": 1}
        result = run_page(conn, embedder, steps=("embeddings",))["embeddings"]
        assert result.status == "tombstoned"
        assert live_contents(conn) == ""
        deleted_at, = conn.execute("SELECT deleted_at FROM pages WHERE url = %s", (URL,)).fetchone()
        assert deleted_at is not None


def test_superseded_when_a_newer_delivery_arrives_before_the_run(database_url):
    embedder = HashEmbedder(dimensions=64)
    with db.connection(database_url) as conn:
        conn.autocommit = True
        first = put(conn, "# Doc\n\nversion one")
        route_batch(conn, 100, MAX)
        second = put(conn, "# Doc\n\nversion two")
        route_batch(conn, 100, MAX)
        out = run_page(conn, embedder)
        assert out["embeddings"].status == "switched"
        assert "version two" in live_contents(conn)
        outcomes = dict(conn.execute("SELECT id, outcome FROM deliveries").fetchall())
        assert outcomes == {first: "superseded", second: "embedded"}
        # A second run for the same page (its own run request) finds nothing left to do.
        again = run_page(conn, embedder)
        assert again["pages"].status == "current"
        assert again["embeddings"].status in ("unchanged", "switched")
        assert "version two" in live_contents(conn)


def test_a_later_200_brings_a_tombstoned_page_back(database_url):
    embedder = HashEmbedder(dimensions=64)
    with db.connection(database_url) as conn:
        conn.autocommit = True
        put(conn, "# Doc\n\nalive")
        route_batch(conn, 100, MAX)
        run_page(conn, embedder)
        put(conn, "gone", status=410)
        route_batch(conn, 100, MAX)
        assert live_contents(conn) == ""
        put(conn, "# Doc\n\nalive")
        assert len(route_batch(conn, 100, MAX).queued) == 1  # same text, but the page was deleted
        assert run_page(conn, embedder)["embeddings"].status == "switched"
        assert "alive" in live_contents(conn)
        assert conn.execute("SELECT deleted_at FROM pages WHERE url = %s", (URL,)).fetchone()[0] is None


def test_crawler_failure_never_touches_the_page(database_url):
    embedder = HashEmbedder(dimensions=64)
    with db.connection(database_url) as conn:
        conn.autocommit = True
        put(conn, "# Doc\n\nstable")
        route_batch(conn, 100, MAX)
        run_page(conn, embedder)
        before = conn.execute("SELECT * FROM pages").fetchall()
        put(conn, "error page", status=404, crawler=503)   # the crawler failed: not a real 404
        put(conn, "server error", status=500)
        routed = route_batch(conn, 100, MAX)
        assert dict(routed.outcomes) == {"skipped": 2}
        assert conn.execute("SELECT * FROM pages").fetchall() == before
        assert "stable" in live_contents(conn)


def _pushed(conn, rid: str, minutes_ago: int) -> None:
    conn.execute("INSERT INTO pushes (url, page_url, reason, crawler, pushed_at, result, rid)"
                 " VALUES (%s, %s, 'schedule', 'crawlbase', now() - make_interval(mins => %s), 'pushed', %s)",
                 (URL, URL, minutes_ago, rid))


def _put_crawl(conn, rid: str, text: str) -> int:
    return deliveries.insert(conn, rid=rid, url=URL, pushed_url=None, crawler_status=200, original_status=200,
                             content_type="text/markdown", body=gzip.compress(text.encode()),
                             body_encoding="gzip")


def test_a_late_redelivery_of_an_older_crawl_is_superseded_by_the_newer_crawl(database_url):
    schema.prepare(database_url)
    embedder = HashEmbedder(dimensions=32)
    with db.connection(database_url) as conn:
        _pushed(conn, "crawl-old", minutes_ago=10)
        _pushed(conn, "crawl-new", minutes_ago=5)
        # The newer crawl arrives first and is applied; the crawler then delivers the older one late.
        _put_crawl(conn, "crawl-new", "# Doc\n\nThe newest text.")
        route_batch(conn, 10, MAX)
        run_page(conn, embedder)
        _put_crawl(conn, "crawl-old", "# Doc\n\nAn older text.")
        route_batch(conn, 10, MAX)
        rows = dict(conn.execute("SELECT rid, outcome FROM deliveries").fetchall())
        assert rows == {"crawl-new": "embedded", "crawl-old": "superseded"}
        assert "older than one already routed" in conn.execute(
            "SELECT error FROM deliveries WHERE rid = 'crawl-old'").fetchone()[0]
        assert "newest text" in live_contents(conn) and "older" not in live_contents(conn)
        # Both waiting at once, the older crawl received last: still the newer one is applied.
        _pushed(conn, "crawl-3", minutes_ago=2)
        _pushed(conn, "crawl-4", minutes_ago=1)
        _put_crawl(conn, "crawl-4", "# Doc\n\nThe text of crawl four.")
        _put_crawl(conn, "crawl-3", "# Doc\n\nThe text of crawl three.")
        route_batch(conn, 10, MAX)
        run_page(conn, embedder)
        rows = dict(conn.execute("SELECT rid, outcome FROM deliveries").fetchall())
        assert rows["crawl-4"] == "embedded" and rows["crawl-3"] == "superseded"
        assert "crawl four" in live_contents(conn)
        # A crawl we did not push (no rid of ours) counts from its receipt: newer than both.
        _put_crawl(conn, "manual", "# Doc\n\nA manual crawl.")
        route_batch(conn, 10, MAX)
        run_page(conn, embedder)
        assert "manual crawl" in live_contents(conn)
