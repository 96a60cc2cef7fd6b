"""delivery_sensor: turns stored crawler deliveries into page runs, only for real changes."""


import dagster as dg

from rag_pipeline.core.chunking import chunker_signature
from rag_pipeline.defs.index.assets import RETRYABLE_METADATA
from rag_pipeline.defs.index.jobs import index_page_job, rechunk_job
from rag_pipeline.defs.index.partitions import pages_partitions
from rag_pipeline.defs.resources import EmbedderResource, PostgresResource
from rag_pipeline.ingest.backfill import outdated_pages
from rag_pipeline.ingest.routing import route_batch
from rag_pipeline.settings import get_settings
from rag_pipeline.store import deliveries, spaces

REQUEUE_AFTER_MINUTES = 10
DELIVERY_TAG = "rag/delivery_id"
ATTEMPT_TAG = "rag/attempt"


@dg.sensor(
    job=index_page_job,
    minimum_interval_seconds=15,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Routes new deliveries in receipt order: unchanged pages are stamped verified, 404/410 "
        "tombstoned, crawler failures skipped; a new or changed page gets one run."
    ),
)
def delivery_sensor(context: dg.SensorEvaluationContext, postgres: PostgresResource) -> dg.SensorResult:
    settings = get_settings()
    with postgres.connect() as conn:
        routed = route_batch(conn, settings.sensor_batch_size, settings.webhook_max_page_bytes)
        # Routing commits before Dagster launches the runs: re-request what still waits. The same
        # run_key makes the daemon skip any run that was in fact launched.
        stale = deliveries.stale_queued(conn, REQUEUE_AFTER_MINUTES, settings.sensor_batch_size)
        retries = deliveries.claim_due_retries(conn, settings.sensor_batch_size)
    if not routed.routed and not stale and not retries:
        return dg.SensorResult(skip_reason=dg.SkipReason("no new deliveries"))

    # One run per page, for its newest delivery (the run applies the newest queued one anyway).
    newest: dict[str, deliveries.PendingRun] = {}
    fresh = [deliveries.PendingRun(q.page_url, q.delivery_id, 0) for q in routed.queued]
    for item in [*stale, *retries, *fresh]:
        if item.delivery_id > getattr(newest.get(item.page_url), "delivery_id", 0):
            newest[item.page_url] = item
    # Per-key lookups stay cheap with 100k partitions; listing them all each tick would not.
    new_keys = sorted(
        k for k in newest if not context.instance.has_dynamic_partition(pages_partitions.name, k)
    )
    context.log.info("routed %s; retrying %d failed run(s)", dict(routed.outcomes), len(retries))
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(partition_key=url, run_key=item.run_key,
                          tags={DELIVERY_TAG: str(item.delivery_id), ATTEMPT_TAG: str(item.attempts)})
            for url, item in sorted(newest.items())
        ],
        dynamic_partitions_requests=[pages_partitions.build_add_request(new_keys)] if new_keys else [],
    )


@dg.run_failure_sensor(
    monitored_jobs=[index_page_job],
    minimum_interval_seconds=15,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Schedules another try of a failed page run (backoff x4: by default 1, 4 and 16 min), "
        "unless the failure is one a retry cannot fix (a poisoned input, a model mismatch, "
        "data PostgreSQL refuses)."
    ),
)
def delivery_failure_sensor(context: dg.RunFailureSensorContext, postgres: PostgresResource) -> None:
    tags = context.dagster_run.tags
    if DELIVERY_TAG not in tags:
        return  # launched by hand from the UI: nothing of ours to retry
    delivery_id, attempt = int(tags[DELIVERY_TAG]), int(tags.get(ATTEMPT_TAG, "0"))
    steps = context.get_step_failure_events()
    retryable = all(_retryable(event) for event in steps)
    error = "; ".join(
        f"{event.step_key}: {_cause(event.step_failure_data.error)}"
        for event in steps if event.step_failure_data and event.step_failure_data.error
    ) or context.failure_event.message or "run failed"
    settings = get_settings()
    with postgres.connect() as conn, conn.transaction():
        due = deliveries.record_run_failure(
            conn, delivery_id, attempt, error,
            retryable=retryable, max_attempts=settings.run_retry_max_attempts,
            backoff_s=settings.run_retry_backoff_s,
        )
    if due is not None:
        context.log.info(f"delivery {delivery_id}: try {attempt + 2} due at {due.isoformat()}")
    else:
        context.log.warning(f"delivery {delivery_id}: not retried (attempt {attempt + 1}, retryable={retryable})")


def _cause(error) -> str:
    """The user's exception, not Dagster's wrapper around it."""
    while error.cause is not None and error.cls_name == "DagsterExecutionStepExecutionError":
        error = error.cause
    return error.message.strip()


def _retryable(event: dg.DagsterEvent) -> bool:
    data = event.step_failure_data
    user = data.user_failure_data if data else None
    flag = user.metadata.get(RETRYABLE_METADATA) if user and user.metadata else None
    return flag is None or bool(flag.value)


@dg.sensor(
    job=rechunk_job,
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.STOPPED,
    description=(
        "Re-chunks, in bounded batches, the pages whose chunker version or budget is outdated. "
        "Off by default: price it first with `rag-pipeline backfill plan`, then turn it on."
    ),
)
def rechunk_sensor(
    context: dg.SensorEvaluationContext, postgres: PostgresResource, embedder: EmbedderResource
) -> dg.SensorResult:
    with postgres.connect() as conn:
        # The budget of the model pages are embedded with (the active space's): a key set for
        # answers must not make a local index due for a re-cut.
        max_tokens, overlap_tokens = embedder.chunk_budget(spaces.active(conn))
        signature = chunker_signature(max_tokens, overlap_tokens)
        urls = outdated_pages(conn, signature, limit=get_settings().sensor_batch_size)
    if not urls:
        return dg.SensorResult(skip_reason=dg.SkipReason(f"every page is cut with {signature}"))
    # run_key per page and signature: a page is re-chunked once per chunker change.
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(partition_key=url, run_key=f"rechunk:{signature}:{url}",
                          tags={"rag/chunker": signature})
            for url in urls
        ]
    )
