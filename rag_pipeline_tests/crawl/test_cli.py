"""`rag-pipeline seed` with the local crawler (what `make run` does) and `rag-pipeline cadence`."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

from click.testing import CliRunner

from rag_pipeline.cli import main as cli
from rag_pipeline.crawl.loopback_site import LoopbackSite
from rag_pipeline.settings import get_settings
from rag_pipeline.store import schedule

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
    assert "every 6h (manual, fixed)" in result.output
    # A seed without every= never overrides a cadence set by hand.
    seeds.write_text(site.url("/pricing") + "\n")
    assert CliRunner().invoke(cli, ["seed", str(seeds), "--no-push"]).exit_code == 0
    assert "every 6h (manual, fixed)" in CliRunner().invoke(cli, ["cadence", "show", site.url("/pricing")]).output
    # `auto` gives it back to its rule (*/pricing*: 1h) and the adaptive cadence.
    back = CliRunner().invoke(cli, ["cadence", "set", site.url("/pricing"), "auto"])
    assert back.exit_code == 0 and f"{page}: every 1h; adaptive from the next cadence refresh" in back.output
    assert "every 1h (rule glob */pricing*, adaptive)" in CliRunner().invoke(
        cli, ["cadence", "show", site.url("/pricing")]).output
    bad = CliRunner().invoke(cli, ["cadence", "set", site.url("/pricing"), "often"])
    assert bad.exit_code == 2 and "cannot read interval" in bad.output


def test_seed_that_stops_waiting_fails_the_pushes_it_gave_up_on(gate, conn, database_url, monkeypatch, tmp_path):
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("CRAWLER", "local")
    monkeypatch.setenv("CRAWLER_CALLBACK_URL", gate.webhook_url)
    get_settings.cache_clear()
    with LoopbackSite() as site:
        site.set_page("/slow", "<h1>Slow</h1><p>Takes its time.</p>", delay_s=2.0)
        seeds = tmp_path / "seeds.txt"
        seeds.write_text(site.url("/slow") + "\n")
        result = CliRunner().invoke(cli, ["seed", str(seeds), "--wait", "0.2"])
    assert result.exit_code == 1, result.output
    assert "1 page(s) were still being fetched after --wait 0.2 s" in result.output
    assert "Error: 1 push(es) failed" in result.output
    # Not `pushed` with a delivery this process would never make: failed, and its page due again soon.
    (push,) = conn.execute("SELECT result, error FROM pushes").fetchall()
    assert push == ("failed", "not delivered within 0.2 s of the push; given up")
    due = conn.execute("SELECT next_crawl_at - now() FROM pages").fetchone()[0]
    assert due <= timedelta(minutes=5)


PRICING = "https://shop.example.com/pricing"


def cadence(*args: str):
    get_settings.cache_clear()
    return CliRunner().invoke(cli, ["cadence", *args])


def page_row(conn, url):
    return conn.execute("SELECT recrawl_every, cadence_source, next_crawl_at <= now(), alias_of FROM pages"
                        " WHERE url = %s", (url,)).fetchone()


def test_cadence_set_refuses_a_cadence_the_sensor_cannot_honour(database_url, conn, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", database_url)
    schedule.register(conn, PRICING, PRICING, timedelta(hours=1), explicit=True)
    result = cadence("set", PRICING, "1s")
    assert result.exit_code == 1
    assert result.output == ("Error: every 1s is shorter than the recrawl sensor's interval (1m): "
                             "it cannot be honoured; use 1m or more (or lower RECRAWL_INTERVAL_S)\n")
    assert page_row(conn, PRICING)[:2] == (timedelta(hours=1), "seed")
    # The floor is the configured sensor interval, not a constant.
    monkeypatch.setenv("RECRAWL_INTERVAL_S", "20")
    result = cadence("set", PRICING, "30s")
    assert result.exit_code == 0, result.output
    assert page_row(conn, PRICING)[:2] == (timedelta(seconds=30), "manual")
    # What cannot be read at all stays a usage error (exit 2).
    for args, message in ((["set", PRICING, "often"], "cannot read interval 'often'"),
                          (["set", "ftp://shop.example.com/x", "6h"], "only http and https"),
                          (["show", "not a url"], "only http and https")):
        result = cadence(*args)
        assert result.exit_code == 2 and message in result.output, result.output


def test_cadence_set_refuses_an_unknown_url_unless_told_to_register_it(database_url, conn, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", database_url)
    result = cadence("set", "https://new.example.com/page/", "6h")
    assert result.exit_code == 1
    assert result.output == ("Error: https://new.example.com/page is not registered: check the URL, "
                             "or add it with --register\n")
    assert conn.execute("SELECT count(*) FROM pages").fetchone()[0] == 0
    result = cadence("set", "https://new.example.com/page/", "6h", "--register")
    assert result.exit_code == 0, result.output
    assert "https://new.example.com/page: every 6h (registered" in result.output
    # Added on purpose: never crawled, so due at the next recrawl tick rather than in 6 h.
    assert page_row(conn, "https://new.example.com/page") == (timedelta(hours=6), "manual", True, None)
    crawl_url, = conn.execute("SELECT crawl_url FROM pages").fetchone()
    assert crawl_url == "https://new.example.com/page/"


def test_cadence_set_refuses_an_alias_and_names_its_target(database_url, conn, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", database_url)
    old, new = "https://docs.example.com/old-guide", "https://docs.example.com/guide"
    schedule.register(conn, old, old, timedelta(days=7), explicit=True)
    conn.execute("UPDATE pages SET alias_of = %s, next_crawl_at = NULL WHERE url = %s", (new, old))
    result = cadence("set", old, "6h")
    assert result.exit_code == 1
    assert result.output == (f"Error: {old} redirects to {new} and is not recrawled: "
                             f"set the cadence there (rag-pipeline cadence set {new} 6h)\n")
    assert page_row(conn, old) == (timedelta(days=7), "seed", None, new)   # untouched
    result = cadence("set", old, "6h", "--register")
    assert result.exit_code == 1 and f"redirects to {new}" in result.output


def test_cadence_show_prints_readable_times(database_url, conn, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", database_url)
    schedule.register(conn, PRICING, PRICING, timedelta(hours=1), explicit=True)
    result = cadence("show", PRICING)
    assert result.exit_code == 0, result.output
    assert "None" not in result.output
    lines = result.output.splitlines()
    assert lines[0] == f"{PRICING}: every 1h (seed, fixed)"
    assert re.fullmatch(r"  last crawled never, next crawl \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \((now|\d+s ago)\)",
                        lines[1]), lines[1]
    conn.execute("UPDATE pages SET last_crawled_at = now() - interval '2 hours',"
                 " next_crawl_at = now() + interval '30 minutes'")
    lines = cadence("show", PRICING).output.splitlines()
    assert re.fullmatch(r"  last crawled \S+ \S+ UTC \(2h 0m ago\), next crawl \S+ \S+ UTC \(in (29|30)m\)",
                        lines[1]), lines[1]
    conn.execute("UPDATE pages SET alias_of = 'https://shop.example.com/prices', next_crawl_at = NULL")
    lines = cadence("show", PRICING).output.splitlines()
    assert lines[1].endswith("next crawl not scheduled") and "None" not in lines[1]
    assert lines[2] == "  redirects to https://shop.example.com/prices: not recrawled"
