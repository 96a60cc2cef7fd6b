"""Checks of the whole index, on the `index` asset (Dagster checks are per asset, not per
partition: on a site's or the catch-all's assets they would read as checks of those alone).

They run in their own job on a schedule, not inside every page run: each is one query over the
whole index, which a page run should not pay for.
"""

import time

import dagster as dg

from rag_pipeline.defs.index.assets import INDEX
from rag_pipeline.defs.resources import EmbedderResource, PostgresResource, SettingsResource
from rag_pipeline.embedders.base import EmbeddingError
from rag_pipeline.store import invariants, spaces

INDEX_MATCHES_SOURCE = "indexed_hash_matches_source_hash"
NO_TOMBSTONED_CHUNKS = "no_chunk_of_a_tombstoned_page"
ONE_ACTIVE_SPACE = "every_chunk_in_the_active_space"
NO_STUCK_DELIVERIES = "no_stuck_deliveries"
INDEX_RUNS_SUCCEED = "index_runs_succeed"
QUEUE_DRAINS = "delivery_queue_drains"
EMBEDDING_API_ANSWERS = "embedding_api_answers"

#: The jobs whose runs apply pages: batches, a page by hand, re-chunks, and UI materializations.
INDEX_JOBS = ("index_batch", "index_page", "rechunk", "__ASSET_JOB")
PROBE_TEXT = "rag-pipeline health probe"


def _result(finding: invariants.Finding, what: str, severity: dg.AssetCheckSeverity) -> dg.AssetCheckResult:
    description = f"{finding.count} {what}" + (f", e.g. {', '.join(finding.examples[:5])}" if finding.examples else "")
    return dg.AssetCheckResult(
        passed=finding.count == 0,
        severity=severity,
        description=description if finding.count else f"no {what}",
        metadata={"count": finding.count, "examples": dg.MetadataValue.json(finding.examples)},
    )


@dg.asset_check(asset=INDEX, name=INDEX_MATCHES_SOURCE,
                description="Search shows the newest content of every live page (after CHECK_GRACE_MINUTES).")
def indexed_matches_source(postgres: PostgresResource, settings: SettingsResource) -> dg.AssetCheckResult:
    with postgres.connect() as conn:
        finding = invariants.pages_behind_source(conn, settings.get().check_grace_minutes)
    return _result(finding, "live page(s) whose index lags their newest content", dg.AssetCheckSeverity.WARN)


@dg.asset_check(asset=INDEX, name=NO_TOMBSTONED_CHUNKS,
                description="A 404/410 page has no chunk left in search.")
def no_tombstoned_chunks(postgres: PostgresResource) -> dg.AssetCheckResult:
    with postgres.connect() as conn:
        finding = invariants.chunks_of_tombstoned_pages(conn)
    return _result(finding, "chunk(s) of tombstoned pages still searchable", dg.AssetCheckSeverity.ERROR)


@dg.asset_check(asset=INDEX, name=ONE_ACTIVE_SPACE,
                description="Every chunk carries a vector of the active embedding space.")
def every_chunk_in_active_space(postgres: PostgresResource) -> dg.AssetCheckResult:
    with postgres.connect() as conn:
        finding = invariants.chunks_outside_active_space(conn)
    return _result(finding, "chunk(s) outside the active embedding space", dg.AssetCheckSeverity.ERROR)


@dg.asset_check(asset=INDEX, name=NO_STUCK_DELIVERIES,
                description="No delivery waits unrouted, queued or failed for over CHECK_GRACE_MINUTES.")
def no_stuck_deliveries(postgres: PostgresResource, settings: SettingsResource) -> dg.AssetCheckResult:
    with postgres.connect() as conn:
        finding = invariants.stuck_deliveries(conn, settings.get().check_grace_minutes)
    return _result(finding, "stuck deliveries", dg.AssetCheckSeverity.WARN)


def _newest_ended_index_runs(instance: dg.DagsterInstance, n: int) -> list[dg.RunRecord]:
    """The ``n`` newest runs of the index jobs that ended (succeeded or failed), newest first."""
    records = []
    for job in INDEX_JOBS:
        records += instance.get_run_records(dg.RunsFilter(
            job_name=job, statuses=[dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE]), limit=n)
    return sorted(records, key=lambda r: r.end_time or 0, reverse=True)[:n]


@dg.asset_check(asset=INDEX, name=INDEX_RUNS_SUCCEED,
                description="The newest CHECK_FAILED_RUNS runs that apply pages did not all fail.")
