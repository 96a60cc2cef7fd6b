"""The newest evaluation of every check, read from the Dagster instance: what the UI shows, for
`rag-pipeline status`. Checks are evaluated by their own schedules; this only reads their records."""

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import dagster as dg

from rag_pipeline import compat


@dataclass(frozen=True)
class CheckState:
    check: str                    # "asset:check", as the UI names it
    state: str                    # passed | failed | errored (the check raised) | running | never evaluated
    severity: str | None          # WARN | ERROR, for a failed check
    description: str
    minutes_ago: float | None     # since its newest evaluation

    @property
    def failing(self) -> bool:
        return self.state in ("failed", "errored")

    def as_dict(self) -> dict:
        return asdict(self)


def instance_at(home: Path) -> dg.DagsterInstance | None:
    """The instance configured in ``home`` (a DAGSTER_HOME), or None when there is none."""
    if not (home / "dagster.yaml").is_file():
        return None
    return dg.DagsterInstance.from_config(str(home))


def latest(instance: dg.DagsterInstance, defs: dg.Definitions, now: float | None = None) -> list[CheckState]:
    """Every check of ``defs`` with its newest evaluation, failing ones first."""
    now = time.time() if now is None else now
    keys = sorted(defs.resolve_asset_graph().asset_check_keys, key=lambda k: k.to_user_string())
    records = compat.latest_check_records(instance, keys)
    states = [_state(key, records.get(key), instance, now) for key in keys]
    return sorted(states, key=lambda s: (not s.failing, s.state != "never evaluated", s.check))


def _state(key: dg.AssetCheckKey, record, instance: dg.DagsterInstance, now: float) -> CheckState:
    name = key.to_user_string()
    if record is None:
        return CheckState(name, "never evaluated", None, "no evaluation recorded yet", None)
    ago = round((now - record.create_timestamp) / 60, 1)
    if compat.check_record_planned(record):
        # Planned but never evaluated: still running, or its run failed before the check answered.
        run = instance.get_run_by_id(record.run_id)
        if run is not None and run.is_finished:
            return CheckState(name, "errored", "ERROR",
                              f"run {record.run_id} ended {run.status.value} before this check answered: "
                              "open the run in the Dagster UI for its error", ago)
        return CheckState(name, "running", None, f"being evaluated by run {record.run_id}", ago)
    evaluated = compat.evaluation_of(record)
    if evaluated is None:   # skipped, or its execution failed: no result to show
        return CheckState(name, "errored", "ERROR", f"run {record.run_id} recorded no result for this check", ago)
    evaluation, _ = evaluated
    return CheckState(name, "passed" if evaluation.passed else "failed",
                      None if evaluation.passed else evaluation.severity.value, evaluation.description or "", ago)
