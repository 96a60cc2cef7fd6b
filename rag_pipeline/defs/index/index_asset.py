"""The `index` asset: the index as a whole over time, recorded by index_snapshot_sensor.

Partitions show one page each; a data engineer also needs the whole: how many pages are live,
what each period's deliveries did, what embedding cost and what the hash gate and vector reuse
saved, how fresh the pages are. index_snapshot_sensor reports a runless materialization of
`index` every INDEX_SNAPSHOT_EVERY_S (288 events a day at the default 5 minutes), whose numeric
metadata Dagster plots as time series on the asset's page. Its full-table counts are a sensor of
their own: delivery_sensor's tick only routes and leases.
"""

import json
from datetime import UTC, datetime, timedelta

import dagster as dg

from rag_pipeline import compat
from rag_pipeline.defs.index import checks, set_checks
from rag_pipeline.defs.index.assets import INDEX
from rag_pipeline.defs.resources import EmbedderResource, PostgresResource, SettingsResource
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


def index_snapshot_sensor_every(interval_s: float) -> dg.SensorDefinition:
    """index_snapshot_sensor: every `interval_s` (INDEX_SNAPSHOT_EVERY_S, fixed when the code
    location loads) it records the `index` asset and, in the same tick and after it, evaluates the
    index checks and every partition set's checks, so that the UI shows them as evaluated for that
    snapshot; it looks every minute at most (the daemon's loop is 5 s)."""

    @dg.sensor(name="index_snapshot_sensor", minimum_interval_seconds=max(5, min(60, int(interval_s))),
               default_status=dg.DefaultSensorStatus.RUNNING,
               description="Records the `index` asset (the whole index, plotted over time) every "
                           "INDEX_SNAPSHOT_EVERY_S, and with each snapshot evaluates the checks of `index` and "
                           "of every site's pages, chunks and embeddings. Before the first page is searchable it "
                           "evaluates the checks alone.")
    def index_snapshot_sensor(context: dg.SensorEvaluationContext, postgres: PostgresResource,
                              settings: SettingsResource, embedder: EmbedderResource) -> dg.SensorResult:
        current = settings.get()
        now = datetime.now(UTC)
        last, recorded = _read_cursor(context.cursor)
        events: list = []
        with postgres.connect() as conn:
            switched = index_figures.any_switched(conn)
            # Due every INDEX_SNAPSHOT_EVERY_S, and at once when the first page has switched in.
            if last is not None and now.timestamp() - last < current.index_snapshot_every_s and recorded >= switched:
                return dg.SensorResult(skip_reason=dg.SkipReason("the `index` asset is not due yet"))
            if switched:
                since = (datetime.fromtimestamp(last, UTC) if last is not None and recorded
                         # the first snapshot covers what led to the first switch
                         else min(filter(None, (index_figures.first_delivery_at(conn),
                                                now - timedelta(seconds=current.index_snapshot_every_s)))))
                events.append(snapshot_event(conn, current, since, now))
            # Each partition-set check once over every set: its sets' evaluations and the index's.
            found = set_checks.findings(conn, current)
            events += compat.aimed_at_latest(context.instance, set_checks.evaluations(
                conn, current, set_checks.defined_sets(compat.location_check_keys(context)), found=found))
        events += checks.evaluations(checks.Inputs(context.instance, postgres, current, embedder, found))
        failing = [e.check_name for e in events if isinstance(e, dg.AssetCheckEvaluation) and not e.passed]
        return dg.SensorResult(
            asset_events=events, cursor=json.dumps({"at": now.timestamp(), "recorded": switched}),
            skip_reason=dg.SkipReason(
                ("`index` recorded; " if isinstance(events[0], dg.AssetMaterialization) else "no page is searchable "
                 "yet; ") + f"{sum(isinstance(e, dg.AssetCheckEvaluation) for e in events)} checks evaluated"
                + (f", failing: {', '.join(sorted(set(failing)))}" if failing else ", all passing")))

    return index_snapshot_sensor


def _read_cursor(cursor: str | None) -> tuple[float | None, bool]:
    """(when the sensor last evaluated, epoch seconds; whether it recorded `index` then). A bare
    number is the cursor of the versions that only recorded snapshots."""
    if not cursor:
        return None, False
    if cursor.lstrip()[:1] != "{":
        return float(cursor), True
    state = json.loads(cursor)
    return float(state["at"]), bool(state["recorded"])
