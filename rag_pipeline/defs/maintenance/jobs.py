"""Housekeeping runs: retention of deliveries, pushes and unused vectors (rag_pipeline/store/retention.py).

An op job, not an asset: pruning produces no data anyone reads, only makes old rows go. Its counts
land in the run's metadata and log."""

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
        "transactions": sum(result.batches.values()),
        "seconds": result.seconds,
        "retention_days": dg.MetadataValue.json(policy.days()),
    })


@dg.job(name="prune", description="Retention: delete what the index no longer needs (config: dry_run).",
        tags={"rag/kind": "maintenance"})
def prune_job():
    prune_storage()
