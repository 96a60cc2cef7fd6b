"""Batch runs through the real Dagster daemon: its sensor ticks, its run launcher, its worker processes."""

from __future__ import annotations

import os
import signal
import time
import uuid

import dagster as dg
import psycopg
import pytest

from rag_pipeline.store import db
from rag_pipeline_tests.daemons import daemon_stack
from rag_pipeline_tests.harness import deliver


def url(n: int) -> str:
    return f"https://docs.example.com/daemon/{n}"


def page(n: int, extra: str = "") -> str:
    return (f"# Page {n}\n\nPage {n} explains the heron gate number {n}.{extra}\n\n"
            f"## Setup\n\nGate {n} opens at {n % 12} o'clock and closes at dusk.")


@pytest.fixture
def stack(database_url, tmp_path, monkeypatch):
    dagster_url = db.as_url(db.with_database(database_url, f"dagster_{uuid.uuid4().hex[:8]}"))
    with daemon_stack(database_url, dagster_url, tmp_path, monkeypatch) as parts:
        yield parts


def applied(conn, n: int) -> bool:
    return conn.execute("SELECT count(*) FROM deliveries WHERE outcome = 'embedded'").fetchone()[0] >= n


def sources_taken(conn) -> int:
    """Pages whose run took their delivery as source (its `pages` step committed), not switched yet."""
    return conn.execute("SELECT count(*) FROM pages WHERE source_delivery_id IS NOT NULL"
                        " AND indexed_hash IS DISTINCT FROM source_hash").fetchone()[0]


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


def test_a_batch_killed_mid_way_leaves_pages_switched_or_due_and_the_retry_finishes(stack, conn):
    """A batch switches its pages together (one transaction): killed between its steps (sources
    taken and chunks staged, the embedding under way), every page is still due, and the retry
    applies each once."""
    base, fake, start = stack
    pages = 120
    for n in range(pages):
        deliver(base, url(n), page(n))
    fake.delay(60)   # the run waits in its embedding request: between its steps
    daemon = start()

    def worker_pid() -> int | None:
        runs = daemon.batch_runs()
        events = runs and daemon.instance.all_logs(runs[0].run_id, of_type=dg.DagsterEventType.STEP_START)
        return events[0].dagster_event.pid if events else None

    worker = daemon.wait(worker_pid, 120, "the batch run's worker")
    daemon.wait(lambda: sources_taken(conn) == pages and conn.execute(
        "SELECT count(DISTINCT page_id) FROM staged_chunks").fetchone()[0] == pages, 120, "the batch's chunks staged")
    (killed_run,) = daemon.batch_runs()
    os.kill(worker, signal.SIGKILL)
    killed_at = time.monotonic()
    fake.delay(0)
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as peek:
        rows = peek.execute(
            "SELECT p.indexed_hash IS NOT DISTINCT FROM p.source_hash AND p.indexed_hash IS NOT NULL, d.outcome"
            " FROM deliveries d JOIN pages p ON p.url = d.page_url").fetchall()
    # Right after the kill: every page is either switched in (its delivery applied) or still due.
    assert all((switched and outcome == "embedded") or (not switched and outcome == "queued")
               for switched, outcome in rows), rows
    assert sum(1 for switched, _ in rows if not switched) == pages, "the kill landed after the switch"

    daemon.wait(lambda: applied(conn, pages), 150, "every page applied after the kill")
    assert conn.execute("SELECT count(*) FROM pages WHERE indexed_hash = source_hash").fetchone()[0] == pages
    assert conn.execute("SELECT count(DISTINCT outcome) FROM deliveries").fetchone()[0] == 1
    assert conn.execute("SELECT count(*) FROM staged_chunks").fetchone()[0] == 0
    # Each page switched in once.
    assert conn.execute("SELECT count(*) FROM embedding_ledger").fetchone()[0] == pages
    # Within a tick or two, not a lease of 30 minutes. A worker killed alone is seen dying by its
    # code server, which marks the run failed (the daemon's kill, below, takes the code server too).
    assert time.monotonic() - killed_at < 60
    assert daemon.instance.get_run_by_id(killed_run.run_id).status == dg.DagsterRunStatus.FAILURE
    reason = conn.execute("SELECT end_reason FROM batches ORDER BY requested_at LIMIT 1").fetchone()[0]
    assert "failed" in reason or "FAILURE" in reason, reason


