"""Redirects in routing: indexed once under the delivered URL; the pushed URL becomes an alias."""

from __future__ import annotations

import gzip
import uuid
from datetime import timedelta

from rag_pipeline.embedders.hash_embedder import HashEmbedder
from rag_pipeline.ingest import indexing
from rag_pipeline.ingest.routing import route_batch
from rag_pipeline.store import db, deliveries, pushes, schedule

OLD = "https://example.com/old"
NEW = "https://example.com/new"
MAX = 10_000_000


def put(conn, url, text, *, pushed_url=None, status=200, rid=None) -> str:
    rid = rid or uuid.uuid4().hex
    deliveries.insert(conn, rid=rid, url=url, pushed_url=pushed_url, crawler_status=200,
                      original_status=status, content_type="text/markdown",
                      body=gzip.compress(text.encode()), body_encoding="gzip")
    return rid


def index(conn, url):
    indexing.take_newest_delivery(conn, url, MAX)
    indexing.stage_chunks(conn, url, 512, 64)
    indexing.embed_and_switch(conn, url, HashEmbedder(dimensions=64))


def live_chunks(conn, url) -> int:
    return conn.execute("SELECT count(*) FROM chunks c JOIN pages p USING (page_id) WHERE p.url = %s",
                        (url,)).fetchone()[0]


def page(conn, url):
    return conn.execute("SELECT alias_of, redirected_at, next_crawl_at, recrawl_every, deleted_at"
                        " FROM pages WHERE url = %s", (url,)).fetchone()


def test_redirect_makes_the_pushed_url_an_alias_and_indexes_once(database_url):
    with db.connection(database_url) as conn:
        conn.autocommit = True
        # OLD was seeded hourly and indexed under its own URL.
        schedule.register(conn, OLD, OLD, timedelta(hours=1), explicit=True)
        put(conn, OLD, "# Old\n\nthe page before it moved", pushed_url=OLD)
        assert [q.page_url for q in route_batch(conn, 10, MAX).queued] == [OLD]
        index(conn, OLD)
        assert live_chunks(conn, OLD) == 1

        # Now OLD redirects to NEW: the delivery names NEW, the pushed-url header OLD.
        put(conn, NEW, "# New\n\nthe page after it moved", pushed_url=OLD)
        routed = route_batch(conn, 10, MAX)
        assert [q.page_url for q in routed.queued] == [NEW]
        index(conn, NEW)
        alias_of, redirected_at, next_crawl_at, _, _ = page(conn, OLD)
        assert alias_of == NEW and redirected_at is not None and next_crawl_at is None
        assert live_chunks(conn, OLD) == 0 and live_chunks(conn, NEW) == 1
        # NEW inherits OLD's cadence and is scheduled; OLD is never claimed again.
        assert page(conn, NEW)[3] == timedelta(hours=1) and page(conn, NEW)[2] is not None
        conn.execute("UPDATE pages SET next_crawl_at = now() - interval '1 s'")
        assert [t.page_url for t in schedule.claim_due(conn, 10, timedelta(minutes=5))] == [NEW]
        # Re-seeding OLD does not push it: it is an alias.
        assert schedule.register(conn, OLD, OLD, timedelta(hours=1), explicit=True).alias_of == NEW

        # The same redirect again: unchanged, nothing indexed twice.
        put(conn, NEW, "# New\n\nthe page after it moved", pushed_url=OLD)
        assert dict(route_batch(conn, 10, MAX).outcomes) == {"unchanged": 1}
        assert conn.execute("SELECT count(*) FROM chunks").fetchone()[0] == 1

        # The redirect is removed: OLD answers as itself and is a page again.
        put(conn, OLD, "# Old\n\nback again", pushed_url=OLD)
        assert [q.page_url for q in route_batch(conn, 10, MAX).queued] == [OLD]
        assert page(conn, OLD)[0] is None and page(conn, OLD)[2] is not None


def test_pushed_url_known_from_the_push_record_when_the_header_is_missing(database_url):
    with db.connection(database_url) as conn:
        conn.autocommit = True
        [push_id] = pushes.begin(conn, [(OLD, OLD)], reason="seed", crawler="crawlbase", run_id=None)
        pushes.finish(conn, [pushes.Outcome(push_id, "rid-1", 1)])
        put(conn, NEW, "# New\n\nmoved", rid="rid-1")
        route_batch(conn, 10, MAX)
        assert page(conn, OLD)[0] == NEW


def test_a_redirect_to_a_gone_page_tombstones_the_target_and_aliases_the_source(database_url):
    with db.connection(database_url) as conn:
        conn.autocommit = True
        put(conn, NEW, "gone", pushed_url=OLD, status=404)
        assert dict(route_batch(conn, 10, MAX).outcomes) == {"deleted": 1}
        assert page(conn, OLD)[0] == NEW and page(conn, NEW)[4] is not None


def test_overdue_pages_ignore_aliases_and_tombstones(database_url):
    with db.connection(database_url) as conn:
        conn.autocommit = True
        for url in (OLD, NEW, "https://example.com/gone", "https://example.com/fresh"):
            schedule.register(conn, url, url, timedelta(hours=1), explicit=True)
        conn.execute("UPDATE pages SET last_crawled_at = now() - interval '3 hours'"
                     " WHERE url <> 'https://example.com/fresh'")
        conn.execute("UPDATE pages SET alias_of = %s WHERE url = %s", (NEW, OLD))
        conn.execute("UPDATE pages SET deleted_at = now() WHERE url = 'https://example.com/gone'")
        assert schedule.overdue(conn) == (1, [NEW])
