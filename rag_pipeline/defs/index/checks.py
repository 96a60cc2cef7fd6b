"""Checks of the whole index, on the `index` asset (each partition set's own are on its page
assets: set_checks.py).

index_snapshot_sensor evaluates them with every snapshot of `index`, in the same tick and after it:
Dagster greys out a check evaluated before its asset's newest materialization ("Not evaluated"),
and the snapshot is that materialization. The `index_checks` job runs them on demand (the UI's
"Execute"); none runs inside a page run, which should not pay for a query over the whole index.
"""

import threading
import time
from dataclasses import dataclass

import dagster as dg

from rag_pipeline.defs.index.assets import INDEX
from rag_pipeline.defs.index import set_checks
from rag_pipeline.defs.index.set_checks import result_fields
from rag_pipeline.defs.resources import EmbedderResource, PostgresResource, SettingsResource
from rag_pipeline.embedders.base import EmbeddingError
from rag_pipeline.settings import Settings
from rag_pipeline.store import invariants, spaces

INDEX_MATCHES_SOURCE = "indexed_hash_matches_source_hash"
NO_TOMBSTONED_CHUNKS = "no_chunk_of_a_tombstoned_page"
ONE_ACTIVE_SPACE = "every_chunk_in_the_active_space"
NO_STUCK_DELIVERIES = "no_stuck_deliveries"
INDEX_RUNS_SUCCEED = "index_runs_succeed"
QUEUE_DRAINS = "delivery_queue_drains"
EMBEDDING_API_ANSWERS = "embedding_api_answers"

#: The jobs whose runs apply pages: batches, a page by hand, re-chunks, and UI materializations.
INDEX_JOBS = ("index_batch", "index_page", "rechunk", "__ASSET_JOB")
PROBE_TEXT = "rag-pipeline health probe"


@dataclass(frozen=True)
class Inputs:
    """What the index checks read, in a run or in a sensor's tick."""

    instance: dg.DagsterInstance
    postgres: PostgresResource
    settings: Settings
    embedder: EmbedderResource
    #: Each partition-set check's findings by set, when the caller read them already.
    found: dict | None = None


def _whole(inputs: Inputs, step: str):
    """A partition-set check over the whole index: the sum of its findings by set, read once a
    tick for both (`inputs.found`), or here."""
    if inputs.found is None or step not in inputs.found:
        with inputs.postgres.connect() as conn:
            return set_checks.summed(set_checks.findings(conn, inputs.settings, [step])[step])
    return set_checks.summed(inputs.found[step])


def indexed_matches_source(inputs: Inputs) -> dict:
    return result_fields(_whole(inputs, "pages"), "live page(s) whose index lags their newest content",
                         dg.AssetCheckSeverity.WARN)


def no_tombstoned_chunks(inputs: Inputs) -> dict:
    return result_fields(_whole(inputs, "chunks"), "chunk(s) of tombstoned pages still searchable",
                         dg.AssetCheckSeverity.ERROR)


def every_chunk_in_active_space(inputs: Inputs) -> dict:
    return result_fields(_whole(inputs, "embeddings"), "chunk(s) outside the active embedding space",
                         dg.AssetCheckSeverity.ERROR)


def no_stuck_deliveries(inputs: Inputs) -> dict:
    with inputs.postgres.connect() as conn:
        finding = invariants.stuck_deliveries(conn, inputs.settings.check_grace_minutes)
    return result_fields(finding, "stuck deliveries", dg.AssetCheckSeverity.WARN)


def _newest_ended_index_runs(instance: dg.DagsterInstance, n: int) -> list[dg.RunRecord]:
    """The ``n`` newest runs of the index jobs that ended (succeeded or failed), newest first."""
    records = []
    for job in INDEX_JOBS:
        records += instance.get_run_records(dg.RunsFilter(
            job_name=job, statuses=[dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE]), limit=n)
    return sorted(records, key=lambda r: r.end_time or 0, reverse=True)[:n]


