"""The recrawl queue: cadence defaults for delivery-discovered pages, `cadence set`, leases."""

from datetime import timedelta

from rag_pipeline.core.urls import page_id
from rag_pipeline.crawl.cadence_rules import load_rules
from rag_pipeline.crawl.site_cadences import SiteRules
from rag_pipeline.store import db, pages, schedule

PRICING = "https://shop.example.com/pricing"
DOCS = "https://example.com/docs/install"


def row(conn, url):
    return conn.execute("SELECT recrawl_every, cadence_source, next_crawl_at - coalesce(last_crawled_at,"
                        " first_seen_at) FROM pages WHERE url = %s", (url,)).fetchone()


def test_delivery_discovered_pages_get_their_pattern_cadence_once(database_url):
    rules = load_rules()
    with db.connection(database_url) as conn:
        conn.autocommit = True
        for url in (PRICING, DOCS):
            pages.ensure(conn, page_id(url), url)       # what routing does for a new page
        assert schedule.assign_defaults(conn, SiteRules(rules).every_for, limit=1) == 1   # bounded
        assert schedule.assign_defaults(conn, SiteRules(rules).every_for, limit=10) == 1
        assert schedule.assign_defaults(conn, SiteRules(rules).every_for, limit=10) == 0
        assert row(conn, PRICING) == (timedelta(hours=1), "default", timedelta(hours=1))
        assert row(conn, DOCS) == (timedelta(days=7), "default", timedelta(days=7))


def test_cadence_set_and_leases(database_url):
    with db.connection(database_url) as conn:
        conn.autocommit = True
        schedule.register(conn, PRICING, PRICING, timedelta(hours=1), explicit=True)
        conn.execute("UPDATE pages SET last_crawled_at = now() - interval '2 hours'")
        schedule.set_cadence(conn, PRICING, PRICING, timedelta(hours=6))
        assert row(conn, PRICING) == (timedelta(hours=6), "manual", timedelta(hours=6))
        # A pattern default never overrides a hand-set cadence; an explicit seed does.
        schedule.register(conn, PRICING, PRICING, timedelta(hours=1), explicit=False)
        assert row(conn, PRICING)[:2] == (timedelta(hours=6), "manual")
        # Due now (seeding makes it due): claimed once, then leased.
        assert [t.crawl_url for t in schedule.claim_due(conn, 10, timedelta(minutes=10))] == [PRICING]
        assert schedule.claim_due(conn, 10, timedelta(minutes=10)) == []
        schedule.after_push(conn, [PRICING], [], tombstone_recheck=timedelta(days=30),
                            retry_after=timedelta(minutes=5))
        left, = conn.execute("SELECT next_crawl_at - now() FROM pages").fetchone()
        assert timedelta(hours=5, minutes=59) < left <= timedelta(hours=6)
        schedule.after_push(conn, [], [PRICING], tombstone_recheck=timedelta(days=30),
                            retry_after=timedelta(minutes=5))
        left, = conn.execute("SELECT next_crawl_at - now() FROM pages").fetchone()
        assert left <= timedelta(minutes=5)


def next_in(conn, url=PRICING) -> timedelta:
    return conn.execute("SELECT next_crawl_at - now() FROM pages WHERE url = %s", (url,)).fetchone()[0]


def test_the_next_crawl_is_one_interval_after_the_page_was_due_not_after_its_push(database_url):
    """The sensor ticks once a minute and a push run takes a while to start: counted from the
    push, a 2 min cadence became 3 min (the tick that comes 2 min later finds it not yet due)."""
    kw = dict(tombstone_recheck=timedelta(days=30), retry_after=timedelta(minutes=5))
    with db.connection(database_url) as conn:
        conn.autocommit = True
        schedule.register(conn, PRICING, PRICING, timedelta(minutes=2), explicit=True)
        conn.execute("UPDATE pages SET next_crawl_at = now() - interval '20 seconds'")
        target, = schedule.claim_due(conn, 10, timedelta(minutes=10))
        due_at = target.due_at
        assert due_at is not None
        schedule.after_push(conn, [PRICING], [], due_at={PRICING: due_at}, **kw)
        assert conn.execute("SELECT next_crawl_at FROM pages").fetchone()[0] == due_at + timedelta(minutes=2)
        assert timedelta(seconds=95) < next_in(conn) <= timedelta(seconds=100)
        # Pushed after its next slot had already passed (a backlog, a crawler outage): one interval
        # from the push, never in the past, so a late page is not pushed twice in a row.
        conn.execute("UPDATE pages SET next_crawl_at = now() - interval '5 minutes'")
        target, = schedule.claim_due(conn, 10, timedelta(minutes=10))
        schedule.after_push(conn, [PRICING], [], due_at={PRICING: target.due_at}, **kw)
        assert timedelta(seconds=115) < next_in(conn) <= timedelta(minutes=2)
        # A push nobody scheduled (seed, recrawl now) counts from the push.
        schedule.after_push(conn, [PRICING], [], **kw)
        assert timedelta(seconds=115) < next_in(conn) <= timedelta(minutes=2)
        # A tombstone still waits its slow re-check, whenever it was due.
        conn.execute("UPDATE pages SET deleted_at = now(), next_crawl_at = now() - interval '1 second'")
        schedule.after_push(conn, [PRICING], [], due_at={PRICING: due_at}, **kw)
        assert next_in(conn) > timedelta(days=29)


