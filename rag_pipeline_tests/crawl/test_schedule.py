"""The recrawl queue: cadence defaults for delivery-discovered pages, `cadence set`, leases."""

from datetime import timedelta

from rag_pipeline.core.urls import page_id
from rag_pipeline.crawl.cadence import load_rules
from rag_pipeline.store import db, pages, schedule

PRICING = "https://shop.example.com/pricing"
DOCS = "https://example.com/docs/install"


def row(conn, url):
    return conn.execute("SELECT recrawl_every, cadence_source, next_crawl_at - coalesce(last_crawled_at,"
                        " first_seen_at) FROM pages WHERE url = %s", (url,)).fetchone()


def test_delivery_discovered_pages_get_their_pattern_cadence_once(database_url):
    rules = load_rules()
    with db.connection(database_url) as conn:
        conn.autocommit = True
        for url in (PRICING, DOCS):
            pages.ensure(conn, page_id(url), url)       # what routing does for a new page
        assert schedule.assign_defaults(conn, rules.every_for, limit=1) == 1   # bounded
        assert schedule.assign_defaults(conn, rules.every_for, limit=10) == 1
        assert schedule.assign_defaults(conn, rules.every_for, limit=10) == 0
        assert row(conn, PRICING) == (timedelta(hours=1), "default", timedelta(hours=1))
        assert row(conn, DOCS) == (timedelta(days=7), "default", timedelta(days=7))


def test_cadence_set_and_leases(database_url):
    with db.connection(database_url) as conn:
        conn.autocommit = True
        schedule.register(conn, PRICING, PRICING, timedelta(hours=1), explicit=True)
        conn.execute("UPDATE pages SET last_crawled_at = now() - interval '2 hours'")
        schedule.set_cadence(conn, PRICING, PRICING, timedelta(hours=6))
        assert row(conn, PRICING) == (timedelta(hours=6), "manual", timedelta(hours=6))
        # A pattern default never overrides a hand-set cadence; an explicit seed does.
        schedule.register(conn, PRICING, PRICING, timedelta(hours=1), explicit=False)
        assert row(conn, PRICING)[:2] == (timedelta(hours=6), "manual")
        # Due now (seeding makes it due): claimed once, then leased.
        assert [t.crawl_url for t in schedule.claim_due(conn, 10, timedelta(minutes=10))] == [PRICING]
        assert schedule.claim_due(conn, 10, timedelta(minutes=10)) == []
        schedule.after_push(conn, [PRICING], [], tombstone_recheck=timedelta(days=30),
                            retry_after=timedelta(minutes=5))
        left, = conn.execute("SELECT next_crawl_at - now() FROM pages").fetchone()
        assert timedelta(hours=5, minutes=59) < left <= timedelta(hours=6)
        schedule.after_push(conn, [], [PRICING], tombstone_recheck=timedelta(days=30),
                            retry_after=timedelta(minutes=5))
        left, = conn.execute("SELECT next_crawl_at - now() FROM pages").fetchone()
        assert left <= timedelta(minutes=5)
