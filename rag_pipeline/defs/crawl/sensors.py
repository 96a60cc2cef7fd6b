"""recrawl_sensor pushes the pages that are due; crawler_health_sensor reports crawler health
as check results on `index`, so a paused crawler shows as a failed check in the UI."""

import json
import time
import uuid

import dagster as dg

from rag_pipeline.crawl.site_cadences import load_site_rules
from rag_pipeline.defs.crawl.checks import health_outcomes, to_evaluation
from rag_pipeline.defs.crawl.jobs import CLAIM_LEASE, cadence_refresh_job, push_job, push_run_config
from rag_pipeline.defs.resources import CrawlerResource, PostgresResource, SettingsResource
from rag_pipeline.defs.unended_runs import unended_run
from rag_pipeline.settings import at_load
from rag_pipeline.store import pushes, schedule

# A refresh run in one of these states is the refresh still to come: no second one is requested.
_REFRESH_PENDING = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
                    dg.DagsterRunStatus.CANCELING]
# A refresh run still going after this is failed by run monitoring (deploy/dagster.yaml): the default
# run launcher cannot tell a dead worker from a slow one, and a run left STARTED would hold off every
# refresh until the instance-wide max_runtime_seconds (an hour). A refresh takes 18-31 s at
# 100,000 pages.
REFRESH_MAX_RUNTIME_S = 900


def recrawl_sensor_every(interval_s: int) -> dg.SensorDefinition:
    """recrawl_sensor, ticking every `interval_s` (RECRAWL_INTERVAL_S: Dagster fixes a sensor's
    interval when the code location loads)."""
    return dg.sensor(
        name="recrawl_sensor",
        jobs=[push_job, cadence_refresh_job],
        minimum_interval_seconds=interval_s,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Pushes the pages whose next_crawl_at has passed (each page by its own recrawl_every), "
            "RECRAWL_BATCH_SIZE per tick, as one run of the `push` job. Pages first seen through a "
            "delivery get their cadence from cadence.yaml here; every CADENCE_REFRESH_S it requests "
            "a `cadence_refresh` run, which derives each adaptable page's cadence again from its "
            "estimated change rate and the crawl budget."
        ),
    )(push_due_pages)


def push_due_pages(context: dg.SensorEvaluationContext, postgres: PostgresResource,
                   settings: SettingsResource) -> dg.SensorResult:
    current = settings.get()
    now = time.time()
    # The first tick starts the clock: a new deployment has no observations to refresh from yet.
    refreshed_at = float(context.cursor) if context.cursor else now
    with postgres.connect() as conn:
        rules = load_site_rules(conn, current.cadence_file)
        with conn.transaction():
            expired = pushes.expire_pending(conn)
            assigned = schedule.assign_defaults(conn, rules.every_for, current.recrawl_batch_size)
        with conn.transaction():
            due = schedule.claim_due(conn, current.recrawl_batch_size, CLAIM_LEASE,
                                     rules.tombstone_recheck)
    if expired:
        context.log.warning(f"{expired} push(es) left pending by a push run that died: marked failed")
    requests = []
    if due:
        urls = [t.page_url for t in due]
        requests.append(dg.RunRequest(
            job_name=push_job.name, run_key=f"recrawl-{uuid.uuid4().hex[:12]}",
            run_config=push_run_config(urls, "schedule", [t.due_at for t in due]),
            tags={"rag/reason": "schedule", "rag/pages": str(len(urls))},
        ))
    refresh = ""
    if now - refreshed_at >= current.cadence_refresh_s:
        pending = _pending_refresh(context.instance)
        if pending:
            refresh = f"; the cadence refresh requested before (run {pending}) has not ended"
            context.log.info(f"cadence refresh due, but run {pending} has not ended: none requested")
        else:
            requests.append(dg.RunRequest(job_name=cadence_refresh_job.name,
                                          run_key=f"cadence-refresh-{now:.3f}",
                                          tags={"dagster/max_runtime": str(REFRESH_MAX_RUNTIME_S)}))
            refreshed_at = now
    cursor = str(refreshed_at)
    if not requests:
        return dg.SensorResult(skip_reason=dg.SkipReason(
            f"no page due ({assigned} new page(s) given a cadence){refresh}"), cursor=cursor)
    return dg.SensorResult(run_requests=requests, cursor=cursor)


def _pending_refresh(instance: dg.DagsterInstance) -> str | None:
    """The id of a refresh run not ended yet, if any."""
    return unended_run(instance, cadence_refresh_job.name, _REFRESH_PENDING)


@dg.sensor(
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Reads the crawler's stats and the pushes table every minute and records the crawler "
        "checks on `index`: paused crawler, growing waiting queue, pushes with no delivery."
    ),
)
def crawler_health_sensor(context: dg.SensorEvaluationContext, postgres: PostgresResource,
                          crawler: CrawlerResource, settings: SettingsResource) -> dg.SensorResult:
    history = json.loads(context.cursor)["waiting"] if context.cursor else []
    outcomes, waiting = health_outcomes(postgres, crawler, settings, history)
    failing = [o.check_name for o in outcomes if not o.passed]
    # No run to request: the tick's news is the checks it recorded, said so in the tick list (a
    # result without a reason reads "Sensor function returned an empty result" there).
    said = f"failing: {', '.join(failing)}" if failing else "all passing"
    return dg.SensorResult(
        asset_events=[to_evaluation(o) for o in outcomes],
        cursor=json.dumps({"waiting": (history + [waiting])[-10:]}),
        skip_reason=dg.SkipReason(f"{len(outcomes)} crawler checks recorded on `index`, {said}; "
                                  f"{waiting} page(s) waiting at the crawler"),
    )


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions(sensors=[recrawl_sensor_every(at_load("recrawl_interval_s")), crawler_health_sensor])
