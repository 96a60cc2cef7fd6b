"""When retention runs by itself."""

import dagster as dg

from rag_pipeline.defs.maintenance.jobs import prune_job

# Running by default: without it storage grows without bound (~10 GB/day of delivery bodies at a
# million pages recrawled daily), and what it deletes is settled history the index never reads
# again (the page text lives on `pages`), past conservative ages. Stop it in the UI, or keep one
# kind of row forever with its *_RETENTION_DAYS=0. At 03:17 UTC: off the hour, off peak.
prune_schedule = dg.ScheduleDefinition(
    job=prune_job,
    cron_schedule="17 3 * * *",
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Daily retention: settled deliveries, finished pushes, long-unused vectors, the ledger rolled up, retired spaces' tables, finished Dagster runs.",
)
