"""Issue 14 acceptance: the real recrawl_sensor schedules by the derived cadence. A page that
changes at every crawl is crawled more often than its rule says, pages that never change drift to
their rule's ceiling, and a cadence set by hand never moves. Real receiver, Crawlbase simulator
and site on loopback, a real Dagster instance; each round moves the clock on by an hour (every page
due, its previous crawl an hour older), so the estimator sees hourly crawls in seconds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from click.testing import CliRunner

from rag_pipeline.cli import main as cli
from rag_pipeline.defs.index.index_asset import snapshot_event
from rag_pipeline.settings import get_settings
from rag_pipeline_tests.crawl.conftest import make_sim
from rag_pipeline_tests.crawl.test_recrawl_e2e import Crawl, html
from rag_pipeline_tests.harness import Pipeline, load_defs

ROUNDS = 12


def test_recrawl_sensor_crawls_what_changes_and_spares_what_does_not(gate, site, conn, crawl_env, instance,
                                                                    tmp_path, monkeypatch):
    rules = tmp_path / "cadence.yaml"
    rules.write_text("default: 1h\ndefault_min: 1m\ndefault_max: 2h\ntombstone_recheck: 30d\n")
    monkeypatch.setenv("CADENCE_FILE", str(rules))
    monkeypatch.setenv("CADENCE_REFRESH_S", "0")          # derive the cadences at every tick
    monkeypatch.setenv("RECRAWL_INTERVAL_S", "1")
    # Eleven pages at their rule's 1h would push 264 times a day; the budget is 200.
    monkeypatch.setenv("CRAWL_BUDGET_PER_DAY", "200")
    get_settings.cache_clear()
    site.set_page("/busy", html("Prices", "Round 0."))
    static = [f"/static/{n}" for n in range(9)]
    for path in static:
        site.set_page(path, html("Static", f"Never changes: {path}."))
    site.set_page("/pinned", html("Pinned", "Changes, but its cadence was set by hand."))
    seeds = tmp_path / "seeds.txt"
    seeds.write_text("\n".join([site.url("/busy"), *map(site.url, static), f"{site.url('/pinned')} every=1h"]) + "\n")
    key = {path: site.url(path).replace("http://", "https://") for path in ["/busy", "/pinned", *static]}

    sim = make_sim(gate.webhook_url, crawl_env)
    try:
        defs = load_defs()
        pipeline, crawl = Pipeline(instance, defs), Crawl(instance, defs, sim)
        crawl.run("seed", "seed_pages", {"file": str(seeds)})
        crawl.settle()
        pipeline.tick()
        for n in range(1, ROUNDS + 1):
            site.set_page("/busy", html("Prices", f"Round {n}."))
            site.set_page("/pinned", html("Pinned", f"Changes, but its cadence was set by hand: {n}."))
            # An hour passes: every page is due, and its previous crawl an hour older.
            conn.execute("UPDATE pages SET next_crawl_at = now(), newest_crawl_at = newest_crawl_at - interval '1 hour'")
            assert len(crawl.recrawl_tick()) == 11
            crawl.settle()
            pipeline.tick()
        crawl.recrawl_tick()                                              # the last round's observations
    finally:
        sim.stop()

    rows = {url: (every, source, rate) for url, every, source, rate in conn.execute(
        "SELECT url, recrawl_every, cadence_source, change_rate FROM pages")}
    observed = dict(conn.execute("SELECT p.url, count(*) FILTER (WHERE changed) FROM crawl_observations o"
                                 " JOIN pages p USING (page_id) GROUP BY p.url"))
    assert observed[key["/busy"]] == ROUNDS and observed[key[static[0]]] == 0
    busy, _, busy_rate = rows[key["/busy"]]
    assert busy < timedelta(hours=1)                                      # more often than its rule
    for path in static:          # drifting to the 2h ceiling: past the rule's 1h, well on the way
        every, source, rate = rows[key[path]]
        assert source == "default" and timedelta(hours=1.5) < every <= timedelta(hours=2) and rate < busy_rate
    pinned_every, pinned_source, _ = rows[key["/pinned"]]
    assert (pinned_every, pinned_source) == (timedelta(hours=1), "seed")   # set by hand: never adapted
    due = dict(conn.execute("SELECT url, next_crawl_at - last_crawled_at FROM pages"))
    assert due[key[static[0]]] == rows[key[static[0]]][0]                 # the schedule follows

    # The `index` asset's metadata plots the schedule: the spread of rates and cadences, the budget.
    since = conn.execute("SELECT min(pushed_at) FROM pushes").fetchone()[0]
    event = snapshot_event(conn, get_settings(), since, datetime.now(UTC))
    figures = {name: value.value for name, value in event.metadata.items()}
    assert figures["crawl_budget_per_day"] == 200 and figures["pushes_in_period"] == 11 * (ROUNDS + 1)
    assert figures["pages_adaptive"] == 10 and figures["crawl_budget_note"] == ""     # the pinned page is not
    assert figures["cadence_p90_hours"] <= 2 and figures["cadence_p10_hours"] <= 1 < figures["cadence_p50_hours"]
    assert figures["change_rate_p90_per_day"] > figures["change_rate_p10_per_day"] > 0
    planned = sum(timedelta(days=1) / every for every, _, _ in rows.values())
    assert abs(figures["pushes_planned_per_day"] - planned) < 0.2

    shown = CliRunner().invoke(cli, ["cadence", "show", site.url("/busy")])
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.split())
    assert f"observations: {ROUNDS} ({ROUNDS} changed)" in text and "changes/day estimated 20" in text
    assert "budget" in text and "rule glob *" in text
