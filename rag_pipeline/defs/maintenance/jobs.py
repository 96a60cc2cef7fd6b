"""Housekeeping runs: retention of deliveries, pushes, unused vectors, the ledger and retired spaces'
tables (rag_pipeline/store/retention.py, growth.py), and of Dagster's own finished runs.

An op job, not an asset: pruning produces no data anyone reads, only makes old rows go. Its counts
land in the run's metadata and log."""

from datetime import UTC, datetime, timedelta

import dagster as dg

from rag_pipeline.defs.resources import PostgresResource, SettingsResource
from rag_pipeline.store import retention


class PruneConfig(dg.Config):
    dry_run: bool = False               # count what would go, delete nothing


@dg.op(out=dg.Out(dg.Nothing),
       description="Delete settled deliveries, finished pushes and long-unused vectors past their retention.")
def prune_storage(context: dg.OpExecutionContext, config: PruneConfig, postgres: PostgresResource,
                  settings: SettingsResource) -> dg.Output:
    policy = retention.Policy.from_settings(settings.get())
    with postgres.connect() as conn:
        try:
            result = retention.prune(conn, policy, dry_run=config.dry_run)
        except retention.PruneBusy as exc:
            # The other prune does the same work; this run has nothing to add.
            context.log.warning(str(exc))
            return dg.Output(None, metadata={"skipped": str(exc)})
    context.log.info("; ".join(result.lines(policy)))
    return dg.Output(None, metadata={
        "dry_run": config.dry_run,
        "deliveries_deleted": result.deliveries,
        "pushes_deleted": result.pushes,
        "vectors_deleted": result.vectors,
        "vectors_unused_kept": result.vectors_unused,
        "ledger_rows_rolled_up": result.ledger_rolled_up,
        "retired_space_tables_dropped": dg.MetadataValue.json(result.retired_tables),
        "transactions": sum(result.batches.values()),
        "seconds": result.seconds,
        "retention_days": dg.MetadataValue.json(policy.days()),
    })


FINISHED = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]
# Runs whose events are no page's history: pushes, cadence refreshes, checks, index builds, prunes
# and each site's discovery readings (`<site>_discovery`). Index runs (`index_batch`, `index_page`,
# `rechunk`) are kept: their materializations are what the UI shows for each page's partition, and a
# page unchanged for months would look never indexed without them.
HOUSEKEEPING_JOBS = frozenset({"push", "seed", "recrawl_now", "cadence_refresh", "prune", "index_checks",
                               "space_index"})


def is_housekeeping(job_name: str) -> bool:
    return job_name in HOUSEKEEPING_JOBS or job_name.endswith("_discovery")


def delete_finished_runs(instance: dg.DagsterInstance, before: datetime, *, dry_run: bool = False,
                         page: int = 200) -> int:
    """Finished housekeeping runs last updated before ``before``, deleted with their event logs
    (Dagster keeps every run forever otherwise: a push run a minute, a checks run every 15). Runs
    in progress are never touched."""
    due, cursor = [], None
    while True:   # listed first, deleted after: a page's cursor must not be a run deleted meanwhile
        records = instance.get_run_records(filters=dg.RunsFilter(statuses=FINISHED, updated_before=before),
                                           limit=page, cursor=cursor)
        if not records:
            break
        due += [r.dagster_run.run_id for r in records if is_housekeeping(r.dagster_run.job_name)]
        cursor = records[-1].dagster_run.run_id
    for run_id in [] if dry_run else due:
        instance.delete_run(run_id)
    return len(due)


@dg.op(out=dg.Out(dg.Nothing), description="Delete finished housekeeping runs (pushes, checks, discovery…), and their events, past DAGSTER_RUN_RETENTION_DAYS.")
def prune_dagster_runs(context: dg.OpExecutionContext, config: PruneConfig, settings: SettingsResource) -> dg.Output:
    days = settings.get().dagster_run_retention_days
    if not days:
        return dg.Output(None, metadata={"runs_deleted": 0, "retention_days": "kept forever"})
    before = datetime.now(UTC) - timedelta(days=days)
    deleted = delete_finished_runs(context.instance, before, dry_run=config.dry_run)
    context.log.info(f"dagster runs: {'would delete' if config.dry_run else 'deleted'} {deleted} finished "
                     f"before {before:%Y-%m-%d %H:%M} UTC")
    return dg.Output(None, metadata={"dry_run": config.dry_run, "runs_deleted": deleted, "retention_days": days})


@dg.job(name="prune", description="Retention: delete what the index and Dagster no longer need (config: dry_run).",
        tags={"rag/kind": "maintenance"})
def prune_job():
    prune_storage()
    prune_dagster_runs()
