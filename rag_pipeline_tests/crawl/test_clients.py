"""The Crawlbase client against the simulator, and the local crawler against a site and our receiver."""

from __future__ import annotations

import time

import pytest

from rag_pipeline.crawl.base import PushError
from rag_pipeline.crawl.crawlbase import CrawlbaseCrawler
from rag_pipeline.core.addresses import parse_networks
from rag_pipeline.crawl.local_crawler import LocalCrawler
from rag_pipeline.crawl.simulator import Faults
from rag_pipeline_tests.crawl.conftest import CB_TOKEN, CRAWLER_NAME, make_sim

LOOPBACK = parse_networks("127.0.0.0/8")
from rag_pipeline_tests.waiting import wait_until


def deliveries(conn):
    return conn.execute(
        "SELECT rid, url, pushed_url, crawler_status, original_status FROM deliveries ORDER BY id"
    ).fetchall()


def client(sim, **kw) -> CrawlbaseCrawler:
    return CrawlbaseCrawler(token=CB_TOKEN, crawler_name=CRAWLER_NAME, api_url=sim.api_url,
                            backoff_s=0.01, **kw)


def test_crawlbase_push_delivers_with_callback_headers(gate, site, conn, crawl_env):
    site.set_page("/a", "<html><head><title>A</title></head><body><h1>Alpha</h1><p>first</p></body></html>")
    sim = make_sim(gate.webhook_url, crawl_env)
    try:
        pushed = client(sim).push(site.url("/a"), push_id=41)
        assert len(pushed.rid) == 24 and pushed.attempts == 1
        assert sim.wait_idle(10)
    finally:
        sim.stop()
    rid, url, pushed_url, crawler_status, original_status = deliveries(conn)[0]
    assert (rid, url, pushed_url, crawler_status, original_status) == (
        pushed.rid, site.url("/a"), site.url("/a"), 200, 200)
    health = client(sim).health()  # the simulator is stopped: unreadable, not a crash
    assert health.status == "unknown" and "stats unreadable" in health.error


def test_crawlbase_retries_429_and_5xx_then_gives_up_and_refuses_bad_tokens(gate, site, crawl_env):
    sim = make_sim(gate.webhook_url, crawl_env, faults=Faults(push_error_rate=1.0, push_error_status=429))
    try:
        with pytest.raises(PushError) as failure:
            client(sim, max_retries=3).push(site.url("/a"))
        assert failure.value.attempts == 4 and "429" in str(failure.value)
        sim.faults = Faults(push_error_rate=0.5, push_error_status=503)
        rids = {client(sim, max_retries=8).push(site.url(f"/p{i}")).rid for i in range(10)}
        assert len(rids) == 10
        bad = CrawlbaseCrawler(token="wrong", crawler_name=CRAWLER_NAME, api_url=sim.api_url, backoff_s=0.01)
        with pytest.raises(PushError) as refused:
            bad.push(site.url("/a"))
        assert refused.value.status == 401 and refused.value.attempts == 1
        health = client(sim).health()
        assert health.status == "active"
    finally:
        sim.stop()


def test_crawlbase_push_rate_is_limited(gate, site, crawl_env):
    sim = make_sim(gate.webhook_url, crawl_env)
    try:
        crawler = client(sim, rate=40)
        started = time.monotonic()
        for i in range(60):  # a burst of 40, then 20 more at 40/s: at least 0.5 s
            crawler.push(site.url(f"/r{i}"))
        assert time.monotonic() - started >= 0.45
    finally:
        sim.stop()


