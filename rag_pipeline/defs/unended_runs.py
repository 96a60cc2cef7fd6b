"""Runs of a job that have not ended: what a sensor asks before it requests another of the same."""

import dagster as dg

# Queued or under way: a run in one of these will still do its work.
PENDING_STATUSES = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
                    dg.DagsterRunStatus.STARTED]


def unended_run(instance: dg.DagsterInstance, job_name: str, statuses=PENDING_STATUSES) -> str | None:
    """The short id of a run of ``job_name`` in one of ``statuses``, if there is one."""
    records = instance.get_run_records(dg.RunsFilter(job_name=job_name, statuses=statuses), limit=1)
    return records[0].dagster_run.run_id[:8] if records else None
