"""rechunk_sensor: re-cuts the pages a chunker change made outdated, in batch runs fed as fast as
they finish.

Its first tick for a chunker signature plans the re-chunk on a sample of pages and records the plan
(rows written, tokens, cost, time at the measured pace) in the database and as an observation of
the `index` asset. Each tick marks the re-chunk under way, so that its rows count in the bulk-load
policy (bulk_index.index_upkeep): the search indexes make way before its first batch when it
rewrites most rows. It keeps up to RUNS_AHEAD runs a BATCH_SPREAD slot queued or running, and
leases only what fills them: pages are never held by a run that waits behind a long queue, and
the queue never runs dry between ticks.
"""

import dagster as dg

from rag_pipeline.core.chunking import chunker_signature
from rag_pipeline.defs.index.batch_runs import index_batch, pages_of, request_batches
from rag_pipeline.defs.index.bulk_index import index_upkeep
from rag_pipeline.defs.index.rechunk_plan import record_plan
from rag_pipeline.defs.index.sensors import location_holds
from rag_pipeline.defs.unended_runs import PENDING_STATUSES
from rag_pipeline.defs.resources import EmbedderResource, PostgresResource, SettingsResource
from rag_pipeline.ingest.backfill import plan_lines
from rag_pipeline.store import pages, rechunks, spaces

CHUNKER_TAG = "rag/chunker"
RECHUNK_INTERVAL_S = 15
# Runs of a re-chunk kept queued or running, per BATCH_SPREAD slot: one at work, one ready.
RUNS_AHEAD = 2


@dg.sensor(
    job=index_batch,
    minimum_interval_seconds=RECHUNK_INTERVAL_S,
    default_status=dg.DefaultSensorStatus.STOPPED,
    description=(
        "Re-chunks, in batch runs (BATCH_MAX_PAGES, BATCH_MAX_TOKENS), the pages whose chunker "
        "version or budget is outdated, keeping 2 runs a BATCH_SPREAD slot queued or running. Its "
        "first tick records the plan on the `index` asset. A re-chunk that rewrites most vector rows "
        "is a bulk load: the search indexes make way and are built again at its end. Off by default: "
        "price it first with `rag-pipeline backfill plan`, then turn it on."
    ),
)
def rechunk_sensor(
    context: dg.SensorEvaluationContext, postgres: PostgresResource, embedder: EmbedderResource,
    settings: SettingsResource,
) -> dg.SensorResult:
    current = settings.get()
    holds = location_holds(current)
    with postgres.connect() as conn:
        # The budget of the model pages are embedded with (the active space's): a key set for
        # answers must not make a local index due for a re-cut.
        active = spaces.active(conn)
        budget = embedder.chunk_budget(active)
        signature = chunker_signature(*budget)
        if not pages.count_chunked_otherwise(conn, signature):
            return dg.SensorResult(skip_reason=dg.SkipReason(f"every page is cut with {signature}"))
        planned = record_plan(conn, active, budget, current.resolved_embedding_price())
        with conn.transaction():
            rechunks.seen(conn, signature)
        if planned is not None:
            context.log.info("\n".join(plan_lines(planned[1])))
        # Around a bulk load the indexes make way before the first batch (`main`'s duty alone).
        _, upkeep = index_upkeep(context.instance, conn, current, rebuild=False) if holds.holds_main() else (None, None)
        if upkeep:
            context.log.info(upkeep)
        free = RUNS_AHEAD * current.batch_spread - in_flight(context.instance, signature)
        work = pages.outdated_work(conn, signature, free * current.batch_max_pages, holds) if free > 0 else []
        # Spread over BATCH_SPREAD runs at least, as a delivery tick's: a small re-chunk's runs
        # share the cores too.
        requests = request_batches(conn, work, current, rechunk=True, tags={CHUNKER_TAG: signature},
                                   max_batches=max(free, 0))
    # The plan is shown on `index`, which `main` holds (LOCATION_HOLDS); the table has it anyway.
    events = [planned[0]] if planned is not None and holds.holds_main() else []
    if not requests:
        waiting = (f"{RUNS_AHEAD * current.batch_spread} re-chunk run(s) queued or running" if free <= 0
                   else "the outdated pages are held by batches under way")
        return dg.SensorResult(asset_events=events, skip_reason=dg.SkipReason(f"re-chunk to {signature}: {waiting}"))
    context.log.info("re-chunking %d page(s) with %s in %d batch run(s)",
                     sum(len(pages_of(r)) for r in requests), signature, len(requests))
    return dg.SensorResult(run_requests=requests, asset_events=events)


def in_flight(instance: dg.DagsterInstance, signature: str) -> int:
    """The re-chunk's batch runs queued or under way."""
    return instance.get_runs_count(dg.RunsFilter(job_name=index_batch.name, statuses=PENDING_STATUSES,
                                                 tags={CHUNKER_TAG: signature}))


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions(sensors=[rechunk_sensor])
