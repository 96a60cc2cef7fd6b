"""Crawler health outcomes: what fails, how loudly, and what the description tells the operator."""

from rag_pipeline.crawl.base import CrawlerHealth
from rag_pipeline.crawl.crawlbase import parse_stats
from rag_pipeline.crawl.crawler_health import (CRAWLER_NOT_PAUSED, CRAWLER_QUEUE_NOT_GROWING, NO_PAGE_OVERDUE,
                                       PUSHES_DELIVERED, evaluate)
from rag_pipeline.store.pushes import Undelivered

NONE = Undelivered(0, [])


def run(health, *, undelivered=NONE, failed=(), history=(), overdue=(0, [])):
    out = evaluate("crawlbase", health, undelivered, list(failed), waiting_history=list(history),
                   waiting_max=1000, delivery_timeout_s=3600, overdue=overdue)
    return {o.check_name: o for o in out}


def test_all_green():
    checks = run(CrawlerHealth("active", waiting=3))
    assert all(o.passed for o in checks.values()) and len(checks) == 4


def test_queue_over_the_limit_or_rising_on_every_reading():
    over = run(CrawlerHealth("active", waiting=5000))[CRAWLER_QUEUE_NOT_GROWING]
    assert not over.passed and not over.warn and "CRAWLER_WAITING_MAX" in over.description
    rising = run(CrawlerHealth("active", waiting=50), history=[10, 20, 30, 40])[CRAWLER_QUEUE_NOT_GROWING]
    assert not rising.passed and rising.warn and "10 → 20 → 30 → 40 → 50" in rising.description
    wobbling = run(CrawlerHealth("active", waiting=50), history=[10, 20, 15, 40])[CRAWLER_QUEUE_NOT_GROWING]
    assert wobbling.passed


def test_paused_unknown_undelivered_refused_overdue():
    assert "PAUSED" in run(CrawlerHealth("paused"))[CRAWLER_NOT_PAUSED].description
    unknown = run(CrawlerHealth("unknown", error="HTTP 401"))[CRAWLER_NOT_PAUSED]
    assert not unknown.passed and unknown.warn and "HTTP 401" in unknown.description
    missing = run(CrawlerHealth("active"), undelivered=Undelivered(2, [(7, "https://a", "rid7")]))
    assert not missing[PUSHES_DELIVERED].passed and "push 7 https://a (rid rid7)" in missing[PUSHES_DELIVERED].description
    refused = run(CrawlerHealth("active"), failed=[(9, "https://b", "HTTP 401")])[PUSHES_DELIVERED]
    assert not refused.passed and refused.warn and "HTTP 401" in refused.description
    late = run(CrawlerHealth("active"), overdue=(3, ["https://c"]))[NO_PAGE_OVERDUE]
    assert not late.passed and "3 live page(s)" in late.description


def test_stats_are_read_tolerantly():
    assert parse_stats({"crawlers": [{"name": "x", "status": "paused", "waiting": 4}]}, "x").status == "paused"
    found = parse_stats({"x": {"state": "running", "waiting_queue": {"count": 9}, "retry_queue": 2}}, "x")
    assert (found.status, found.waiting, found.retrying) == ("active", 9, 2)
    assert parse_stats({"crawlers": []}, "x").status == "unknown"
