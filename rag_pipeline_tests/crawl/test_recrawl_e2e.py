"""Issue 4 acceptance: seeds with their own cadences, recrawls by one sensor, a changed page
re-embedded, a redirect recorded as an alias, a 404 tombstoned, a paused crawler failing its
check. Real receiver, Crawlbase simulator and site on loopback, a real Dagster instance."""

from __future__ import annotations

import json

import dagster as dg

from rag_pipeline.crawl.crawler_health import CRAWLER_NOT_PAUSED, PUSHES_DELIVERED
from rag_pipeline.settings import get_settings
from rag_pipeline_tests.crawl.conftest import make_sim
from rag_pipeline_tests.harness import Pipeline, evaluate_sensor, load_defs
from rag_pipeline_tests.waiting import wait_until


def html(title: str, text: str) -> str:
    return f"<html><head><title>{title}</title></head><body><h1>{title}</h1><p>{text}</p></body></html>"


class Crawl:
    """Ticks recrawl_sensor / crawler_health_sensor and runs the crawl jobs in the instance."""

    def __init__(self, instance, defs, sim):
        self.instance, self.defs, self.sim = instance, defs, sim

    def recrawl_tick(self) -> list[str]:
        """The pages the tick's push run pushed; its other runs (a cadence refresh) run too."""
        result = evaluate_sensor(self.defs, "recrawl_sensor", self.instance)
        urls = []
        for request in result.run_requests or []:
            outcome = self.defs.resolve_job_def(request.job_name).execute_in_process(
                run_config=request.run_config, instance=self.instance, tags=request.tags)
            assert outcome.success
            if request.job_name == "push":
                urls += request.run_config["ops"]["push_pages"]["config"]["urls"]
        return urls

    def run(self, job: str, op: str, config: dict) -> None:
        outcome = self.defs.resolve_job_def(job).execute_in_process(
            run_config={"ops": {op: {"config": config}}}, instance=self.instance)
        assert outcome.success

    def health(self, cursor=None) -> dict[str, dg.AssetCheckEvaluation]:
        result = evaluate_sensor(self.defs, "crawler_health_sensor", self.instance, cursor=cursor)
        # The tick list says what the tick recorded, not "an empty result".
        said, failing = result.skip_reason.skip_message, [e.check_name for e in result.asset_events if not e.passed]
        assert all(name in said for name in failing) and ("all passing" in said) == (not failing), said
        return {e.check_name: e for e in result.asset_events}

    def settle(self) -> None:
        assert self.sim.wait_idle(15), self.sim.stats()


def pushes_by_page(conn) -> dict[str, int]:
    return dict(conn.execute("SELECT url, count(*) FROM pushes GROUP BY url").fetchall())


def test_seed_cadence_recrawl_change_redirect_404_and_paused(gate, site, conn, crawl_env, instance, tmp_path,
                                                            monkeypatch):
    monkeypatch.setenv("RECRAWL_INTERVAL_S", "1")  # so that a 1 s cadence can be honoured
    fast, hourly, daily = site.url("/fast"), site.url("/hourly"), site.url("/daily")
    site.set_page("/fast", html("Prices", "The widget costs four dollars."))
    site.set_page("/hourly", html("Hourly", "An hourly page about otters."))
    site.set_page("/daily", html("Daily", "A daily page about herons."))
    seeds = tmp_path / "seeds.txt"
    seeds.write_text(f"# three pages, three cadences\n{fast} every=1s\n{hourly} every=1h\n{daily} every=1d\n")

    sim = make_sim(gate.webhook_url, crawl_env, probe_interval_s=0.1, probe_failures_to_pause=3)
    try:
        defs = load_defs()
        pipeline, crawl = Pipeline(instance, defs), Crawl(instance, defs, sim)

        crawl.run("seed", "seed_pages", {"file": str(seeds)})
        crawl.settle()
        assert len(pipeline.tick().partitions) == 3
        assert conn.execute("SELECT count(*) FROM pages WHERE indexed_hash IS NOT NULL").fetchone()[0] == 3
        key = {u: u.replace("http://", "https://") for u in (fast, hourly, daily)}

        # The price changes; a second later only the 1 s page is due, pushed and re-embedded.
        site.set_page("/fast", html("Prices", "The widget now costs seven dollars."))
        wait_until(lambda: conn.execute("SELECT next_crawl_at <= now() FROM pages WHERE url = %s",
                                        (key[fast],)).fetchone()[0], 10, "the 1 s page falling due")
        assert crawl.recrawl_tick() == [key[fast]]
        crawl.settle()
        assert pipeline.tick().partitions == [key[fast]]
        assert pushes_by_page(conn) == {fast: 2, hourly: 1, daily: 1}
        assert conn.execute("SELECT count(*) FROM embedding_ledger WHERE page_url = %s AND chunks_embedded > 0",
                            (key[fast],)).fetchone()[0] == 2
        source = conn.execute("SELECT source_text FROM pages WHERE url = %s", (key[fast],)).fetchone()[0]
        assert "seven dollars" in source

        # The hourly page moved: recrawl-now follows the redirect, records the alias, indexes once.
        site.set_page("/moved", html("Hourly", "An hourly page about otters, moved."))
        site.redirect("/hourly", "/moved")
        crawl.run("recrawl_now", "push_matching", {"pattern": "*/hourly"})
        crawl.settle()
        assert pipeline.tick().partitions == [site.url("/moved").replace("http://", "https://")]
        alias_of, = conn.execute("SELECT alias_of FROM pages WHERE url = %s", (key[hourly],)).fetchone()
        assert alias_of == site.url("/moved").replace("http://", "https://")
        assert conn.execute("SELECT count(*) FROM chunks c JOIN pages p USING (page_id) WHERE p.url = %s",
                            (key[hourly],)).fetchone()[0] == 0

        # The daily page is gone: its 404 tombstones it.
        site.remove("/daily")
        crawl.run("recrawl_now", "push_matching", {"pattern": "*/daily"})
        crawl.settle()
        pipeline.tick()
        deleted_at, = conn.execute("SELECT deleted_at FROM pages WHERE url = %s", (key[daily],)).fetchone()
        assert deleted_at is not None
        # Once due, a tombstone is not pushed on its daily cadence but moved to the slow re-check.
        conn.execute("UPDATE pages SET next_crawl_at = now() WHERE url = %s", (key[daily],))
        assert key[daily] not in crawl.recrawl_tick()
        recheck, = conn.execute("SELECT next_crawl_at - now() FROM pages WHERE url = %s", (key[daily],)).fetchone()
        assert recheck.days >= 29

        checks = crawl.health()
        assert all(e.passed for e in checks.values()), {k: e.description for k, e in checks.items()}

        # The receiver goes down: probes fail, the crawler pauses, its check fails and says why.
        gate.down.set()
        wait_until(lambda: sim.paused, 10, "the crawler pausing on failed probes")
        crawl_env.setenv("PUSH_DELIVERY_TIMEOUT_S", "0.3")
        get_settings.cache_clear()
        crawl.run("recrawl_now", "push_matching", {"pattern": "*/fast"})
        checks = wait_until(lambda: (c := crawl.health(cursor=json.dumps({"waiting": []})))
                            and not c[PUSHES_DELIVERED].passed and c, 10, "the undelivered push past its timeout")
        assert not checks[CRAWLER_NOT_PAUSED].passed
        assert "PAUSED" in checks[CRAWLER_NOT_PAUSED].description
        assert not checks[PUSHES_DELIVERED].passed
        assert "no delivery yet" in checks[PUSHES_DELIVERED].description
    finally:
        sim.stop()
