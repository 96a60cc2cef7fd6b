"""`rag-pipeline seed` with the local crawler (what `make run` does) and `rag-pipeline cadence`."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from click.testing import CliRunner

from rag_pipeline.cli import main as cli
from rag_pipeline.crawl.site import LoopbackSite
from rag_pipeline.settings import get_settings

SAMPLE_SITE = Path(__file__).resolve().parents[2] / "samples" / "site"


def test_seed_the_sample_site_with_the_local_crawler(gate, conn, database_url, monkeypatch, tmp_path):
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("CRAWLER", "local")
    monkeypatch.setenv("CRAWLER_CALLBACK_URL", gate.webhook_url)
    get_settings.cache_clear()
    with LoopbackSite(SAMPLE_SITE) as site:
        seeds = tmp_path / "seeds.txt"
        seeds.write_text((SAMPLE_SITE / "seeds.txt").read_text().replace("{SITE}", site.base_url))
        result = CliRunner().invoke(cli, ["seed", str(seeds), "--wait", "30"])
        assert result.exit_code == 0, result.output
        assert "registered 5 page(s)" in result.output and "pushed 5, failed 0" in result.output
    delivered = dict(conn.execute("SELECT pushed_url, url FROM deliveries").fetchall())
    assert len(delivered) == 5
    assert delivered[site.url("/docs/old-webhook-guide")] == site.url("/docs/webhook-operations")
    reasons = conn.execute("SELECT DISTINCT reason, result, crawler FROM pushes").fetchall()
    assert reasons == [("seed", "pushed", "local")]
    cadences = dict(conn.execute("SELECT crawl_url, recrawl_every FROM pages").fetchall())
    assert cadences[site.url("/pricing")] == timedelta(minutes=2)
    assert cadences[site.url("/")] == timedelta(days=1)
    assert cadences[site.url("/docs/recrawl-cadence")] == timedelta(days=7)   # the */docs/* rule

    page = site.url("/pricing").replace("http://", "https://")
    result = CliRunner().invoke(cli, ["cadence", "set", site.url("/pricing"), "6h"])
    assert result.exit_code == 0 and f"{page}: every 6h" in result.output
    result = CliRunner().invoke(cli, ["cadence", "show", site.url("/pricing")])
    assert "every 6h (manual)" in result.output
    # A seed without every= never overrides a cadence set by hand.
    seeds.write_text(site.url("/pricing") + "\n")
    assert CliRunner().invoke(cli, ["seed", str(seeds), "--no-push"]).exit_code == 0
    assert "every 6h (manual)" in CliRunner().invoke(cli, ["cadence", "show", site.url("/pricing")]).output
    bad = CliRunner().invoke(cli, ["cadence", "set", site.url("/pricing"), "often"])
    assert bad.exit_code == 2 and "cannot read interval" in bad.output
