"""A page robots.txt disallows (issue 42 point 8): recorded as such, out of the recrawl queue until
robots.txt is read again, back in it once robots.txt allows it, and counted apart by `site show`
and `status`. Whoever finds it: the local crawler refusing its push, or a reading of its site
(which is what covers Crawlbase, which does not read robots.txt).

Real PostgreSQL, the real receiver and loopback sites, as test_robots_crawler and test_site_cli.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import psycopg
from click.testing import CliRunner

from rag_pipeline.cli import main as cli
from rag_pipeline.core.addresses import parse_networks
from rag_pipeline.core.site_spec import SiteSpec
from rag_pipeline.crawl import discovery
from rag_pipeline.crawl.discovery import read_site
from rag_pipeline.crawl.guarded_http import guarded_client
from rag_pipeline.crawl.local_crawler import LocalCrawler
from rag_pipeline.crawl.loopback_site import LoopbackSite
from rag_pipeline.crawl.pushing import push_targets
from rag_pipeline.crawl.robots_cache import RobotsCache
from rag_pipeline.settings import get_settings
from rag_pipeline.store import schedule
from rag_pipeline.store import sites as sites_store
from rag_pipeline_tests.harness import TOKEN

SAMPLE_SITE = Path(__file__).resolve().parents[2] / "samples" / "site"
ALLOWED = parse_networks("127.0.0.0/8")
AGENT = "rag-test/1"
RULE = "robots.txt: Disallow: /drafts/ (group for '*')"
LEASE = timedelta(minutes=10)


def robots(site: LoopbackSite, text: str) -> None:
    site.set_raw("/robots.txt", text.encode(), content_type="text/plain")


def crawler(receiver: str, **kw) -> LocalCrawler:
    return LocalCrawler(callback_url=f"{receiver}/webhook?token={TOKEN}", user_agent=AGENT,
                        allowed_networks=ALLOWED, **kw)


def push_due(conn, local: LocalCrawler):
    """What recrawl_sensor and the push job do: claim the due pages, push them."""
    try:
        return push_targets(conn, local, schedule.claim_due(conn, 100, LEASE), reason="schedule",
                            drain_timeout_s=30)
    finally:
        local.close()


def page(conn, crawl_url: str) -> dict:
    row = conn.execute(
        "SELECT disallowed_rule, disallowed_at IS NOT NULL, extract(epoch FROM next_crawl_at - now()),"
        " last_crawled_at IS NOT NULL FROM pages WHERE crawl_url = %s", (crawl_url,)).fetchone()
    return dict(zip(("rule", "marked", "due_in_s", "crawled"), row))


def test_the_local_crawler_s_refusal_takes_the_page_out_of_the_queue_until_robots_txt_allows_it(
        receiver, conn):
    with LoopbackSite() as site:
        robots(site, "User-agent: *\nDisallow: /drafts/\n")
        site.set_page("/drafts/plan", "<h1>Plan</h1><p>Not for crawlers yet.</p>")
        url = site.url("/drafts/plan")
        with conn.transaction():     # seeded every 2 minutes: the hold is robots.txt's TTL, not that
            schedule.register(conn, url, url, timedelta(minutes=2), explicit=True)

        report = push_due(conn, crawler(receiver, robots_ttl_s=600))
        assert (report.pushed, report.failed, report.disallowed) == (0, 0, 1)
        assert report.errors == [] and report.disallowed_urls == [f"{url}: {RULE}"]
        # The push says why, and is no crawler failure; the page says so and waits for the TTL.
        assert conn.execute("SELECT result, error FROM pushes").fetchall() == [("disallowed", RULE)]
        state = page(conn, url)
        assert state["rule"] == RULE and state["marked"] and not state["crawled"]
        assert 590 <= state["due_in_s"] <= 600
        assert schedule.claim_due(conn, 100, LEASE) == []      # not pushed and refused every 5 minutes
        assert site.hits["/drafts/plan"] == 0
        # Held on purpose, so no_page_overdue does not count it, however long it has waited.
        conn.execute("UPDATE pages SET first_seen_at = now() - interval '1 day'")
        assert schedule.overdue(conn) == (0, [])

        # Its hold is over and robots.txt, read again, allows it: crawled, and no longer marked.
        robots(site, "User-agent: *\nAllow: /\n")
        conn.execute("UPDATE pages SET next_crawl_at = now()")
        report = push_due(conn, crawler(receiver, robots_ttl_s=600))
        assert (report.pushed, report.failed, report.disallowed) == (1, 0, 0)
        assert site.hits["/drafts/plan"] == 1
    state = page(conn, url)
    assert state["rule"] is None and not state["marked"] and state["due_in_s"] > 60
    assert {r for r, in conn.execute("SELECT result FROM pushes")} == {"disallowed", "pushed"}


def read(conn, spec: SiteSpec):
    with guarded_client(allowed=ALLOWED, user_agent=AGENT, timeout_s=5) as client:
        rules = RobotsCache(client, agent=AGENT, ttl_s=0.001, deadline_s=5)
        return read_site(conn, client, spec, robots_for=rules.rules_for, agent=AGENT,
                         every_for=lambda url: timedelta(days=1), allowed=ALLOWED, deadline_s=3)


def test_a_reading_marks_the_site_s_pages_robots_txt_disallows_whatever_crawls_them(conn):
    """No crawler is involved: a page seeded with `rag-pipeline seed` (which reads no robots.txt)
    into a site whose crawler is Crawlbase is marked by the site's reading, and released by it."""
    with LoopbackSite() as site:
        robots(site, "User-agent: *\nDisallow: /drafts/\n")
        site.set_raw("/sitemap.xml", (
            '<?xml version="1.0" encoding="UTF-8"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            f"<url><loc>{site.url('/a')}</loc></url></urlset>").encode())
        spec = SiteSpec(name="docs", sitemaps=(site.url("/sitemap.xml"),), robots_sitemaps=False,
                        crawler="crawlbase", discover_every=timedelta(hours=1))
        with conn.transaction():
            sites_store.sync_declared(conn, [spec])
        drafts = site.url("/drafts/plan")
        with conn.transaction():
            schedule.register(conn, drafts, drafts.replace("http://", "https://"), timedelta(minutes=30),
                              explicit=True, site="docs", shard=None)

        result = read(conn, spec)
        assert result.complete, result.errors
        assert (result.counts["pages_disallowed"], result.counts["allowed_again"]) == (1, 0)
        state = page(conn, drafts)
        assert state["rule"] == RULE and state["marked"]
        # Held past the next reading (in an hour), which looks again: never due in between.
        assert state["due_in_s"] >= 2 * 3600 - 60
        assert [t.crawl_url for t in schedule.claim_due(conn, 100, LEASE)] == [site.url("/a")]
        # The page the sitemap lists left as it was: no longer listed is not what happened here.
        assert result.counts["gone"] == 0
        (row,) = [r for r in sites_store.overview(conn) if r["site"] == "docs"]
        assert (row["disallowed"], row["never_crawled"], row["due"]) == (1, 1, 0)

        robots(site, "User-agent: *\nAllow: /\n")
        result = read(conn, spec)
        assert (result.counts["pages_disallowed"], result.counts["allowed_again"]) == (0, 1)
    state = page(conn, drafts)
    assert state["rule"] is None and not state["marked"] and state["due_in_s"] <= 0


def _env(monkeypatch, database_url, site_url: str, webhook_url: str) -> None:
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("SAMPLE_SITE_URL", site_url)
    monkeypatch.setenv("CRAWLER", "local")
    monkeypatch.setenv("CRAWLER_CALLBACK_URL", webhook_url)
    get_settings.cache_clear()


def test_a_seed_robots_txt_disallows_is_said_by_seed_site_show_and_status(gate, conn, database_url, monkeypatch,
                                                                          tmp_path):
    """The case the issue saw: the sample site's /drafts/ page seeded with `rag-pipeline seed`."""
    with LoopbackSite(SAMPLE_SITE) as site:
        _env(monkeypatch, database_url, site.base_url, gate.webhook_url)
        assert CliRunner().invoke(cli, ["site", "discover", "sample"]).exit_code == 0
        seeds = tmp_path / "seeds.txt"
        seeds.write_text(site.url("/drafts/launch-plan") + "\n")
        seeded = CliRunner().invoke(cli, ["seed", str(seeds), "--wait", "30"])
        assert seeded.exit_code == 0, seeded.output
        assert "pushed 0, failed 0, disallowed by robots.txt 1" in seeded.output
        assert f"disallowed: {site.url('/drafts/launch-plan')}: {RULE}" in seeded.output
        assert site.hits["/drafts/launch-plan"] == 0
        shown = CliRunner().invoke(cli, ["site", "show", "sample"])
    assert shown.exit_code == 0, shown.output
    assert "pages: 7 (0 live, 5 listed, 0 unlisted, 0 tombstoned, 6 due, 6 never crawled, " \
           "1 disallowed by robots.txt)" in shown.output, shown.output
    [said] = [line for line in shown.output.splitlines() if line.startswith("  disallowed by robots.txt: ")]
    assert said.startswith(f"  disallowed by robots.txt: {site.url('/drafts/launch-plan')} ({RULE}), found "), said
    # Looked at again after its own interval (a day: cadence.yaml's default), the TTL (1h) being shorter.
    assert re.search(r" UTC \((now|\d+s ago)\); looked at again \S+ \S+ UTC \(in (23h 59m|1d 0h)\)$", said), said
    as_json = json.loads(CliRunner().invoke(cli, ["site", "show", "sample", "--json"]).output)
    assert as_json["pages"]["disallowed"] == 1
    assert [d["crawl_url"] for d in as_json["disallowed_examples"]] == [site.url("/drafts/launch-plan")]
    status = CliRunner().invoke(cli, ["status"])
    [line] = [line for line in status.output.splitlines() if line.strip().startswith("sample")]
    assert line.split()[1:7] == ["0", "5", "0", "0", "6", "1"], status.output   # live … due, disallowed
    assert "disallowed" in status.output
    report = json.loads(CliRunner().invoke(cli, ["status", "--json"]).output)
    assert report["sites"][0]["disallowed"] == 1


def test_a_redirect_into_a_disallowed_path_is_judged_by_its_hop_not_released_every_reading(receiver, conn):
    """The crawler found the hop disallowed, not the page's own URL: a reading that allows the
    page's URL leaves it held while robots.txt still disallows the hop, and releases it once not."""
    with LoopbackSite() as site:
        robots(site, "User-agent: *\nDisallow: /drafts/\n")
        site.set_raw("/sitemap.xml", b'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                                     b"</urlset>")
        site.redirect("/plan", "/drafts/plan", status=302)
        spec = SiteSpec(name="docs", sitemaps=(site.url("/sitemap.xml"),), robots_sitemaps=False)
        with conn.transaction():
            sites_store.sync_declared(conn, [spec])
            schedule.register(conn, site.url("/plan"), site.url("/plan"), timedelta(minutes=2), explicit=True,
                              site="docs", shard=None)
        report = push_due(conn, crawler(receiver, robots_ttl_s=600))
        assert report.disallowed_urls == [f"{site.url('/plan')}: {RULE} (redirected from {site.url('/plan')})"]
        hop = conn.execute("SELECT disallowed_url FROM pages").fetchone()[0]
        assert hop == site.url("/drafts/plan")

        result = read(conn, spec)
        assert (result.counts["pages_disallowed"], result.counts["allowed_again"]) == (0, 0)
        assert page(conn, site.url("/plan"))["marked"]

        robots(site, "User-agent: *\nDisallow: /private/\n")
        result = read(conn, spec)
        assert result.counts["allowed_again"] == 1
    state = page(conn, site.url("/plan"))
    assert not state["marked"] and state["due_in_s"] <= 0


def test_a_listed_page_robots_txt_comes_to_disallow_is_held_not_no_longer_listed(conn):
    with LoopbackSite() as site:
        robots(site, "User-agent: *\nAllow: /\n")
        site.set_raw("/sitemap.xml", (
            '<?xml version="1.0" encoding="UTF-8"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            f"<url><loc>{site.url('/a')}</loc></url><url><loc>{site.url('/drafts/b')}</loc></url>"
            "</urlset>").encode())
        spec = SiteSpec(name="docs", sitemaps=(site.url("/sitemap.xml"),), robots_sitemaps=False)
        with conn.transaction():
            sites_store.sync_declared(conn, [spec])
        assert read(conn, spec).counts["new"] == 2
        robots(site, "User-agent: *\nDisallow: /drafts/\n")
        result = read(conn, spec)
    assert result.complete, result.errors
    assert (result.counts["disallowed"], result.counts["pages_disallowed"], result.counts["gone"]) == (1, 1, 0)
    marked, unlisted = conn.execute("SELECT disallowed_rule, unlisted_at IS NOT NULL FROM pages"
                                    " WHERE crawl_url = %s", (site.url("/drafts/b"),)).fetchone()
    assert (marked, unlisted) == (RULE, False)


EMPTY_SITEMAP = b'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"></urlset>'


def _site_with_drafts(conn, site: LoopbackSite, *paths: str) -> SiteSpec:
    """A site whose sitemap lists nothing and whose pages (`paths`, seeded) robots.txt disallows:
    its robots.txt is first read when the reading judges them."""
    robots(site, "User-agent: *\nDisallow: /drafts/\n")
    site.set_raw("/sitemap.xml", EMPTY_SITEMAP)
    spec = SiteSpec(name="docs", sitemaps=(site.url("/sitemap.xml"),), robots_sitemaps=False)
    with conn.transaction():
        sites_store.sync_declared(conn, [spec])
        for path in paths:
            schedule.register(conn, site.url(path), site.url(path), timedelta(minutes=30), explicit=True,
                              site="docs", shard=None)
    return spec


def test_a_reading_holds_no_transaction_open_while_robots_txt_is_fetched(conn, database_url):
    """A transaction held across a fetch keeps its snapshot (and the rows it updated, locked) for as
    long as the site takes to answer: the batch runs that lock those page rows wait for it."""
    reading_pid = conn.info.backend_pid
    open_while_fetched: list[bool] = []
    with LoopbackSite() as site, psycopg.connect(database_url, autocommit=True) as watcher:
        spec = _site_with_drafts(conn, site, "/drafts/plan")
        with guarded_client(allowed=ALLOWED, user_agent=AGENT, timeout_s=5) as client:
            rules = RobotsCache(client, agent=AGENT, ttl_s=0.001, deadline_s=5)

            def robots_for(url: str):
                open_while_fetched.append(watcher.execute(
                    "SELECT xact_start IS NOT NULL FROM pg_stat_activity WHERE pid = %s", (reading_pid,)).fetchone()[0])
                return rules.rules_for(url)

            result = read_site(conn, client, spec, robots_for=robots_for, agent=AGENT,
                               every_for=lambda url: timedelta(days=1), allowed=ALLOWED, deadline_s=3)
        assert site.hits["/robots.txt"] == 1
    assert open_while_fetched == [False]
    assert result.complete and result.counts["pages_disallowed"] == 1, result.errors


def test_a_reading_writes_each_batch_of_verdicts_in_a_transaction_of_its_own(conn, monkeypatch):
    """Not one transaction for the whole pass over the site: a batch's rows are locked only while
    that batch is written."""
    monkeypatch.setattr(discovery, "JUDGE_ROWS", 1)
    with LoopbackSite() as site:
        spec = _site_with_drafts(conn, site, "/drafts/a", "/drafts/b", "/drafts/c")
        result = read(conn, spec)
    assert result.complete and result.counts["pages_disallowed"] == 3, result.errors
    # Each row's xmin is the transaction that last wrote it: three batches, three transactions.
    writers = conn.execute("SELECT xmin::text FROM pages WHERE disallowed_at IS NOT NULL").fetchall()
    assert len(writers) == 3 and len(set(writers)) == 3, writers