def test_a_daemon_killed_with_its_run_leaves_no_run_started_and_its_pages_are_applied_after_restart(
        stack, conn):
    base, fake, start = stack
    pages = 120
    for n in range(pages):
        deliver(base, url(n), page(n))
    fake.delay(60)   # the run waits in its embedding request
    daemon = start()
    daemon.wait(lambda: sources_taken(conn) == pages or None, 120, "the batch's sources taken")
    # The daemon, its code server and the run's worker, all at once (as a crash or a reboot would).
    os.killpg(daemon.proc.pid, signal.SIGKILL)
    daemon.proc.wait(10)
    fake.delay(0)
    killed_at = time.monotonic()
    (run,) = daemon.batch_runs()
    assert daemon.instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.STARTED
    assert not applied(conn, pages)

    restarted = start()
    restarted.wait(lambda: applied(conn, pages), 150, "every page applied after the restart")
    assert conn.execute("SELECT count(*) FROM embedding_ledger").fetchone()[0] == pages
    restarted.wait(lambda: restarted.instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.FAILURE,
                   30, "the killed run marked failed")
    assert time.monotonic() - killed_at < 120
    # Every run ends, the retry included: none stays STARTED.
    restarted.wait(lambda: all(r.is_finished for r in restarted.batch_runs()), 60, "every batch run to end")
    # Nobody saw that worker die: its silence did (BATCH_HEARTBEAT_TIMEOUT_S=5 here).
    reason = conn.execute("SELECT end_reason FROM batches ORDER BY requested_at LIMIT 1").fetchone()[0]
    assert "stopped beating" in reason, reason


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


def long_page(n: int, extra: str = "") -> str:
    """A page of several paragraphs: a smaller chunk budget cuts it into new texts."""
    paragraphs = [f"Paragraph {i} of page {n} tells how the heron gate {n} works on day {i}, "
                  f"which lever opens it and why the keeper logs it.{extra if i == 3 else ''}"
                  for i in range(6)]
    return f"# Page {n}\n\n" + "\n\n".join(paragraphs)


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


def test_an_embedding_outage_fails_batches_that_retry_with_backoff_until_every_page_converges(stack, conn):
    """The embedding API down (every request 503), then back: no manual action, no text paid twice.
    Scaled down from 10 minutes: retries 2 s, 8 s, 32 s, 128 s after each failure (×4)."""
    base, fake, start = stack
    pages = 12
    fake.outage(503)
    for n in range(pages):
        deliver(base, url(n), page(n))
    daemon = start(RUN_RETRY_BACKOFF_S="2", RUN_RETRY_MAX_ATTEMPTS="6")

    def failed_twice() -> bool:
        return conn.execute("SELECT min(attempts) FROM deliveries").fetchone()[0] >= 2
    daemon.wait(failed_twice, 150, "every page to fail a second time during the outage")
    down = daemon.wait(lambda: [r for r in daemon.batch_runs() if r.is_finished][1:] and
                       [r for r in daemon.batch_runs() if r.is_finished], 60, "the second failed run to end")
    assert all(r.status == dg.DagsterRunStatus.FAILURE for r in down)
    assert conn.execute("SELECT count(*) FROM chunks").fetchone()[0] == 0
    outcomes = conn.execute("SELECT DISTINCT outcome FROM deliveries").fetchall()
    assert set(outcomes) <= {("failed",), ("queued",)}
    assert fake.inputs == []                     # nothing was answered, so nothing was paid

    fake.recover()
    daemon.wait(lambda: applied(conn, pages), 240, "every page applied after the outage")
    attempts = [r[0] for r in conn.execute("SELECT attempts FROM deliveries").fetchall()]
    assert min(attempts) >= 2 and max(attempts) < 6
    inputs = fake.inputs
    assert len(inputs) == len(set(inputs))       # each text embedded once
    assert conn.execute("SELECT count(*) FROM pages WHERE indexed_hash = source_hash").fetchone()[0] == pages
