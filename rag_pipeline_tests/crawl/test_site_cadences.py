"""A site's own `cadence:` block holds wherever its pages are scheduled: the recrawl sensor's
defaults, the adaptive refresh, seeding and `cadence show`, not only discovery."""

from __future__ import annotations

from datetime import timedelta

import pytest
from click.testing import CliRunner

from rag_pipeline.cli import main as cli
from rag_pipeline.core.site_spec import SiteError, SiteSpec
from rag_pipeline.core.urls import page_id
from rag_pipeline.crawl import adaptive
from rag_pipeline.crawl.cadence_rules import Seed, load_rules
from rag_pipeline.crawl.pushing import register_seeds
from rag_pipeline.crawl.site_cadences import SiteRules, load_site_rules, site_cadence
from rag_pipeline.settings import Settings, get_settings
from rag_pipeline.store import pages, schedule, sites

SHOP = SiteSpec(name="shop", sitemaps=("https://shop.example.com/sitemap.xml",),
                cadence={"default": "1d", "rules": [{"glob": "*/pricing*", "every": "2m", "min": "1m", "max": "1h"}]})
SITE_PRICING = "https://shop.example.com/pricing"
OTHER_PRICING = "https://other.example.com/pricing"     # the catch-all: the bundled cadence.yaml (1h, 15m-1d)


def unchanged_for_days(conn, url: str) -> None:
    """Forty unchanged crawls two minutes apart: the estimate wants the page's ceiling."""
    conn.execute("INSERT INTO crawl_observations (page_id, crawled_at, interval_s, changed)"
                 " SELECT %s, now() - make_interval(mins => 2 * i), 120, false FROM generate_series(1, 40) i",
                 (page_id(url),))
    conn.execute("UPDATE pages SET last_crawled_at = now() WHERE url = %s", (url,))


def test_a_sites_pages_get_its_rules_from_the_sensor_and_the_refresh(conn):
    with conn.transaction():
        sites.sync_declared(conn, [SHOP])
    rules = load_site_rules(conn, None)
    assert set(rules.sites) == {"shop"}
    pages.ensure(conn, page_id(SITE_PRICING), SITE_PRICING, site="shop", shard=None)
    pages.ensure(conn, page_id(OTHER_PRICING), OTHER_PRICING)
    pages.ensure(conn, page_id("https://shop.example.com/about"), "https://shop.example.com/about", site="shop")
    assert schedule.assign_defaults(conn, rules.every_for, limit=10) == 3
    every = dict(conn.execute("SELECT url, recrawl_every FROM pages").fetchall())
    assert every == {SITE_PRICING: timedelta(minutes=2), OTHER_PRICING: timedelta(hours=1),
                     "https://shop.example.com/about": timedelta(days=1)}   # the site's default, not 7d

    for url in (SITE_PRICING, OTHER_PRICING):
        unchanged_for_days(conn, url)
    # A budget of one push a day: every page goes to its own rule's ceiling.
    refreshed = adaptive.refresh(conn, rules, Settings(CRAWL_BUDGET_PER_DAY="1"), timedelta(minutes=10))
    assert refreshed.adaptive == 3
    every = dict(conn.execute("SELECT url, recrawl_every FROM pages").fetchall())
    assert every == {SITE_PRICING: timedelta(hours=1), OTHER_PRICING: timedelta(days=1),
                     "https://shop.example.com/about": timedelta(days=4)}
    why = conn.execute("SELECT cadence_why FROM pages WHERE url = %s", (SITE_PRICING,)).fetchone()[0]
    assert "site shop's rule glob */pricing*: every 2m, 1m–1h" in why


def test_seeds_and_cadence_show_follow_the_site(conn, database_url, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", database_url)
    get_settings.cache_clear()
    with conn.transaction():
        sites.sync_declared(conn, [SHOP])
    seeds = [Seed(SITE_PRICING, SITE_PRICING, None, 1), Seed(OTHER_PRICING, OTHER_PRICING, None, 2)]
    register_seeds(conn, seeds, load_site_rules(conn, None))
    assert dict(conn.execute("SELECT url, recrawl_every FROM pages").fetchall()) == {
        SITE_PRICING: timedelta(minutes=2), OTHER_PRICING: timedelta(hours=1)}
    shown = CliRunner().invoke(cli, ["cadence", "show", SITE_PRICING])
    assert shown.exit_code == 0, shown.output
    assert "  site shop's rule glob */pricing*: every 2m, 1m–1h" in shown.output.splitlines()
    assert "  rule glob */pricing*: every 1h, 15m–1d" in CliRunner().invoke(
        cli, ["cadence", "show", OTHER_PRICING]).output.splitlines()
    # `auto` gives a page back to its own site's rule; `--register` places a new page in its site.
    conn.execute("UPDATE pages SET recrawl_every = '6h', cadence_source = 'manual' WHERE url = %s", (SITE_PRICING,))
    back = CliRunner().invoke(cli, ["cadence", "set", SITE_PRICING, "auto"])
    assert back.exit_code == 0 and "every 2m; adaptive" in back.output, back.output
    new = "https://shop.example.com/pricing/teams"
    added = CliRunner().invoke(cli, ["cadence", "set", new, "auto", "--register"])
    assert added.exit_code == 0 and "every 2m (registered" in added.output, added.output
    assert conn.execute("SELECT site FROM pages WHERE url = %s", (new,)).fetchone() == ("shop",)


def test_a_site_block_is_checked_when_the_site_loads():
    assert site_cadence(None, "shop") is None
    assert site_cadence(SHOP.cadence, "shop").every_for(SITE_PRICING) == timedelta(minutes=2)
    with pytest.raises(SiteError, match="site shop: cadence: rule 1 needs `every`"):
        site_cadence({"rules": [{"glob": "*"}]}, "shop")
    # A tombstone is re-checked at one pace for the deployment: a site's own would be ignored.
    with pytest.raises(SiteError, match="tombstone_recheck is set for the whole deployment"):
        site_cadence({"tombstone_recheck": "7d"}, "shop")
    plain = SiteRules(load_rules())
    assert plain.of("shop") is plain.deployment and plain.every_for(SITE_PRICING, "shop") == timedelta(hours=1)


def test_cadence_show_names_the_site_rule_and_estimates_nothing_from_no_observation(conn, database_url, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", database_url)
    get_settings.cache_clear()
    with conn.transaction():
        sites.sync_declared(conn, [SHOP])
    rules = load_site_rules(conn, None)
    register_seeds(conn, [Seed(SITE_PRICING, SITE_PRICING, None, 1)], rules)
    conn.execute("UPDATE pages SET cadence_source = 'default' WHERE url = %s", (SITE_PRICING,))   # its rule's
    # Never crawled twice: the refresh has only the rule's prior to go on.
    adaptive.refresh(conn, rules, Settings(CRAWL_BUDGET_PER_DAY="100"), timedelta(minutes=10))
    shown = CliRunner().invoke(cli, ["cadence", "show", SITE_PRICING])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert lines[0].endswith("(site shop's rule glob */pricing*, adaptive)"), lines[0]
    rate = next(line for line in lines if line.startswith("  change rate: "))
    assert rate.startswith("  change rate: none observed yet (no crawl compared with an earlier one); ")
    assert "assumed" in rate and "estimated" not in rate and rate.endswith("observations: 0 (0 changed)")
    why = next(line for line in lines if line.startswith("  why this interval: "))
    assert "No change observed yet (0 observations): " in why and "from 0 observation" not in why
