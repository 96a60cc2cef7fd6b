"""delivery_sensor: turns stored crawler deliveries into batch runs, only for real changes."""

import uuid

import dagster as dg

from rag_pipeline.core.batching import plan_batches
from rag_pipeline.core.chunking import chunker_signature
from rag_pipeline.defs.index.batch import BATCH_TAG, PAGES_TAG, batch_run_config, index_batch
from rag_pipeline.defs.index.partitions import pages_partitions
from rag_pipeline.defs.resources import EmbedderResource, PostgresResource
from rag_pipeline.ingest.routing import route_batch
from rag_pipeline.settings import get_settings
from rag_pipeline.store import deliveries, pages, spaces


@dg.sensor(
    job=index_batch,
    minimum_interval_seconds=15,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Routes new deliveries in receipt order: unchanged pages are stamped verified, 404/410 "
        "tombstoned, crawler failures skipped; the new or changed pages go into batch runs "
        "(BATCH_MAX_PAGES and BATCH_MAX_TOKENS each), every page on its own partition."
    ),
)
def delivery_sensor(context: dg.SensorEvaluationContext, postgres: PostgresResource) -> dg.SensorResult:
    settings = get_settings()
    requests: list[dg.RunRequest] = []
    with postgres.connect() as conn:
        routed = route_batch(conn, settings.sensor_batch_size, settings.webhook_max_page_bytes)
        retries = deliveries.claim_due_retries(conn, settings.sensor_batch_size)
        # Every queued page no live batch holds, whether routed now, due for a retry, or freed by a
        # batch that never ran or died (its lease ran out): nothing depends on one tick succeeding.
        work = deliveries.queued_work(conn, settings.sensor_batch_size)
        conn.commit()
        for batch in plan_batches(work, settings.batch_max_pages, settings.batch_max_tokens):
            key = uuid.uuid4().hex[:16]
            with conn.transaction():
                leased = set(pages.lease(conn, [i.page_url for i in batch], key, settings.batch_lease_s))
            items = [i for i in batch if i.page_url in leased]
            if items:
                # A run_key per lease: a batch whose run was lost is requested again under a new key.
                requests.append(dg.RunRequest(
                    run_key=f"batch-{key}", run_config=batch_run_config(key, items),
                    tags={BATCH_TAG: key, PAGES_TAG: str(len(items))}))
    if not routed.routed and not requests:
        return dg.SensorResult(skip_reason=dg.SkipReason("no new deliveries"))
    urls = sorted({url for r in requests for url in batch_pages_of(r)})
    # Added here, in one upsert, before any run of them starts. (A dynamic_partitions_request
    # would have the daemon look each key up on its own connection first: ~10 ms a key, 20 s for
    # the 2,000 pages of one tick of an initial load.)
    context.instance.add_dynamic_partitions(pages_partitions.name, urls)
    context.log.info("routed %s; %d page(s) in %d batch run(s), %d retried",
                     dict(routed.outcomes), len(urls), len(requests), len(retries))
    return dg.SensorResult(run_requests=requests)


@dg.run_failure_sensor(
    monitored_jobs=[index_batch],
    minimum_interval_seconds=15,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "A batch run that ended without finishing its pages (a crash, a kill, a database outage) "
        "frees them at once, counting a failed try for each; failures of single pages are "
        "recorded by the batch itself."
    ),
)
def delivery_failure_sensor(context: dg.RunFailureSensorContext, postgres: PostgresResource) -> None:
    key = context.dagster_run.tags.get(BATCH_TAG)
    if key is None:
        return  # launched by hand from the launchpad: no lease of ours
    reason = context.failure_event.message or "run failed"
    settings = get_settings()
    with postgres.connect() as conn, conn.transaction():
        freed = pages.release_batch(conn, key)
        for url in freed:
            pending = deliveries.newest_queued(conn, url)
            if pending is None:
                continue
            deliveries.record_run_failure(
                conn, pending.id, deliveries.attempts_of(conn, pending.id),
                f"the batch run {context.dagster_run.run_id} ended before applying this page: {reason}",
                retryable=True, max_attempts=settings.run_retry_max_attempts,
                backoff_s=settings.run_retry_backoff_s,
            )
    if freed:
        context.log.warning(f"batch {key}: {len(freed)} unfinished page(s) freed for a retry")


@dg.sensor(
    job=index_batch,
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.STOPPED,
    description=(
        "Re-chunks, in batch runs (BATCH_MAX_PAGES, BATCH_MAX_TOKENS), the pages whose chunker "
        "version or budget is outdated. Off by default: price it first with "
        "`rag-pipeline backfill plan`, then turn it on."
    ),
)
def rechunk_sensor(
    context: dg.SensorEvaluationContext, postgres: PostgresResource, embedder: EmbedderResource
) -> dg.SensorResult:
    settings = get_settings()
    requests: list[dg.RunRequest] = []
    with postgres.connect() as conn:
        # The budget of the model pages are embedded with (the active space's): a key set for
        # answers must not make a local index due for a re-cut.
        max_tokens, overlap_tokens = embedder.chunk_budget(spaces.active(conn))
        signature = chunker_signature(max_tokens, overlap_tokens)
        work = pages.outdated_work(conn, signature, settings.sensor_batch_size)
        conn.commit()
        for batch in plan_batches(work, settings.batch_max_pages, settings.batch_max_tokens):
            key = uuid.uuid4().hex[:16]
            with conn.transaction():
                leased = set(pages.lease(conn, [i.page_url for i in batch], key, settings.batch_lease_s))
            items = [i for i in batch if i.page_url in leased]
            if items:
                requests.append(dg.RunRequest(
                    run_key=f"rechunk-{key}", run_config=batch_run_config(key, items, rechunk=True),
                    tags={BATCH_TAG: key, PAGES_TAG: str(len(items)), "rag/chunker": signature}))
    if not requests:
        return dg.SensorResult(skip_reason=dg.SkipReason(f"every page is cut with {signature}"))
    context.log.info("re-chunking %d page(s) with %s in %d batch run(s)",
                     sum(len(batch_pages_of(r)) for r in requests), signature, len(requests))
    return dg.SensorResult(run_requests=requests)


def batch_pages_of(request: dg.RunRequest) -> list[str]:
    return list(request.run_config["ops"]["index_pages"]["config"]["page_urls"])
