"""Recovery that never depends on one evaluation succeeding: the reconciler, run on every
delivery_sensor tick, and the heartbeat a batch run's worker keeps while it works.

Each tick looks at every batch not ended (`batches`), finds its run by tag, and asks
`core.batch_verdict.verdict` what to do. A batch whose run ended without finishing its pages, never got
a run, or whose worker went silent gives its pages back, a failed try counted on each page's
pending delivery; its run, if Dagster still shows it started, is marked failed and its pool slot
freed. The same tick then leases the freed pages to a new batch under a new run key. So whatever
happened in between (a killed daemon, worker or code server, a reboot, a failure sensor that could
not reach the database), an acknowledged delivery is applied or superseded within about
BATCH_HEARTBEAT_TIMEOUT_S + a tick + a batch's own run time, plus its retry backoff when it fails.
"""

import logging
import threading
import time

import dagster as dg
import psycopg

from rag_pipeline.core.batch_verdict import BatchView, Limits, verdict
from rag_pipeline.store import batch_leases, deliveries, pages

BATCH_TAG = "rag/batch"
log = logging.getLogger(__name__)


def limits(settings) -> Limits:
    return Limits(start_grace_s=settings.batch_start_grace_s,
                  heartbeat_timeout_s=settings.batch_heartbeat_timeout_s,
                  startup_s=settings.batch_startup_s)


def free_batch(conn: psycopg.Connection, batch_key: str, reason: str, settings, *, charge: bool = True) -> list[str]:
    """Give back the pages a batch still holds, counting a failed try on each one's pending
    delivery (unless not `charge`d: its run never started), and end the batch. Returns the pages
    freed; uncharged ones are queued as they were, for the same tick's new batches."""
    with conn.transaction():
        # The batch's row first, then its pages, in every caller (the reconciler of any location,
        # the failure sensor): one of them settles a batch, in one lock order.
        if not batch_leases.claim_open(conn, batch_key):
            return []
        freed = pages.release_batch(conn, batch_key)
        for url in freed if charge else ():
            pending = deliveries.newest_queued(conn, url)
            if pending is None:
                continue
            deliveries.record_run_failure(
                conn, pending.id, deliveries.attempts_of(conn, pending.id),
                f"the batch {batch_key} did not apply this page: {reason}",
                retryable=True, max_attempts=settings.run_retry_max_attempts,
                backoff_s=settings.run_retry_backoff_s, max_backoff_s=settings.run_retry_backoff_max_s,
            )
        batch_leases.end(conn, batch_key, reason)
    return freed


def reconcile(instance: dg.DagsterInstance, conn: psycopg.Connection, settings) -> dict[str, int]:
    """One pass over the open batches; returns how many were freed and runs failed."""
    found = batch_leases.open_batches(conn)
    done = {"freed_batches": 0, "freed_pages": 0, "runs_failed": 0}
    if not found:
        return done
    records = instance.get_run_records(filters=dg.RunsFilter(tags={BATCH_TAG: [b.batch_key for b in found]}))
    by_key = {r.dagster_run.tags.get(BATCH_TAG): r for r in records}
    now = time.time()
    for batch in found:
        record = by_key.get(batch.batch_key)
        run = record.dagster_run if record else None
        view = BatchView(
            batch.batch_key, batch.requested_age_s, run.status.value if run else None,
            now - record.start_time if record and record.start_time else None, batch.heartbeat_age_s)
        decision = verdict(view, limits(settings))
        if decision.action == "wait":
            continue
        with conn.transaction():
            # Every code location reconciles: one of them settles each batch, and fails its run once.
            if not batch_leases.claim_open(conn, batch.batch_key):
                continue
            if decision.action == "fail" and run is not None:
                instance.report_run_failed(run, message=f"batch {batch.batch_key}: {decision.reason}; its pages "
                                                         "go into a new batch")
                instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
                done["runs_failed"] += 1
            freed = free_batch(conn, batch.batch_key, decision.reason, settings, charge=decision.charge)
        done["freed_batches"] += 1
        done["freed_pages"] += len(freed)
        log.warning("batch %s: %s; %d page(s) freed", batch.batch_key, decision.reason, len(freed))
    return done


class Heartbeat:
    """Beats for a batch from a connection of its own every `every_s` while the op works; a
    worker that is killed stops beating, which is how the reconciler tells it from a slow one."""

    def __init__(self, url: str, batch_key: str, every_s: float):
        self.url, self.batch_key, self.every_s = url, batch_key, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{batch_key}", daemon=True)

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(self.every_s + 10)

    def _run(self) -> None:
        conn = None
        while not self._stop.wait(self.every_s):
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.url, autocommit=True, connect_timeout=10)
                batch_leases.beat(conn, self.batch_key)
            except psycopg.Error as exc:  # the database away: beat again when it is back
                log.warning("batch %s: heartbeat failed: %s", self.batch_key, exc)
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()