def test_recrawl_sensor_hands_each_due_time_to_its_push_run(gate, database_url, monkeypatch):
    import dagster as dg

    from rag_pipeline.crawl.loopback_site import LoopbackSite
    from rag_pipeline.settings import get_settings
    from rag_pipeline_tests.harness import evaluate_sensor, load_defs

    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("CRAWLER", "local")
    monkeypatch.setenv("CRAWLER_CALLBACK_URL", gate.webhook_url)
    get_settings.cache_clear()
    with LoopbackSite() as site, dg.instance_for_test() as instance, db.connection(database_url) as conn:
        conn.autocommit = True
        site.set_page("/pricing", "<html><body><p>Four dollars.</p></body></html>")
        url = site.url("/pricing")
        page_url = url.replace("http://", "https://")
        schedule.register(conn, url, page_url, timedelta(minutes=2), explicit=True)
        conn.execute("UPDATE pages SET next_crawl_at = date_trunc('second', now()) - interval '20 seconds'")
        due_at, = conn.execute("SELECT next_crawl_at FROM pages").fetchone()
        defs = load_defs()
        result = evaluate_sensor(defs, "recrawl_sensor", instance)
        request, = [r for r in result.run_requests if r.job_name == "push"]
        outcome = defs.resolve_job_def("push").execute_in_process(
            run_config=request.run_config, instance=instance)
        assert outcome.success
        assert conn.execute("SELECT result FROM pushes").fetchone()[0] == "pushed"
        assert conn.execute("SELECT next_crawl_at FROM pages").fetchone()[0] == due_at + timedelta(minutes=2)


def test_a_new_cadence_does_not_delay_a_page_that_was_never_crawled(database_url):
    with db.connection(database_url) as conn:
        conn.autocommit = True
        schedule.register(conn, PRICING, PRICING, timedelta(hours=1), explicit=True)   # seeded: due now
        schedule.set_cadence(conn, PRICING, PRICING, timedelta(hours=6))
        assert next_in(conn) <= timedelta(0)
        # Claimed (a push in flight): the lease stands, the page is not pushed twice.
        schedule.claim_due(conn, 10, timedelta(minutes=10))
        schedule.set_cadence(conn, PRICING, PRICING, timedelta(hours=6))
        assert timedelta(minutes=9) < next_in(conn) <= timedelta(minutes=10)



def test_a_cadence_refresh_keeps_the_lease_of_a_page_claimed_while_it_runs(database_url):
    """The refresh is one long transaction (a `cadence_refresh` run): a page recrawl_sensor claims
    after it began is leased from the claim, and the refresh must not make it due again."""
    from rag_pipeline.store import crawl_observations

    with db.connection(database_url) as refresh, db.connection(database_url) as tick:
        tick.autocommit = True
        pages.ensure(tick, page_id(PRICING), PRICING)
        schedule.assign_defaults(tick, SiteRules(load_rules()).every_for, limit=10)
        tick.execute("UPDATE pages SET last_crawled_at = now() - interval '3 hours',"
                     " next_crawl_at = now() - interval '1 minute'")
        refresh.execute("SELECT now()")                    # the refresh's transaction has begun
        claimed = schedule.claim_due(tick, 10, timedelta(minutes=10))
        assert [t.page_url for t in claimed] == [PRICING]
        assert crawl_observations.set_cadences(refresh, [(page_id(PRICING), 3600.0, 1e-4, "test")],
                                    timedelta(minutes=10)) == 1
        refresh.commit()
        assert timedelta(minutes=9) < next_in(tick) <= timedelta(minutes=10)   # still leased
        assert schedule.claim_due(tick, 10, timedelta(minutes=10)) == []       # not pushed twice


