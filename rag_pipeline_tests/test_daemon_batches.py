"""Batch runs through the real Dagster daemon: its sensor ticks, its run launcher, its worker processes."""

from __future__ import annotations

import os
import time
import uuid

import dagster as dg

from rag_pipeline_tests.daemon_pages import applied, long_page, page, url
from rag_pipeline_tests.harness import deliver


def test_one_daemon_run_applies_the_tick_each_page_on_its_partition_a_poisoned_one_alone(stack, conn):
    base, fake, start = stack
    fake.poison("cormorant")
    for n in range(20):
        deliver(base, url(n), page(n, " A cormorant nests here." if n == 7 else ""))
    daemon = start()   # everything is delivered before the first tick: one tick's worth of pages

    runs = daemon.wait(lambda: [r for r in daemon.batch_runs() if r.is_finished] or None, 120, "the batch run")
    assert len(daemon.batch_runs()) == 1
    assert runs[0].status == dg.DagsterRunStatus.FAILURE       # red: one page needs a look
    outcomes = dict(conn.execute("SELECT page_url, outcome FROM deliveries").fetchall())
    assert outcomes.pop(url(7)) == "failed" and set(outcomes.values()) == {"embedded"}
    for n in range(20):
        records = daemon.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("embeddings"), asset_partitions=[url(n)]), limit=5).records
        if n == 7:
            assert records == []
            continue
        (record,) = records
        chunks = conn.execute("SELECT count(*) FROM chunks c JOIN pages p USING (page_id) WHERE p.url = %s",
                              (url(n),)).fetchone()[0]
        meta = record.asset_materialization.metadata
        assert record.run_id == runs[0].run_id and meta["chunks_total"].value == chunks > 0
        assert meta["status"].value == "switched"
    assert set(daemon.instance.get_dynamic_partitions("pages")) == {url(n) for n in range(20)}


def test_a_page_delivered_again_while_a_batch_holds_it_is_applied_after_it_newest_last(stack, conn):
    base, fake, start = stack
    fake.delay(4.0)                      # the batch holds the page while its embedding is slow
    deliver(base, url(1), page(1))
    daemon = start()

    def taken_not_switched():
        # The batch has taken the crawl as the page's source and is embedding it (slowly).
        row = conn.execute("SELECT p.source_delivery_id IS NOT NULL AND p.leased_until > now(), d.outcome"
                           " FROM pages p JOIN deliveries d ON d.page_url = p.url").fetchone()
        return bool(row and row[0] and row[1] == "queued")

    daemon.wait(taken_not_switched, 90, "the first batch to take the page")
    first = daemon.batch_runs()[0]
    deliver(base, url(1), page(1, " Revised: the gate moved to the pier."))
    assert conn.execute("SELECT outcome FROM deliveries ORDER BY id").fetchall()[0] == ("queued",)  # still held
    daemon.wait(lambda: applied(conn, 2), 120, "both crawls applied")

    rows = conn.execute("SELECT outcome, applied_at FROM deliveries ORDER BY id").fetchall()
    assert [r[0] for r in rows] == ["embedded", "embedded"] and rows[0][1] < rows[1][1]
    assert "Revised" in conn.execute("SELECT source_text FROM pages").fetchone()[0]
    runs = daemon.wait(lambda: [r for r in daemon.batch_runs() if r.is_finished] == daemon.batch_runs()
                       and daemon.batch_runs(), 60, "the runs to finish")
    assert len(runs) == 2 and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
    records = {r.run_id: daemon.instance.get_run_record_by_id(r.run_id) for r in runs}
    second = next(r for r in runs if r.run_id != first.run_id)
    # Never two batches on one page at once: the second started after the first had finished.
    assert records[second.run_id].start_time >= records[first.run_id].end_time
    assert conn.execute("SELECT count(*) FROM embedding_ledger").fetchone()[0] == 2