def test_local_crawler_fetches_converts_follows_redirects_and_retries_delivery(gate, site, conn):
    site.set_page("/doc", "<html><body><nav>x</nav><main><h1>Guide</h1><p>Hello <b>world</b></p>"
                          "<script>alert(1)</script></main></body></html>")
    site.redirect("/old", "/doc")
    site.remove("/gone", status=410)
    crawler = LocalCrawler(callback_url=gate.webhook_url, user_agent="rag-test/1", per_host=1, allowed_networks=LOOPBACK,
                           delivery_backoff_s=0.05, delivery_retries=6)
    try:
        gate.down.set()
        a = crawler.push(site.url("/doc"), push_id=1)
        wait_until(lambda: gate.refused >= 1, 20, "the receiver refusing a delivery while down")
        gate.down.clear()  # the receiver comes back: the same rid is delivered
        b = crawler.push(site.url("/old"), push_id=2)
        c = crawler.push(site.url("/gone"), push_id=3)
        assert crawler.drain(20) == 0
    finally:
        crawler.close()
    assert gate.refused >= 1
    rows = {r[0]: r[1:] for r in deliveries(conn)}
    assert rows[a.rid] == (site.url("/doc"), site.url("/doc"), 200, 200)
    assert rows[b.rid] == (site.url("/doc"), site.url("/old"), 200, 200)
    assert rows[c.rid] == (site.url("/gone"), site.url("/gone"), 200, 410)
    import gzip
    body = gzip.decompress(conn.execute("SELECT body FROM deliveries WHERE rid = %s", (a.rid,)).fetchone()[0])
    assert body.decode().startswith("# Guide") and "**world**" in body.decode() and "alert" not in body.decode()
    assert site.hits["/doc"] == 2


def test_concurrent_pushes_each_get_their_own_rid(gate, site, crawl_env):
    """One client serves every push thread: each push must still get its own answer's rid."""
    from concurrent.futures import ThreadPoolExecutor

    sim = make_sim(gate.webhook_url, crawl_env)
    try:
        crawler = client(sim, rate=1000)
        urls = [site.url(f"/c{i}") for i in range(80)]
        with ThreadPoolExecutor(8) as pool:
            rids = list(pool.map(lambda u: crawler.push(u).rid, urls))
        assert len(set(rids)) == 80
        assert {sim.ledger.pushes[r] for r in rids} == set(urls)
        assert all(sim.ledger.pushes[r] == u for r, u in zip(rids, urls))
    finally:
        sim.stop()


def test_local_crawler_is_polite_per_host_and_times_out(gate, site, conn):
    for i in range(6):
        site.set_page(f"/slow{i}", f"<h1>Slow {i}</h1><p>text</p>", delay_s=0.15)
    site.set_page("/stuck", "<h1>Stuck</h1>", delay_s=3)
    crawler = LocalCrawler(callback_url=gate.webhook_url, user_agent="rag-test/1", per_host=2, workers=8, allowed_networks=LOOPBACK,
                           timeout_s=1.0)
    try:
        rids = [crawler.push(site.url(f"/slow{i}")).rid for i in range(6)]
        assert crawler.drain(10) == 0
        assert site.max_in_flight == 2      # 8 workers, but at most 2 requests to one host at a time
        stuck = crawler.push(site.url("/stuck")).rid
        assert crawler.drain(10) == 0
    finally:
        crawler.close()
    rows = {r[0]: r[3:] for r in deliveries(conn)}
    assert all(rows[r] == (200, 200) for r in rids)
    assert rows[stuck] == (520, None)       # a timeout is a crawler failure: recorded, never a delete


def test_simulator_injects_404_410_and_redirects(gate, site, conn, crawl_env):
    site.set_page("/a", "<h1>A</h1><p>alpha</p>")
    site.set_page("/b", "<h1>B</h1><p>beta</p>")
    sim = make_sim(gate.webhook_url, crawl_env, faults=Faults(
        gone={site.url("/a"): 410}, redirects={site.url("/old"): site.url("/b")}))
    try:
        gone = client(sim).push(site.url("/a")).rid
        moved = client(sim).push(site.url("/old")).rid
        assert sim.wait_idle(10)
    finally:
        sim.stop()
    rows = {r[0]: r[1:] for r in deliveries(conn)}
    assert rows[gone] == (site.url("/a"), site.url("/a"), 200, 410)
    assert rows[moved] == (site.url("/b"), site.url("/old"), 200, 200)
    assert site.hits["/a"] == 0 and site.hits["/b"] == 1
