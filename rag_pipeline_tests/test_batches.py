"""Batch runs: one run for a tick of changed pages, each page on its own partition, failing alone."""

from __future__ import annotations

import dagster as dg
import pytest

from rag_pipeline.settings import Settings, get_settings
from rag_pipeline_tests.fakes.openai_server import FakeOpenAI
from rag_pipeline_tests.harness import TOKEN, Pipeline, batch_pages, configure, deliver, load_defs
from rag_pipeline_tests.servers import serve
from webhook_sensor.app import create_app


def url(n: int) -> str:
    return f"https://docs.example.com/batch/{n}"


def page(n: int, extra: str = "") -> str:
    return (f"# Page {n}\n\nPage {n} describes the pelican relay number {n} and its settings.{extra}\n\n"
            f"## Details\n\nThe relay {n} keeps {n} spare parts in the north shed.")


@pytest.fixture
def stack(database_url, monkeypatch):
    with FakeOpenAI(dimensions=64) as fake:
        configure(monkeypatch, DATABASE_URL=database_url, EMBEDDING_PROVIDER="openai", OPENAI_API_KEY="sk-test",
                  OPENAI_BASE_URL=fake.base_url, EMBEDDING_DIMENSIONS="64", EMBEDDING_MAX_RETRIES="0",
                  RUN_RETRY_BACKOFF_S="0")
        app = create_app(Settings(WEBHOOK_TOKEN=TOKEN), database_url=database_url)
        with serve(app, health_path="/healthz") as base, dg.instance_for_test() as instance:
            yield base, fake, Pipeline(instance, load_defs())


def materializations(instance, asset: str, partition: str):
    return instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition]), limit=20).records


def test_one_run_applies_a_tick_of_changed_pages_each_on_its_partition(stack, conn):
    base, fake, pipeline = stack
    # Page 29 is crawled over plain http: the same page (its key is the normalized https:// one),
    # and its `pages` event names the address that was fetched.
    crawled = {n: url(n).replace("https://", "http://") if n == 29 else url(n) for n in range(30)}
    for n in range(30):
        deliver(base, crawled[n], page(n))
    tick = pipeline.tick()

    assert len(tick.runs) == 1 and tick.runs[0].job_name == "index_batch"
    assert sorted(tick.partitions) == sorted(url(n) for n in range(30))
    # The texts of all 30 pages went out together, not one request per page.
    assert fake.requests == 1 and len(fake.inputs) == conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
    run_id = tick.runs[0].run_id
    for n in (0, 17, 29):
        source_hash, chunks = conn.execute(
            "SELECT p.indexed_hash, count(c.*) FROM pages p JOIN chunks c USING (page_id) WHERE p.url = %s"
            " GROUP BY 1", (url(n),)).fetchone()
        (p,), (c,), (e,) = (materializations(pipeline.instance, a, url(n)) for a in ("pages", "chunks", "embeddings"))
        assert {p.run_id, c.run_id, e.run_id} == {run_id}
        meta = {a: r.asset_materialization.metadata for a, r in (("pages", p), ("chunks", c), ("embeddings", e))}
        assert meta["pages"]["status"].value == "updated" and meta["pages"]["source_hash"].value == source_hash
        assert meta["pages"]["crawled_url"].value == crawled[n]
        assert meta["chunks"]["chunks"].value == chunks
        assert meta["embeddings"]["status"].value == "switched"
        assert meta["embeddings"]["chunks_total"].value == chunks == meta["embeddings"]["chunks_embedded"].value
        assert meta["embeddings"]["tokens_embedded"].value > 0
    # The asset views the UI reads: every partition materialized, the latest event from this run.
    for asset in ("pages", "chunks", "embeddings"):
        key = dg.AssetKey(asset)
        assert pipeline.instance.get_materialized_partitions(key) == {url(n) for n in range(30)}
        assert pipeline.instance.get_latest_materialization_event(key).run_id == run_id
    # Each page's share of the shared requests adds up to what the requests cost.
    ledger_tokens, ledger_requests = conn.execute(
        "SELECT sum(tokens_embedded), sum(requests) FROM embedding_ledger").fetchone()
    assert (ledger_tokens, ledger_requests) == (fake.total_tokens, 1)
    # On each partition, the page's share of that one request: none shows 0, and they add up to 1.
    shares = [materializations(pipeline.instance, "embeddings", url(n))[0].asset_materialization
              .metadata["requests"].value for n in range(30)]
    assert all(0 < share < 1 for share in shares) and abs(sum(shares) - 1) < 0.01
    assert conn.execute("SELECT count(*) FROM pages WHERE leased_until IS NOT NULL").fetchone()[0] == 0
    # The text routing normalized is kept only until its delivery is applied.
    assert conn.execute("SELECT count(*) FROM deliveries WHERE normalized_text IS NOT NULL").fetchone()[0] == 0


