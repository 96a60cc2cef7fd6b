"""Checks of the whole index (Dagster checks are per asset, not per partition).

They run in their own job on a schedule, not inside every page run: each is one query over the
whole index, which a page run should not pay for.
"""

import dagster as dg

from rag_pipeline.defs.index.assets import embeddings
from rag_pipeline.defs.resources import PostgresResource
from rag_pipeline.store import health

PENDING_GRACE_MINUTES = 30

INDEX_MATCHES_SOURCE = "indexed_hash_matches_source_hash"
NO_TOMBSTONED_CHUNKS = "no_chunk_of_a_tombstoned_page"
ONE_ACTIVE_SPACE = "every_chunk_in_the_active_space"
NO_STUCK_DELIVERIES = "no_stuck_deliveries"


def _result(finding: health.Finding, what: str, severity: dg.AssetCheckSeverity) -> dg.AssetCheckResult:
    description = f"{finding.count} {what}" + (f", e.g. {', '.join(finding.examples[:5])}" if finding.examples else "")
    return dg.AssetCheckResult(
        passed=finding.count == 0,
        severity=severity,
        description=description if finding.count else f"no {what}",
        metadata={"count": finding.count, "examples": dg.MetadataValue.json(finding.examples)},
    )


@dg.asset_check(asset=embeddings, name=INDEX_MATCHES_SOURCE,
                description=f"Search shows the newest content of every live page (after {PENDING_GRACE_MINUTES} min).")
def indexed_matches_source(postgres: PostgresResource) -> dg.AssetCheckResult:
    with postgres.connect() as conn:
        finding = health.pages_behind_source(conn, PENDING_GRACE_MINUTES)
    return _result(finding, "live page(s) whose index lags their newest content", dg.AssetCheckSeverity.WARN)


@dg.asset_check(asset=embeddings, name=NO_TOMBSTONED_CHUNKS,
                description="A 404/410 page has no chunk left in search.")
def no_tombstoned_chunks(postgres: PostgresResource) -> dg.AssetCheckResult:
    with postgres.connect() as conn:
        finding = health.chunks_of_tombstoned_pages(conn)
    return _result(finding, "chunk(s) of tombstoned pages still searchable", dg.AssetCheckSeverity.ERROR)


@dg.asset_check(asset=embeddings, name=ONE_ACTIVE_SPACE,
                description="Every chunk carries a vector of the active embedding space.")
def every_chunk_in_active_space(postgres: PostgresResource) -> dg.AssetCheckResult:
    with postgres.connect() as conn:
        finding = health.chunks_outside_active_space(conn)
    return _result(finding, "chunk(s) outside the active embedding space", dg.AssetCheckSeverity.ERROR)


@dg.asset_check(asset=embeddings, name=NO_STUCK_DELIVERIES,
                description=f"No delivery waits unrouted, queued or failed for over {PENDING_GRACE_MINUTES} min.")
def no_stuck_deliveries(postgres: PostgresResource) -> dg.AssetCheckResult:
    with postgres.connect() as conn:
        finding = health.stuck_deliveries(conn, PENDING_GRACE_MINUTES)
    return _result(finding, "stuck deliveries", dg.AssetCheckSeverity.WARN)


index_checks_job = dg.define_asset_job(
    name="index_checks",
    selection=dg.AssetSelection.checks_for_assets(embeddings),
    description="Invariants of the whole index: freshness of the switch, tombstones, embedding space, stuck deliveries.",
)

index_checks_schedule = dg.ScheduleDefinition(
    job=index_checks_job,
    cron_schedule="*/15 * * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
)
