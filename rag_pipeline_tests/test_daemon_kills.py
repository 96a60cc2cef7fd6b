"""Batch runs through the real Dagster daemon when things die: a run killed mid-batch, the daemon killed
with its run, the embedding API away."""

from __future__ import annotations

import os
import signal
import time

import dagster as dg
import psycopg

from rag_pipeline_tests.daemon_pages import applied, page, sources_taken, url
from rag_pipeline_tests.harness import deliver


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