def index_runs_succeed(context: dg.AssetCheckExecutionContext, postgres: PostgresResource,
                       settings: SettingsResource) -> dg.AssetCheckResult:
    n = settings.get().check_failed_runs
    newest = _newest_ended_index_runs(context.instance, n)
    failed = [r.dagster_run.run_id for r in newest if r.dagster_run.status == dg.DagsterRunStatus.FAILURE]
    metadata = {"runs_looked_at": len(newest), "runs_failed": len(failed)}
    if len(newest) < n or len(failed) < len(newest):
        return dg.AssetCheckResult(
            passed=True, severity=dg.AssetCheckSeverity.ERROR, metadata=metadata,
            description=f"{len(newest) - len(failed)} of the newest {len(newest)} index runs succeeded")
    with postgres.connect() as conn:
        switched = invariants.pages_switched_by(conn, failed)
        reason = invariants.latest_page_error(conn)
    # Runs that still switched pages failed for some pages only (a page the model refuses, say):
    # worth a look. Runs that switched nothing mean nothing gets indexed at all.
    severity = dg.AssetCheckSeverity.WARN if switched else dg.AssetCheckSeverity.ERROR
    what = (f"they still switched {switched} pages: some pages fail on their own" if switched
            else "they switched no page: nothing is being indexed")
    return dg.AssetCheckResult(
        passed=False, severity=severity,
        metadata={**metadata, "pages_switched": switched, "newest_failed_run": failed[0], "page_error": reason or ""},
        description=(f"the newest {len(failed)} index runs all failed (newest: {failed[0]}); {what}"
                     + (f"; pages fail with: {reason[:300].rstrip('.')}" if reason else "")
                     + ". Open the run in the Dagster UI for its error and fix the cause (embedding API key "
                       "or outage, database); the failed pages are retried on their own (RUN_RETRY_*)."))


@dg.asset_check(asset=INDEX, name=QUEUE_DRAINS,
                description=("The delivery queue drains: fails when deliveries have waited over CHECK_WINDOW_MINUTES "
                             "and none was applied in that window (the daemon, its sensor or the runs are stuck)."))
def delivery_queue_drains(postgres: PostgresResource, settings: SettingsResource) -> dg.AssetCheckResult:
    window = settings.get().check_window_minutes
    with postgres.connect() as conn:
        progress = invariants.queue_progress(conn, window)
    metadata = {"waiting": progress.waiting, "settled_in_window": progress.settled,
                "oldest_waiting_minutes": round(progress.oldest_minutes or 0.0, 1), "window_minutes": window}
    stalled = progress.waiting and (progress.oldest_minutes or 0) > window and progress.settled == 0
    if not stalled:
        return dg.AssetCheckResult(
            passed=True, severity=dg.AssetCheckSeverity.ERROR, metadata=metadata,
            description=f"{progress.waiting} deliveries waiting, {progress.settled} settled in the last {window} min")
    return dg.AssetCheckResult(
        passed=False, severity=dg.AssetCheckSeverity.ERROR, metadata=metadata,
        description=(f"{progress.waiting} deliveries wait, the oldest for {progress.oldest_minutes:.0f} min, and none "
                     f"was applied in the last {window} min: is the Dagster daemon running with delivery_sensor on? "
                     f"If it is, see {INDEX_RUNS_SUCCEED} and the runs' errors."))


@dg.asset_check(asset=INDEX, name=EMBEDDING_API_ANSWERS,
                description="The active space's embedding model answers a one-line request.")
def embedding_api_answers(postgres: PostgresResource, embedder: EmbedderResource) -> dg.AssetCheckResult:
    with postgres.connect() as conn:
        active = spaces.active(conn)
    try:
        model = embedder.for_space(active)
        started = time.perf_counter()
        model.embed([PROBE_TEXT])
    except EmbeddingError as exc:
        return dg.AssetCheckResult(
            passed=False, severity=dg.AssetCheckSeverity.ERROR, metadata={"error": str(exc)[:1000]},
            description=(f"the embedding model of the index ({active.model if active else 'the configured one'}) "
                         f"failed: {str(exc)[:300]}. Check OPENAI_API_KEY and OPENAI_BASE_URL, or the provider's "
                         "status; pages wait and are retried."))
    return dg.AssetCheckResult(
        passed=True, severity=dg.AssetCheckSeverity.ERROR,
        metadata={"model": model.model, "seconds": round(time.perf_counter() - started, 3)},
        description=f"{model.model} answered")


index_checks_job = dg.define_asset_job(
    name="index_checks",
    # These seven, not every check of `index`: crawler_health_sensor records the crawler's each minute.
    selection=dg.AssetSelection.checks(*(dg.AssetCheckKey(INDEX, name) for name in (
        INDEX_MATCHES_SOURCE, NO_TOMBSTONED_CHUNKS, ONE_ACTIVE_SPACE, NO_STUCK_DELIVERIES, INDEX_RUNS_SUCCEED,
        QUEUE_DRAINS, EMBEDDING_API_ANSWERS))),
    description="Invariants of the whole index: freshness of the switch, tombstones, embedding space, stuck deliveries.",
)

index_checks_schedule = dg.ScheduleDefinition(
    job=index_checks_job,
    cron_schedule="*/15 * * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
)