def index_runs_succeed(inputs: Inputs) -> dict:
    n = inputs.settings.check_failed_runs
    newest = _newest_ended_index_runs(inputs.instance, n)
    failed = [r.dagster_run.run_id for r in newest if r.dagster_run.status == dg.DagsterRunStatus.FAILURE]
    metadata = {"runs_looked_at": len(newest), "runs_failed": len(failed)}
    if len(newest) < n or len(failed) < len(newest):
        return {"passed": True, "severity": dg.AssetCheckSeverity.ERROR, "metadata": metadata,
                "description": f"{len(newest) - len(failed)} of the newest {len(newest)} index runs succeeded"}
    with inputs.postgres.connect() as conn:
        switched = invariants.pages_switched_by(conn, failed)
        reason = invariants.latest_page_error(conn)
    # Runs that still switched pages failed for some pages only (a page the model refuses, say):
    # worth a look. Runs that switched nothing mean nothing gets indexed at all.
    severity = dg.AssetCheckSeverity.WARN if switched else dg.AssetCheckSeverity.ERROR
    what = (f"they still switched {switched} pages: some pages fail on their own" if switched
            else "they switched no page: nothing is being indexed")
    return {"passed": False, "severity": severity,
            "metadata": {**metadata, "pages_switched": switched, "newest_failed_run": failed[0],
                         "page_error": reason or ""},
            "description": (f"the newest {len(failed)} index runs all failed (newest: {failed[0]}); {what}"
                            + (f"; pages fail with: {reason[:300].rstrip('.')}" if reason else "")
                            + ". Open the run in the Dagster UI for its error and fix the cause (embedding API key "
                              "or outage, database); the failed pages are retried on their own (RUN_RETRY_*).")}


def delivery_queue_drains(inputs: Inputs) -> dict:
    window = inputs.settings.check_window_minutes
    with inputs.postgres.connect() as conn:
        progress = invariants.queue_progress(conn, window)
    metadata = {"waiting": progress.waiting, "settled_in_window": progress.settled,
                "oldest_waiting_minutes": round(progress.oldest_minutes or 0.0, 1), "window_minutes": window}
    stalled = progress.waiting and (progress.oldest_minutes or 0) > window and progress.settled == 0
    if not stalled:
        return {"passed": True, "severity": dg.AssetCheckSeverity.ERROR, "metadata": metadata,
                "description": f"{progress.waiting} deliveries waiting, {progress.settled} settled in the last {window} min"}
    return {"passed": False, "severity": dg.AssetCheckSeverity.ERROR, "metadata": metadata,
            "description": (f"{progress.waiting} deliveries wait, the oldest for {progress.oldest_minutes:.0f} min, and "
                            f"none was applied in the last {window} min: is the Dagster daemon running with "
                            f"delivery_sensor on? If it is, see {INDEX_RUNS_SUCCEED} and the runs' errors.")}


#: A tick must not wait out an API's retries: the probe answers within this or fails.
PROBE_DEADLINE_S = 20.0


def embedding_api_answers(inputs: Inputs) -> dict:
    with inputs.postgres.connect() as conn:
        active = spaces.active(conn)
    answer: dict = {}

    def probe() -> None:
        try:
            model = inputs.embedder.for_space(active)
            started = time.perf_counter()
            model.embed([PROBE_TEXT])
            answer.update(model=model.model, seconds=round(time.perf_counter() - started, 3))
        except EmbeddingError as exc:
            answer["error"] = str(exc)
        except Exception as exc:   # noqa: BLE001 - the check says what went wrong, not "no answer"
            answer["error"] = f"{type(exc).__name__}: {exc}"

    worker = threading.Thread(target=probe, name="embedding-probe", daemon=True)
    worker.start()
    worker.join(PROBE_DEADLINE_S)
    named = active.model if active else "the configured one"
    if "model" in answer:
        return {"passed": True, "severity": dg.AssetCheckSeverity.ERROR, "metadata": answer,
                "description": f"{answer['model']} answered"}
    error = answer.get("error") or f"no answer within {PROBE_DEADLINE_S:g} s"
    return {"passed": False, "severity": dg.AssetCheckSeverity.ERROR, "metadata": {"error": error[:1000]},
            "description": (f"the embedding model of the index ({named}) failed: {error[:300]}. Check "
                            "OPENAI_API_KEY and OPENAI_BASE_URL, or the provider's status; pages wait and are retried.")}


