"""The `index` asset: the index as a whole over time, recorded by index_snapshot_sensor.

Partitions show one page each; a data engineer also needs the whole: how many pages are live,
what each period's deliveries did, what embedding cost and what the hash gate and vector reuse
saved, how fresh the pages are. index_snapshot_sensor reports a runless materialization of
`index` every INDEX_SNAPSHOT_EVERY_S (288 events a day at the default 5 minutes), whose numeric
metadata Dagster plots as time series on the asset's page. Its full-table counts are a sensor of
their own: delivery_sensor's tick only routes and leases.
"""

from datetime import UTC, datetime, timedelta

import dagster as dg

from rag_pipeline.defs.index.assets import INDEX
from rag_pipeline.defs.index.checks import index_checks_job
from rag_pipeline.defs.resources import PostgresResource, SettingsResource
from rag_pipeline.settings import Settings
from rag_pipeline.store import crawl_observations, index_figures, schedule, spaces, text_search

index_asset = dg.AssetSpec(
    INDEX,
    group_name="index",
    deps=["embeddings"],
    kinds={"postgres"},
    description="The index as a whole, recorded every INDEX_SNAPSHOT_EVERY_S by index_snapshot_sensor: live and "
                "tombstoned pages, aliases, chunks, cached vectors; each period's deliveries by outcome, tokens "
                "embedded and avoided (hash gate, vector reuse), estimated cost and saving; freshness; the recrawl "
                "schedule (spread of estimated change rates and cadences, pushes planned a day and made, the "
                "crawl budget).",
)


def snapshot_event(conn, settings: Settings, since: datetime, now: datetime) -> dg.AssetMaterialization:
    figures = {**index_figures.snapshot(conn, since, now), **crawl_observations.schedule_figures(conn, since, now)}
    overdue, _ = schedule.overdue(conn)
    price = settings.resolved_embedding_price()
    avoided = figures["tokens_avoided_by_hash_gate"] + figures["tokens_avoided_by_reuse"]
    metadata: dict = {
        **figures,
        "pages_overdue": overdue,
        "period_minutes": round((now - since).total_seconds() / 60, 2),
        "cost_usd": round(figures["tokens_embedded"] / 1e6 * price, 6),
        "saved_usd": round(avoided / 1e6 * price, 6),
        "price_per_mtok_usd": price,
        # A local model costs nothing: what was avoided is priced at a hosted model's price instead,
        # named as such, so that "0" never reads as "nothing saved".
        "saved_usd_at_reference_price": round(avoided / 1e6 * settings.embedding_reference_price_per_mtok, 6),
        "reference_price_per_mtok_usd": settings.embedding_reference_price_per_mtok,
        "price_note": (f"{settings.resolved_embedding_provider()} model at {price:g} USD per million tokens"
                       if price else "local model: embedding costs nothing here; saved_usd_at_reference_price "
                                     "prices the tokens avoided at EMBEDDING_REFERENCE_PRICE_PER_MTOK"),
        # `hnsw` and `gin`, or `exact (…)` while the indexes make way for a bulk load: the UI says which.
        "vector_scan": spaces.search_scan(conn),
        "lexical_scan": text_search.lexical_scan(conn),
    }
    return dg.AssetMaterialization(asset_key=INDEX, metadata=metadata,
                                   description=f"the index at {now.astimezone(UTC).isoformat(timespec='seconds')}")


#: index_checks_schedule's period: checks older than this are asked for at once (the daemon just
#: started, or the schedule is off), not up to a period later.
CHECKS_EVERY_S = 15 * 60


def checks_due(instance: dg.DagsterInstance, now: datetime) -> bool:
    """No `index_checks` run yet (the first batch just switched), or none within its period."""
    records = instance.get_run_records(dg.RunsFilter(job_name=index_checks_job.name), limit=1)
    if not records:
        return True
    if not records[0].dagster_run.is_finished:
        return False
    return (now - records[0].create_timestamp).total_seconds() >= CHECKS_EVERY_S


def index_snapshot_sensor_every(interval_s: float) -> dg.SensorDefinition:
    """index_snapshot_sensor: records the `index` asset every `interval_s` (INDEX_SNAPSHOT_EVERY_S,
    fixed when the code location loads), and asks for the checks when they are due; it looks
    every minute at most (the daemon's loop is 5 s)."""

    @dg.sensor(name="index_snapshot_sensor", minimum_interval_seconds=max(5, min(60, int(interval_s))),
               jobs=[index_checks_job], default_status=dg.DefaultSensorStatus.RUNNING,
               description="Records the `index` asset (the whole index, plotted over time) every "
                           "INDEX_SNAPSHOT_EVERY_S from the first page switched in, and runs the index checks "
                           "after the first switch and on start, not up to 15 minutes later.")
    def index_snapshot_sensor(context: dg.SensorEvaluationContext, postgres: PostgresResource,
                              settings: SettingsResource) -> dg.SensorResult:
        current = settings.get()
        now = datetime.now(UTC)
        # The cursor: when the `index` asset was last recorded (epoch seconds).
        last = float(context.cursor) if context.cursor else None
        with postgres.connect() as conn:
            if not index_figures.any_switched(conn):
                # All zeros would say "empty" while the first batch is on its way.
                return dg.SensorResult(skip_reason=dg.SkipReason("no page is searchable yet"))
            requests = ([dg.RunRequest(job_name=index_checks_job.name, run_key=f"checks-{now.timestamp():.0f}")]
                        if checks_due(context.instance, now) else [])
            if last is not None and now.timestamp() - last < current.index_snapshot_every_s:
                if requests:
                    return dg.SensorResult(run_requests=requests)
                return dg.SensorResult(skip_reason=dg.SkipReason("the `index` asset is not due yet"))
            if last is not None:
                since = datetime.fromtimestamp(last, UTC)
            else:   # the first snapshot covers what led to the first switch
                since = min(filter(None, (index_figures.first_delivery_at(conn),
                                          now - timedelta(seconds=current.index_snapshot_every_s))))
            event = snapshot_event(conn, current, since, now)
        return dg.SensorResult(asset_events=[event], run_requests=requests, cursor=str(now.timestamp()))

    return index_snapshot_sensor
