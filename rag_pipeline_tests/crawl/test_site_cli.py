"""`rag-pipeline site list|show|discover` and the sites in `status`, on the sample site that
`make run` declares (rag_pipeline/defs/sites/sample, on when SAMPLE_SITE_URL is set)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from rag_pipeline.cli import main as cli
from rag_pipeline.crawl.loopback_site import LoopbackSite
from rag_pipeline.settings import get_settings

SAMPLE_SITE = Path(__file__).resolve().parents[2] / "samples" / "site"


def _env(monkeypatch, database_url, site_url: str | None) -> None:
    monkeypatch.setenv("DATABASE_URL", database_url)
    if site_url:
        monkeypatch.setenv("SAMPLE_SITE_URL", site_url)
    else:
        monkeypatch.delenv("SAMPLE_SITE_URL", raising=False)
    get_settings.cache_clear()


def test_site_discover_reads_the_sample_site_and_show_tells_what_it_found(database_url, conn, monkeypatch):
    with LoopbackSite(SAMPLE_SITE) as site:
        _env(monkeypatch, database_url, site.base_url)
        result = CliRunner().invoke(cli, ["site", "discover", "sample"])
        assert result.exit_code == 0, result.output
        # The generated sitemap lists six pages, robots.txt disallows /drafts/; the old guide is the seed.
        assert result.output.startswith("sample: complete: 6 listed, 5 new, 0 gone, 0 lastmod moved")
        assert "not recorded in Dagster: no instance at" in result.output
        shown = CliRunner().invoke(cli, ["site", "show", "sample"])
    assert shown.exit_code == 0, shown.output
    assert "sample: 1 sitemap(s), 1 seed(s), up to 1,000 pages, read every 2m" in shown.output
    assert "pages: 6 (0 live, 5 listed, 0 unlisted, 0 tombstoned, 6 due, 6 never crawled)" in shown.output
    assert "disallowed 1" in shown.output
    listed = json.loads(CliRunner().invoke(cli, ["site", "list", "--json"]).output)
    assert [(s["site"], s["listed"], s["due"]) for s in listed] == [("sample", 5, 6)]
    urls = [r[0] for r in conn.execute("SELECT crawl_url FROM pages WHERE site = 'sample' ORDER BY 1")]
    assert site.url("/drafts/launch-plan") not in urls and site.url("/pricing") in urls
    status = json.loads(CliRunner().invoke(cli, ["status", "--json"]).output)
    assert [(s["site"], s["last_reading"]["complete"]) for s in status["sites"]] == [("sample", True)]

    # Another shell, without `make run`'s SAMPLE_SITE_URL: the site the running location declared
    # is still listed and shown, from what its reading recorded; a reading needs the declaration.
    _env(monkeypatch, database_url, None)
    listed = CliRunner().invoke(cli, ["site", "list"])
    assert listed.exit_code == 0 and listed.output.startswith("sample: 0 live, 5 listed"), listed.output
    shown = CliRunner().invoke(cli, ["site", "show", "sample"])
    assert shown.exit_code == 0 and "not in this shell" in shown.output and "pages: 6" in shown.output
    refused = CliRunner().invoke(cli, ["site", "discover", "sample"])
    assert refused.exit_code == 1 and "SAMPLE_SITE_URL" in refused.output


def test_an_unreadable_sitemap_exits_1_and_says_why(database_url, monkeypatch):
    with LoopbackSite() as site:     # answers 404 to everything, robots.txt included (allowed)
        _env(monkeypatch, database_url, site.base_url)
        result = CliRunner().invoke(cli, ["site", "discover", "sample"])
    assert result.exit_code == 1
    assert f"problem: {site.url('/sitemap.xml')}: answered 404" in result.output
    status = CliRunner().invoke(cli, ["status"])
    assert "INCOMPLETE: " + site.url("/sitemap.xml") in status.output


def test_an_unknown_site_is_one_line_and_exit_1(database_url, monkeypatch):
    _env(monkeypatch, database_url, None)      # the sample site is off: no site declared
    result = CliRunner().invoke(cli, ["site", "show", "docs"])
    assert result.exit_code == 1
    assert result.output.strip() == ("Error: no site 'docs' is declared; declared sites: none "
                                     "(add one: dg scaffold defs SiteComponent sites/<name>)")
    listed = CliRunner().invoke(cli, ["site", "list"])
    assert listed.exit_code == 0 and listed.output.startswith("no sites declared")