#: name: (how it is evaluated, what it means), in the order the UI lists them.
INDEX_CHECKS = {
    INDEX_MATCHES_SOURCE: (indexed_matches_source,
                           "Search shows the newest content of every live page (after CHECK_GRACE_MINUTES)."),
    NO_TOMBSTONED_CHUNKS: (no_tombstoned_chunks, "A 404/410 page has no chunk left in search."),
    ONE_ACTIVE_SPACE: (every_chunk_in_active_space, "Every chunk carries a vector of the active embedding space."),
    NO_STUCK_DELIVERIES: (no_stuck_deliveries,
                          "No delivery waits unrouted, queued or failed for over CHECK_GRACE_MINUTES."),
    INDEX_RUNS_SUCCEED: (index_runs_succeed, "The newest CHECK_FAILED_RUNS runs that apply pages did not all fail."),
    QUEUE_DRAINS: (delivery_queue_drains,
                   "The delivery queue drains: fails when deliveries have waited over CHECK_WINDOW_MINUTES and none "
                   "was applied in that window (the daemon, its sensor or the runs are stuck)."),
    EMBEDDING_API_ANSWERS: (embedding_api_answers, "The active space's embedding model answers a one-line request."),
}


def evaluate(inputs: Inputs, names=None) -> list[tuple[str, dict]]:
    """Each index check's result fields. A check that raises fails alone, saying why: the others,
    and the snapshot they go with, are still recorded."""
    found = []
    for name, (check, _) in INDEX_CHECKS.items():
        if names is not None and name not in names:
            continue
        try:
            fields = check(inputs)
        except Exception as exc:   # noqa: BLE001 - reported as the check's own failure
            fields = {"passed": False, "severity": dg.AssetCheckSeverity.ERROR,
                      "metadata": {"error": f"{type(exc).__name__}: {exc}"[:1000]},
                      "description": f"could not be evaluated: {type(exc).__name__}: {str(exc)[:300]}"}
        found.append((name, fields))
    return found


def evaluations(inputs: Inputs) -> list[dg.AssetCheckEvaluation]:
    """The seven as a sensor reports them, runless, right after the `index` snapshot they go with."""
    return [dg.AssetCheckEvaluation(asset_key=INDEX, check_name=name, **fields) for name, fields in evaluate(inputs)]


@dg.multi_asset_check(
    specs=[dg.AssetCheckSpec(name, asset=INDEX, description=description)
           for name, (_, description) in INDEX_CHECKS.items()],
    name="index_checks_op", can_subset=True,
    description="The invariants of the whole index (also evaluated by index_snapshot_sensor with every snapshot).",
)
def index_checks(context: dg.AssetCheckExecutionContext, postgres: PostgresResource, settings: SettingsResource,
                 embedder: EmbedderResource):
    names = {key.name for key in context.selected_asset_check_keys}
    for name, fields in evaluate(Inputs(context.instance, postgres, settings.get(), embedder), names):
        yield dg.AssetCheckResult(asset_key=INDEX, check_name=name, **fields)


index_checks_job = dg.define_asset_job(
    name="index_checks",
    # These seven, not every check of `index`: crawler_health_sensor records the crawler's each minute.
    selection=dg.AssetSelection.checks(*(dg.AssetCheckKey(INDEX, name) for name in INDEX_CHECKS)),
    description="Invariants of the whole index: freshness of the switch, tombstones, embedding space, stuck deliveries.",
)
