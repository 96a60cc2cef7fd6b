"""Issue 42 point 3's acceptance, through the real daemon: a site file with a typo beside a good
site. The good site runs (its discovery sensor ticks, its pages are crawled and indexed, and a page
added to its sitemap becomes searchable); the bad one is named with file:line by the failed check
recorded in the instance (what the UI shows), by `status` and by `site show`."""

from __future__ import annotations

import json
import uuid

import dagster as dg
import pytest
from click.testing import CliRunner

from rag_pipeline.cli import main as cli
from rag_pipeline.components.broken_sites import SITE_FILE_CHECK
from rag_pipeline.crawl.loopback_site import LoopbackSite
from rag_pipeline.store import db
from rag_pipeline_tests.crawl.test_sites_daemon import page, urlset
from rag_pipeline_tests.daemons import daemon_stack
from rag_pipeline_tests.harness import TOKEN

TYPO_KEY = dg.AssetCheckKey(dg.AssetKey(["typo", "discovery"]), SITE_FILE_CHECK)


@pytest.fixture
def dagster_url(database_url):
    return db.as_url(db.with_database(database_url, f"dagster_{uuid.uuid4().hex[:8]}"))


@pytest.mark.timeout(600)
def test_a_typo_in_one_site_file_leaves_the_other_site_running(database_url, dagster_url, conn, tmp_path,
                                                              monkeypatch):
    with LoopbackSite() as site, daemon_stack(database_url, dagster_url, tmp_path, monkeypatch) as (base, _, start):
        b = site.base_url
        https = b.replace("http://", "https://")
        entries = {"/otters": "2026-11-01", "/herons": "2026-11-01"}
        site.set_raw("/sitemap.xml", urlset(b, entries))
        site.set_page("/otters", page("otters", "Otters hold hands while they sleep."))
        site.set_page("/herons", page("herons", "Herons stand still in the shallows."))
        folder = tmp_path / "sites"
        folder.mkdir()
        (folder / "docs.yaml").write_text(f"attributes:\n  sitemaps: [{b}/sitemap.xml]\n  discover_every: 1h\n")
        typo = folder / "typo.yaml"
        typo.write_text("attributes:\n  seeds: [https://typo.example.com/]\n  sitemap: [https://typo.example.com/s.xml]\n")
        said = f"{typo}:3: sitemap: Extra inputs are not permitted"
        monkeypatch.setenv("SITES_DIR", str(folder))

        daemon = start(SITES_DIR=str(folder), CRAWLER="local", CRAWLER_CALLBACK_URL=f"{base}/webhook?token={TOKEN}",
                       RECRAWL_INTERVAL_S="1", DISCOVERY_INTERVAL_S="1", CRAWLER_USER_AGENT="rag-test/1",
                       WEBHOOK_ACCEPT_UNSOLICITED="false")

        def indexed() -> set[str]:
            return {r[0] for r in conn.execute("SELECT url FROM pages WHERE site = 'docs' AND indexed_hash IS NOT NULL"
                                               " AND deleted_at IS NULL")}

        # The bad site's failed check, recorded by site_files_sensor: what the catalog shows in red.
        record = daemon.wait(lambda: daemon.instance.event_log_storage.get_latest_asset_check_execution_by_key(
            [TYPO_KEY]).get(TYPO_KEY), 120, "the bad site's failed check recorded")
        evaluation = record.event.dagster_event.asset_check_evaluation_data
        assert not evaluation.passed and evaluation.description.startswith(said)
        # The good site: its discovery sensor ticks and requests readings, its pages are indexed.
        daemon.wait(lambda: indexed() == {f"{https}/otters", f"{https}/herons"}, 240, "the good site's pages indexed")
        assert daemon.instance.get_run_records(dg.RunsFilter(job_name="docs_discovery"))

        # A page added to the good site becomes searchable.
        site.set_page("/beavers", page("beavers", "Beavers build dams of branches and mud."))
        entries["/beavers"] = "2026-11-02"
        site.set_raw("/sitemap.xml", urlset(b, entries))
        conn.execute("UPDATE sites SET next_discovery_at = now() WHERE name = 'docs'")
        daemon.wait(lambda: f"{https}/beavers" in indexed(), 240, "the added page indexed")
        found = CliRunner().invoke(cli, ["search", "beavers build dams", "--json"])
        assert found.exit_code == 0, found.output
        # (The URL as served or as normalized: what search shows of a scheme is point 4's.)
        assert f"{site.url('/beavers')}".split("://")[1] in [r["url"].split("://")[1]
                                                            for r in json.loads(found.output)["results"]]
        assert daemon.proc.poll() is None

        # `status` and `site show` name the bad site with its file and line.
        status = CliRunner().invoke(cli, ["status"])
        assert status.exit_code == 0 and f"site typo DOES NOT LOAD: {said}" in status.output, status.output
        shown = CliRunner().invoke(cli, ["site", "show", "typo"])
        assert shown.exit_code == 1 and shown.output.startswith(f"typo: DOES NOT LOAD: {said}")
