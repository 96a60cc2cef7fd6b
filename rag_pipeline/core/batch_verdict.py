"""What to do with a batch that holds pages: wait for its run, or take the pages back.

A batch's pages are due again when nothing will ever apply them: its run ended without
finishing them, it never got a run, or its run's worker is gone (no heartbeat). A run that is
queued, starting, or beating is left alone, however slow, so a slow run is never cut short.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Dagster run statuses after which a run will do nothing more.
ENDED = frozenset({"SUCCESS", "FAILURE", "CANCELED"})
#: Statuses of a run that has not started its work yet (the queue, the launcher).
WAITING = frozenset({"QUEUED", "NOT_STARTED", "STARTING", "CANCELING", "MANAGED"})


@dataclass(frozen=True)
class Limits:
    start_grace_s: float        # a batch with no run after this was never launched
    heartbeat_timeout_s: float  # a started run whose worker was silent this long is gone
    startup_s: float            # from the run's start to its op's first heartbeat, at most


@dataclass(frozen=True)
class BatchView:
    batch_key: str
    requested_age_s: float
    run_status: str | None          # None: no run found with the batch's tag
    run_started_age_s: float | None  # since Dagster marked the run started
    heartbeat_age_s: float | None    # None: the op never beat


@dataclass(frozen=True)
class Verdict:
    action: str      # "wait", "free" (the run is over or absent), "fail" (mark the run failed, then free)
    reason: str = ""
    # Whether the pages' tries are spent: not when their run never started (a lost run request, a
    # launcher that never ran it), which says nothing about the pages: they go into a new batch
    # with their retry budget whole.
    charge: bool = True


def verdict(batch: BatchView, limits: Limits) -> Verdict:
    status = batch.run_status
    if status in ENDED:
        started = batch.run_started_age_s is not None
        return Verdict("free", f"its run ended ({status}) without finishing these pages"
                       + ("" if started else ", before it started"), charge=started)
    if status is None:
        if batch.requested_age_s > limits.start_grace_s:
            return Verdict("free", f"no run was launched for it in {batch.requested_age_s:.0f} s", charge=False)
        return Verdict("wait")
    if status in WAITING:
        return Verdict("wait")
    # STARTED (or a status this code does not know, treated as started).
    if batch.heartbeat_age_s is not None:
        if batch.heartbeat_age_s > limits.heartbeat_timeout_s:
            return Verdict("fail", f"its run's worker stopped beating {batch.heartbeat_age_s:.0f} s ago "
                                   "(killed, or its machine went down)")
        return Verdict("wait")
    started = batch.run_started_age_s
    if started is not None and started > limits.startup_s + limits.heartbeat_timeout_s:
        return Verdict("fail", f"its run started {started:.0f} s ago and its worker never reached the batch")
    return Verdict("wait")
