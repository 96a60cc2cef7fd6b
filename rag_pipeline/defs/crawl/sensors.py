"""recrawl_sensor pushes the pages that are due; crawler_health_sensor reports crawler health
as check results on `pages`, so a paused crawler shows as a failed check in the UI."""

import json
import time
import uuid
from datetime import timedelta

import dagster as dg

from rag_pipeline.crawl import adaptive
from rag_pipeline.crawl.cadence import load_rules
from rag_pipeline.defs.crawl.checks import health_outcomes, to_evaluation
from rag_pipeline.defs.crawl.jobs import push_job, push_run_config
from rag_pipeline.defs.resources import CrawlerResource, PostgresResource, SettingsResource
from rag_pipeline.settings import Settings, SettingsError, load_settings
from rag_pipeline.store import pushes, schedule

# A claimed page is due again after this if its push run never recorded the push.
CLAIM_LEASE = timedelta(minutes=10)


def recrawl_sensor_every(interval_s: int) -> dg.SensorDefinition:
    """recrawl_sensor, ticking every `interval_s` (RECRAWL_INTERVAL_S: Dagster fixes a sensor's
    interval when the code location loads)."""
    return dg.sensor(
        name="recrawl_sensor",
        job=push_job,
        minimum_interval_seconds=interval_s,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Pushes the pages whose next_crawl_at has passed (each page by its own recrawl_every), "
            "RECRAWL_BATCH_SIZE per tick, as one run of the `push` job. Pages first seen through a "
            "delivery get their cadence from cadence.yaml here; every CADENCE_REFRESH_S each "
            "adaptable page's cadence is derived again from its estimated change rate and the "
            "crawl budget."
        ),
    )(push_due_pages)


def push_due_pages(context: dg.SensorEvaluationContext, postgres: PostgresResource,
                   settings: SettingsResource) -> dg.SensorResult:
    current = settings.get()
    rules = load_rules(current.cadence_file)
    refreshed_at = float(context.cursor or 0)
    now = time.time()
    with postgres.connect() as conn:
        with conn.transaction():
            expired = pushes.expire_pending(conn)
            assigned = schedule.assign_defaults(conn, rules.every_for, current.recrawl_batch_size)
        if now - refreshed_at >= current.cadence_refresh_s:
            with conn.transaction():
                context.log.info(adaptive.refresh(conn, rules, current, CLAIM_LEASE).summary())
            refreshed_at = now
        with conn.transaction():
            due = schedule.claim_due(conn, current.recrawl_batch_size, CLAIM_LEASE,
                                     rules.tombstone_recheck)
    if expired:
        context.log.warning(f"{expired} push(es) left pending by a push run that died: marked failed")
    cursor = str(refreshed_at)
    if not due:
        return dg.SensorResult(skip_reason=dg.SkipReason(
            f"no page due ({assigned} new page(s) given a cadence)"), cursor=cursor)
    urls = [t.page_url for t in due]
    return dg.SensorResult(run_requests=[dg.RunRequest(
        run_key=f"recrawl-{uuid.uuid4().hex[:12]}",
        run_config=push_run_config(urls, "schedule", [t.due_at for t in due]),
        tags={"rag/reason": "schedule", "rag/pages": str(len(urls))},
    )], cursor=cursor)


@dg.sensor(
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Reads the crawler's stats and the pushes table every minute and records the crawler "
        "checks on `pages`: paused crawler, growing waiting queue, pushes with no delivery."
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
        skip_reason=dg.SkipReason(f"{len(outcomes)} crawler checks recorded on `pages`, {said}; "
                                  f"{waiting} page(s) waiting at the crawler"),
    )


@dg.definitions
def defs() -> dg.Definitions:
    try:
        interval_s = load_settings().recrawl_interval_s
    except SettingsError:   # the bad setting fails the sensor's ticks, with its message, not the code location
        interval_s = Settings.model_fields["recrawl_interval_s"].default
    return dg.Definitions(sensors=[recrawl_sensor_every(interval_s), crawler_health_sensor])
