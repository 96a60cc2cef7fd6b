"""Issue 43 acceptance, through the real daemon: a site whose pages carry a template (navigation,
section sidebars, a footer with a build id and dates) is discovered, crawled and indexed, its
template learned by its batch runs; then the site is redeployed (a navigation item, a sidebar
page, a new build id and date on every page) and recrawled: every page is routed unchanged, and
no index_batch run is launched."""

from __future__ import annotations

import uuid

import dagster as dg
import pytest

from rag_pipeline.crawl.loopback_site import LoopbackSite
from rag_pipeline.store import db
from rag_pipeline_tests.core.wrapped_site import SITE, Chrome, content_pages, wrapped_site
from rag_pipeline_tests.crawl.test_sites_daemon import urlset
from rag_pipeline_tests.daemons import daemon_stack
from rag_pipeline_tests.harness import TOKEN

PER_SECTION = 8


@pytest.fixture
def dagster_url(database_url):
    return db.as_url(db.with_database(database_url, f"dagster_{uuid.uuid4().hex[:8]}"))


def served(site: LoopbackSite, chrome: Chrome, contents, lastmod: str) -> dict[str, str]:
    """The wrapped pages served as the markdown a crawl delivers, on the loopback site's own URLs;
    returns path → page."""
    base = site.base_url
    pages = {url.replace(SITE, base): text.replace(SITE, base) for url, text in wrapped_site(chrome, contents).items()}
    paths = {url.removeprefix(base): text for url, text in pages.items()}
    for path, text in paths.items():
        site.set_raw(path, text.encode(), content_type="text/markdown; charset=utf-8")
    site.set_raw("/sitemap.xml", urlset(base, {path: lastmod for path in paths}))
    return paths


@pytest.mark.timeout(600)
def test_a_redeployed_site_is_recrawled_with_no_batch_run(database_url, dagster_url, conn, tmp_path, monkeypatch):
    by_section: dict[str, int] = {}
    contents = {}
    for url, value in content_pages().items():
        section = url.split("/")[3]
        if by_section.get(section, 0) < PER_SECTION:
            by_section[section] = by_section.get(section, 0) + 1
            contents[url] = value
    with LoopbackSite() as site, daemon_stack(database_url, dagster_url, tmp_path, monkeypatch) as (base, _, start):
        b = site.base_url
        site.set_raw("/robots.txt", f"User-agent: *\nSitemap: {b}/sitemap.xml\n".encode(), content_type="text/plain")
        paths = served(site, Chrome(), contents, "2026-11-01")
        site.redirect("/docs/old-webhook-guide", next(iter(paths)))   # the sample site's seed
        daemon = start(SAMPLE_SITE_URL=b, CRAWLER="local", CRAWLER_CALLBACK_URL=f"{base}/webhook?token={TOKEN}",
                       RECRAWL_INTERVAL_S="1", DISCOVERY_INTERVAL_S="1", CRAWLER_USER_AGENT="rag-test/1",
                       WEBHOOK_ACCEPT_UNSOLICITED="false")
        https = b.replace("http://", "https://")
        listed = {f"{https}{path}".rstrip("/") for path in paths}

        def indexed() -> set[str]:
            return {r[0] for r in conn.execute("SELECT url FROM pages WHERE site = 'sample'"
                                               " AND indexed_hash IS NOT NULL AND deleted_at IS NULL")}

        daemon.wait(lambda: listed <= indexed(), 300, "the site's pages indexed")
        learned = daemon.wait(lambda: conn.execute(
            "SELECT pages FROM site_templates WHERE site = 'sample' AND learned_at IS NOT NULL").fetchone(),
            60, "the site's template learned by its batch runs")
        assert learned[0] >= 20
        runs_before = {r.run_id for r in daemon.batch_runs()}
        assert runs_before
        tokens_before = conn.execute("SELECT coalesce(sum(tokens_embedded), 0) FROM embedding_ledger").fetchone()[0]
        redeployed_at = conn.execute("SELECT now()").fetchone()[0]

        # The redeploy: every page's template moves, its content does not; the sitemap's lastmods move.
        served(site, Chrome().redeployed(), contents, "2030-01-01")
        conn.execute("UPDATE sites SET next_discovery_at = now() WHERE name = 'sample'")

        def verified() -> int:
            return conn.execute("SELECT count(*) FROM pages WHERE url = ANY(%s) AND last_verified_at > %s",
                                (sorted(listed), redeployed_at)).fetchone()[0]

        daemon.wait(lambda: verified() == len(listed), 240, "every redeployed page recrawled and verified")
        outcomes = dict(conn.execute(
            "SELECT outcome, count(*) FROM deliveries WHERE received_at > %s AND page_url = ANY(%s) GROUP BY 1",
            (redeployed_at, sorted(listed))).fetchall())
        assert outcomes == {"unchanged": len(listed)}, outcomes
        assert conn.execute("SELECT count(*) FROM pages WHERE url = ANY(%s) AND last_changed_at > %s",
                            (sorted(listed), redeployed_at)).fetchone()[0] == 0
        assert {r.run_id for r in daemon.batch_runs()} == runs_before
        assert conn.execute("SELECT coalesce(sum(tokens_embedded), 0) FROM embedding_ledger").fetchone()[0] == \
            tokens_before
        # The stored source is the whole page as last crawled, its new template included.
        assert conn.execute("SELECT count(*) FROM pages WHERE url = ANY(%s) AND source_text LIKE %s",
                            (sorted(listed), "%Build 9b2e771%")).fetchone()[0] == len(listed)
        assert daemon.instance.get_latest_materialization_event(dg.AssetKey(["sample", "discovery"])) is not None
