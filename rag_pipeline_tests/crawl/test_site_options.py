"""What a site declares for its own pages: boilerplate rules of its own, and its own crawler."""

from __future__ import annotations

import gzip
import uuid

import pytest
from click.testing import CliRunner

from rag_pipeline.cli import main as cli
from rag_pipeline.core.site_spec import SiteError, SiteSpec
from rag_pipeline.ingest.routing import route_batch
from rag_pipeline.store import deliveries, sites
from rag_pipeline_tests.crawl.conftest import make_sim

BUILD_STAMP = {"name": "build-stamp", "pattern": r"^Built at [0-9:]+\n", "flags": ["MULTILINE"]}


def test_a_sites_own_boilerplate_rules_apply_to_its_pages_only(conn):
    with conn.transaction():
        sites.sync_declared(conn, [SiteSpec(name="docs", seeds=("https://docs.example.com/",),
                                            boilerplate=(BUILD_STAMP,))])
    for url in ("https://docs.example.com/a", "https://other.example.com/a"):
        deliveries.insert(conn, rid=uuid.uuid4().hex, url=url, pushed_url=None, crawler_status=200,
                          original_status=200, content_type="text/markdown", body_encoding="gzip",
                          body=gzip.compress(b"# Guide\n\nBuilt at 12:00\n\nThe text.\n"))
    route_batch(conn, 10, 10_000_000, allowed_networks=())
    texts = dict(conn.execute("SELECT page_url, normalized_text FROM deliveries").fetchall())
    assert "Built at" not in texts["https://docs.example.com/a"]
    assert "Built at 12:00" in texts["https://other.example.com/a"]


def test_a_bad_rule_or_crawler_is_a_declaration_error():
    with pytest.raises(SiteError, match="site docs: boilerplate: .*pattern"):
        SiteSpec(name="docs", seeds=("https://docs.example.com/",), boilerplate=({"name": "x", "pattern": "("},))
    with pytest.raises(SiteError, match="crawler must be local or crawlbase"):
        SiteSpec(name="docs", seeds=("https://docs.example.com/",), crawler="scrapy")


def test_a_site_with_its_own_crawler_is_pushed_through_it(gate, site, conn, crawl_env, tmp_path, database_url):
    """The deployment crawls with the local crawler; the site `docs` asks for Crawlbase."""
    crawl_env.setenv("DATABASE_URL", database_url)
    crawl_env.setenv("CRAWLER", "local")
    crawl_env.setenv("CRAWLER_CALLBACK_URL", gate.webhook_url)
    sim = make_sim(gate.webhook_url, crawl_env)
    try:
        site.set_page("/in-site", "<h1>In the site</h1>")
        site.set_page("/elsewhere", "<h1>Catch-all</h1>")
        https = site.base_url.replace("http://", "https://")
        with conn.transaction():
            sites.sync_declared(conn, [SiteSpec(name="docs", seeds=(site.url("/in-site"),),
                                                include=(f"{https}/in-site",), crawler="crawlbase")])
        seeds = tmp_path / "seeds.txt"
        seeds.write_text(f"{site.url('/in-site')}\n{site.url('/elsewhere')}\n")
        result = CliRunner().invoke(cli, ["seed", str(seeds), "--wait", "30"])
        assert result.exit_code == 0, result.output
        assert sim.wait_idle(15)
    finally:
        sim.stop()
    by = dict(conn.execute("SELECT url, crawler FROM pushes").fetchall())
    assert by == {site.url("/in-site"): "crawlbase", site.url("/elsewhere"): "local"}
    assert conn.execute("SELECT count(*) FROM deliveries").fetchone()[0] == 2