def test_a_poisoned_page_fails_alone_and_the_rest_switch_in(stack, conn):
    base, fake, pipeline = stack
    fake.poison("cormorant")
    for n in range(8):
        deliver(base, url(n), page(n, " A cormorant nests here." if n == 3 else ""))
    tick = pipeline.tick(expect_success=False)   # red in the UI: one page needs a look

    assert len(tick.runs) == 1
    states = dict(conn.execute(
        "SELECT page_url, outcome FROM deliveries").fetchall())
    assert states.pop(url(3)) == "failed" and set(states.values()) == {"embedded"}
    assert conn.execute("SELECT retry_at FROM deliveries WHERE page_url = %s", (url(3),)).fetchone()[0] is None
    assert materializations(pipeline.instance, "embeddings", url(3)) == []
    observed = pipeline.instance.fetch_observations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("embeddings"), asset_partitions=[url(3)]), limit=5).records
    assert observed[0].asset_observation.metadata["status"].value == "failed"
    assert all(len(materializations(pipeline.instance, "embeddings", url(n))) == 1 for n in range(8) if n != 3)
    failure = pipeline.instance.all_logs(tick.runs[0].run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
    assert "1 of 8 page(s) failed" in failure[0].dagster_event.step_failure_data.error.message


def test_a_page_delivered_again_while_a_batch_holds_it_is_applied_once_newest_last(stack, conn):
    base, fake, pipeline = stack
    deliver(base, url(1), page(1))
    held = pipeline.tick(execute=False)            # leased to a batch not started yet
    deliver(base, url(1), page(1, " Revised: the relay moved."))
    second = pipeline.tick(execute=False)
    assert second.partitions == []                 # not put in a second batch
    texts = conn.execute("SELECT normalized_text FROM deliveries ORDER BY id").fetchall()
    assert texts[1][0].startswith("# Page 1") and "Revised" in texts[1][0]   # the run need not decode it
    request = held.result.run_requests[0]
    outcome = pipeline.job.execute_in_process(run_config=request.run_config, instance=pipeline.instance,
                                              tags=request.tags)
    assert outcome.success
    rows = conn.execute("SELECT outcome FROM deliveries ORDER BY id").fetchall()
    assert rows == [("superseded",), ("embedded",)]
    assert "Revised" in conn.execute("SELECT source_text FROM pages").fetchone()[0]
    assert len(materializations(pipeline.instance, "embeddings", url(1))) == 1
    assert pipeline.tick().partitions == []


def test_batches_are_bounded_by_pages_and_tokens(stack, conn, monkeypatch):
    base, fake, pipeline = stack
    configure(monkeypatch, BATCH_MAX_PAGES="4")
    for n in range(10):
        deliver(base, url(n), page(n, " The relay hums." * 40))   # ~170 tokens a page
    tick = pipeline.tick(execute=False)
    # As few runs as the bound allows, balanced (the pages are all of one size): not 4 + 4 + 2.
    assert sorted(len(batch_pages(r)) for r in tick.result.run_requests) == [3, 3, 4]
    assert len({r.run_key for r in tick.result.run_requests}) == 3

    conn.execute("UPDATE pages SET leased_until = now()")
    configure(monkeypatch, BATCH_MAX_PAGES="500", BATCH_MAX_TOKENS="1000")
    chars = conn.execute("SELECT max(text_chars) FROM deliveries").fetchone()[0]
    per_batch = 1000 // -(-chars // 4)
    tick = pipeline.tick(execute=False)
    sizes = [len(batch_pages(r)) for r in tick.result.run_requests]
    assert 1 < per_batch < 10 and sum(sizes) == 10 and max(sizes) <= per_batch
    assert len(sizes) == -(-10 // per_batch) and max(sizes) - min(sizes) <= 1


def test_a_batch_run_that_ended_early_frees_its_pages_and_counts_a_try(stack, conn):
    base, fake, pipeline = stack
    deliver(base, url(1), page(1))
    deliver(base, url(2), page(2))
    tick = pipeline.tick(execute=False)
    request = tick.result.run_requests[0]
    # A run of that batch that dies before applying anything (here: config it cannot read).
    broken = {"ops": {"index_pages": {"config": {**request.run_config["ops"]["index_pages"]["config"],
                                                 "attempts": [0]}}}}
    outcome = pipeline.job.execute_in_process(run_config=broken, instance=pipeline.instance, tags=request.tags,
                                              raise_on_error=False)
    assert not outcome.success
    pipeline.report_failure(outcome.dagster_run)
    assert conn.execute("SELECT count(*) FROM pages WHERE leased_until IS NOT NULL").fetchone()[0] == 0
    rows = conn.execute("SELECT outcome, attempts, retry_at IS NOT NULL, error FROM deliveries ORDER BY id").fetchall()
    assert [r[:3] for r in rows] == [("failed", 1, True), ("failed", 1, True)]
    assert "did not apply this page: its run" in rows[0][3] and "failed" in rows[0][3]
    pipeline.report_failure(outcome.dagster_run)    # reported again: counted once
    assert conn.execute("SELECT max(attempts) FROM deliveries").fetchone()[0] == 1
    retry = pipeline.tick()                          # retries due at once (RUN_RETRY_BACKOFF_S=0)
    assert sorted(retry.partitions) == [url(1), url(2)]
    assert conn.execute("SELECT array_agg(DISTINCT outcome) FROM deliveries").fetchone()[0] == ["embedded"]
    assert get_settings().batch_lease_s == 1800.0


def test_a_batch_whose_run_was_never_launched_is_freed_and_requested_again_under_a_new_key(stack, conn,
                                                                                         monkeypatch):
    base, fake, pipeline = stack
    configure(monkeypatch, BATCH_START_GRACE_S="60")
    deliver(base, url(1), page(1))
    lost = pipeline.tick(execute=False)     # leased, but its run request never reaches the daemon
    (request,) = lost.result.run_requests
    assert pipeline.tick(execute=False).partitions == []   # within the grace: the lease holds
    conn.execute("UPDATE batches SET requested_at = now() - interval '61 seconds'")   # the grace passed
    again = pipeline.tick()
    (retry,) = again.result.run_requests
    assert retry.run_key != request.run_key and batch_pages(retry) == [url(1)]
    # A run that never started says nothing about the page: its retry budget is whole.
    assert conn.execute("SELECT outcome, attempts FROM deliveries").fetchall() == [("embedded", 0)]
    ended = dict(conn.execute("SELECT batch_key, end_reason FROM batches").fetchall())
    assert "no run was launched" in ended[request.tags["rag/batch"]]
    assert ended[retry.tags["rag/batch"]] == "applied"


def test_a_run_that_ended_without_finishing_its_batch_frees_it_even_without_the_failure_sensor(stack, conn):
    base, fake, pipeline = stack
    deliver(base, url(1), page(1))
    deliver(base, url(2), page(2))
    request = pipeline.tick(execute=False).result.run_requests[0]
    # A run of that batch that dies before applying anything (config it cannot read); the failure
    # sensor is never evaluated here: only the next delivery_sensor tick sees the run ended.
    broken = {"ops": {"index_pages": {"config": {**request.run_config["ops"]["index_pages"]["config"],
                                                 "attempts": [0]}}}}
    outcome = pipeline.job.execute_in_process(run_config=broken, instance=pipeline.instance, tags=request.tags,
                                              raise_on_error=False)
    assert not outcome.success
    # The next tick's reconciler frees the pages, a try counted on each, and the same tick (no
    # backoff here) puts them into a new batch under a new run key.
    again = pipeline.tick()
    assert sorted(again.partitions) == [url(1), url(2)]
    assert again.result.run_requests[0].run_key != request.run_key
    rows = conn.execute("SELECT outcome, attempts FROM deliveries ORDER BY id").fetchall()
    assert rows == [("embedded", 1), ("embedded", 1)]
    reasons = [r[0] for r in conn.execute("SELECT end_reason FROM batches ORDER BY requested_at")]
    assert "its run ended (FAILURE)" in reasons[0] and reasons[1] == "applied"


def test_a_tick_past_its_routing_budget_sends_what_it_routed_and_leaves_the_rest_for_the_next(stack, conn,
                                                                                               monkeypatch):
    """A tick must end within the daemon's 60 s: past ROUTE_BUDGET_S routing stops (after one chunk
    of 25), the pages it routed go into runs at once, and the next tick routes on from there."""
    from rag_pipeline.defs.index import sensors
    from rag_pipeline.ingest import routing

    base, fake, pipeline = stack
    monkeypatch.setattr(routing, "ROUTE_CHUNK", 25)
    for n in range(40):
        deliver(base, url(n), page(n))
    monkeypatch.setattr(sensors, "ROUTE_BUDGET_S", 0.0)
    first = pipeline.tick()
    assert len(first.partitions) == 25 and all(run.is_success for run in first.runs)
    assert conn.execute("SELECT count(*) FROM deliveries WHERE processed_at IS NULL").fetchone()[0] == 15
    second = pipeline.tick()
    assert sorted(first.partitions + second.partitions) == sorted(url(n) for n in range(40))
    assert conn.execute("SELECT count(*) FROM deliveries WHERE outcome = 'embedded'").fetchone()[0] == 40


def test_a_batch_another_reconciler_is_settling_is_left_to_it(stack, conn, database_url, monkeypatch):
    """Every code location's delivery_sensor reconciles (LOCATION_HOLDS): a batch locked by one of
    them is skipped by the others, so its pages are freed, and its run failed, once."""
    import psycopg

    from rag_pipeline.defs.index.reconciler import free_batch, reconcile
    from rag_pipeline.settings import load_settings
    from rag_pipeline.store import batch_leases

    base, fake, pipeline = stack
    deliver(base, url(1), page(1))
    (request,) = pipeline.tick(execute=False).result.run_requests
    key = request.tags["rag/batch"]
    conn.execute("UPDATE batches SET requested_at = now() - interval '1 hour'")   # never launched
    with psycopg.connect(database_url) as other, other.transaction():
        assert batch_leases.claim_open(other, key)    # another location's reconciler has it now
        assert reconcile(pipeline.instance, conn, load_settings())["freed_batches"] == 0
        # The failure sensor too takes the batch's row first, and leaves it to the one holding it.
        assert free_batch(conn, key, "its run failed", load_settings()) == []
        assert conn.execute("SELECT ended_at FROM batches").fetchone() == (None,)
    done = reconcile(pipeline.instance, conn, load_settings())
    assert done["freed_batches"] == 1 and done["freed_pages"] == 1
    assert reconcile(pipeline.instance, conn, load_settings())["freed_batches"] == 0   # ended: once