def test_recrawl_sensor_hands_the_cadence_refresh_to_a_run_of_its_own(database_url, monkeypatch):
    """The refresh reads every page's observations: it runs as a `cadence_refresh` run (its figures
    in the run's metadata), every CADENCE_REFRESH_S, never two at once, never inside a tick."""
    import dagster as dg

    from rag_pipeline.settings import get_settings
    from rag_pipeline_tests.harness import evaluate_sensor, load_defs

    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("CADENCE_REFRESH_S", "600")
    get_settings.cache_clear()
    with dg.instance_for_test() as instance, db.connection(database_url) as conn:
        conn.autocommit = True
        for url in (PRICING, DOCS):
            pages.ensure(conn, page_id(url), url)
        defs = load_defs()
        # The first tick starts the clock; within CADENCE_REFRESH_S of it no refresh is asked.
        first = evaluate_sensor(defs, "recrawl_sensor", instance)
        assert not first.run_requests and first.skip_reason.skip_message.startswith("no page due")
        again = evaluate_sensor(defs, "recrawl_sensor", instance, cursor=first.cursor)
        assert not again.run_requests and again.cursor == first.cursor
        # CADENCE_REFRESH_S later: a refresh run (nothing is due, so it is the only request).
        late = evaluate_sensor(defs, "recrawl_sensor", instance, cursor=str(float(first.cursor) - 601))
        request, = late.run_requests
        assert request.job_name == "cadence_refresh" and request.run_key
        assert int(request.tags["dagster/max_runtime"]) > 0     # a dead worker's run is failed in time
        assert float(late.cursor) >= float(first.cursor)

        job = defs.resolve_job_def("cadence_refresh")
        outcome = job.execute_in_process(instance=instance, tags=request.tags)
        assert outcome.success
        figures = _output_metadata(outcome)
        assert figures["pages"] == 2 and figures["adaptive"] == 2 and figures["budget_per_day"] > 0
        assert dict(conn.execute("SELECT url, cadence_source FROM pages")) == {PRICING: "default", DOCS: "default"}

        # Due again while a refresh run is still going: none is added, and the tick says why.
        monkeypatch.setenv("CADENCE_REFRESH_S", "0")
        going = instance.create_run_for_job(job_def=job, status=dg.DagsterRunStatus.STARTED)
        held = evaluate_sensor(defs, "recrawl_sensor", instance, cursor=first.cursor)
        assert not held.run_requests and held.cursor == first.cursor
        assert (f"the cadence refresh requested before (run {going.run_id[:8]}) has not ended"
                in held.skip_reason.skip_message)
        instance.report_run_failed(going)
        freed = evaluate_sensor(defs, "recrawl_sensor", instance, cursor=first.cursor)
        assert [r.job_name for r in freed.run_requests] == ["cadence_refresh"]
        assert float(freed.cursor) > float(first.cursor)


def _output_metadata(outcome) -> dict:
    (event,) = [e for e in outcome.all_node_events if e.event_type_value == "STEP_OUTPUT"]
    return {k: v.value for k, v in event.event_specific_data.metadata.items()}


def test_a_refresh_with_no_adaptive_page_says_so_instead_of_a_budget_of_nothing(database_url):
    from rag_pipeline.crawl import adaptive
    from rag_pipeline.settings import Settings

    with db.connection(database_url) as conn:
        conn.autocommit = True
        schedule.register(conn, PRICING, PRICING, timedelta(hours=1), explicit=True)   # fixed: 24/day
        schedule.register(conn, DOCS, DOCS, timedelta(hours=12), explicit=True)         # fixed: 2/day
        refreshed = adaptive.refresh(conn, SiteRules(load_rules()), Settings(), timedelta(minutes=10))
        assert (refreshed.adaptive, refreshed.budget_per_day, refreshed.planned_per_day) == (0, 26.0, 26.0)
        assert "no page has an adaptive cadence" in refreshed.note and "1e-09" not in refreshed.summary()
        assert conn.execute("SELECT budget_per_day, planned_per_day, note FROM crawl_budget").fetchone() == (
            26.0, 26.0, refreshed.note)