def test_a_ui_backfill_of_the_rechunk_job_runs_a_range_of_pages_a_run_a_poisoned_page_alone(stack, conn):
    """What the UI's "Materialize partitions" on the `rechunk` job launches: an asset backfill of
    `chunks` and `embeddings`, run by the daemon's backfill loop as partition ranges."""
    from dagster._core.execution.backfill import PartitionBackfill

    from rag_pipeline.core.chunking import chunker_signature
    from rag_pipeline_tests.harness import load_defs

    from rag_pipeline_tests.harness import Pipeline

    base, fake, start = stack
    pages = 30
    for n in range(pages):
        deliver(base, url(n), long_page(n, " A cormorant nests here." if n == 7 else ""))
    # The initial load in process (its delivery batches are tested above), in the daemon's instance.
    instance = dg.DagsterInstance.from_config(os.environ["DAGSTER_HOME"])
    try:
        tick = Pipeline(instance, load_defs()).tick()
        assert len(tick.partitions) == pages and applied(conn, pages)
    finally:
        instance.dispose()
    before = dict(conn.execute("SELECT url, chunker_version FROM pages").fetchall())

    # A smaller chunk budget makes every page due for a re-cut into new texts; page 7's new texts
    # are refused by the model from now on.
    fake.poison("cormorant")
    daemon = start(CHUNK_MAX_TOKENS="40", CHUNK_OVERLAP_TOKENS="0")
    keys = sorted(daemon.instance.get_dynamic_partitions("pages"))
    assert len(keys) == pages
    backfill_id = "rechunk" + uuid.uuid4().hex[:8]
    daemon.instance.add_backfill(PartitionBackfill.from_asset_partitions(
        backfill_id=backfill_id, asset_graph=load_defs().resolve_asset_graph(), partition_names=keys,
        asset_selection=[dg.AssetKey("chunks"), dg.AssetKey("embeddings")], backfill_timestamp=time.time(),
        tags={}, dynamic_partitions_store=daemon.instance, all_partitions=False, title=None,
        description=None, run_config=None))

    def ended():
        backfill = daemon.instance.get_backfill(backfill_id)
        runs = daemon.instance.get_runs(filters=dg.RunsFilter.for_backfill(backfill_id))
        return runs and all(r.is_finished for r in runs) and backfill.status.value != "REQUESTED" and runs
    runs = daemon.wait(ended, 180, "the backfill to end")

    assert len(runs) == 1, [r.tags for r in runs]            # 30 pages, one range, one run
    (run,) = runs
    assert run.status == dg.DagsterRunStatus.FAILURE       # red: one page needs a look
    failure = next(e for e in daemon.instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_FAILURE))
    assert url(7) in failure.dagster_event.step_failure_data.error.message
    signature = chunker_signature(40, 0)
    after = dict(conn.execute("SELECT url, chunker_version FROM pages").fetchall())
    assert after.pop(url(7)) == before[url(7)] != signature   # its old cut is still searchable
    assert set(after.values()) == {signature}
    assert conn.execute("SELECT count(*) FROM chunks c JOIN pages p USING (page_id) WHERE p.url = %s",
                        (url(7),)).fetchone()[0] > 0
    for n in range(pages):
        records = daemon.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("embeddings"), asset_partitions=[url(n)]), limit=5).records
        if n == 7:
            assert [r.run_id for r in records] != [run.run_id] and len(records) == 1   # the initial load's only
            (observed,) = daemon.instance.fetch_observations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey("embeddings"), asset_partitions=[url(n)]), limit=5).records
            assert observed.asset_observation.metadata["status"].value == "failed"
            continue
        latest = records[0]
        meta = latest.asset_materialization.metadata
        assert latest.run_id == run.run_id and meta["status"].value == "switched", (n, meta)
        assert meta["chunks_embedded"].value > 0 and meta["chunks_total"].value == conn.execute(
            "SELECT count(*) FROM chunks c JOIN pages p USING (page_id) WHERE p.url = %s", (url(n),)).fetchone()[0]
        chunk_records = daemon.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("chunks"), asset_partitions=[url(n)]), limit=1).records
        assert chunk_records[0].asset_materialization.metadata["chunker_version"].value == signature
    # No crawl and no delivery was touched: a re-cut works from the stored text.
    assert conn.execute("SELECT count(DISTINCT outcome) FROM deliveries").fetchone()[0] == 1
    # The backfill's first run planned the re-chunk, on the `index` asset, as rechunk_sensor would.
    (planned,) = daemon.instance.fetch_observations(dg.AssetKey("index"), limit=5).records
    plan = planned.asset_observation.metadata
    assert planned.run_id == run.run_id and plan["rechunk_to"].value == signature
    assert plan["plan_pages"].value == pages and plan["plan_rows_written"].value > 0
