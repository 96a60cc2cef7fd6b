"""delivery_sensor: turns stored crawler deliveries into page runs, only for real changes."""


import dagster as dg

from rag_pipeline.core.chunking import chunker_signature
from rag_pipeline.defs.index.jobs import index_page_job, rechunk_job
from rag_pipeline.defs.index.partitions import pages_partitions
from rag_pipeline.defs.resources import EmbedderResource, PostgresResource
from rag_pipeline.ingest.backfill import outdated_pages
from rag_pipeline.ingest.routing import route_batch
from rag_pipeline.settings import get_settings
from rag_pipeline.store import deliveries

REQUEUE_AFTER_MINUTES = 10


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
    if not routed.routed and not stale:
        return dg.SensorResult(skip_reason=dg.SkipReason("no new deliveries"))

    newest: dict[str, int] = dict(stale)
    for item in routed.queued:  # several deliveries of one page in a batch: one run applies the newest
        newest[item.page_url] = max(item.delivery_id, newest.get(item.page_url, 0))
    # Per-key lookups stay cheap with 100k partitions; listing them all each tick would not.
    new_keys = sorted(
        k for k in newest if not context.instance.has_dynamic_partition(pages_partitions.name, k)
    )
    context.log.info("routed %s", dict(routed.outcomes))
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(partition_key=url, run_key=f"delivery-{delivery_id}",
                          tags={"rag/delivery_id": str(delivery_id)})
            for url, delivery_id in sorted(newest.items())
        ],
        dynamic_partitions_requests=[pages_partitions.build_add_request(new_keys)] if new_keys else [],
    )


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
    max_tokens, overlap_tokens = embedder.settings().chunk_budget()
    signature = chunker_signature(max_tokens, overlap_tokens)
    with postgres.connect() as conn:
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
