"""The `index` asset: the index as a whole over time, recorded by delivery_sensor.

Partitions show one page each; a data engineer also needs the whole: how many pages are live,
what each period's deliveries did, what embedding cost and what the hash gate and vector reuse
saved, how fresh the pages are. delivery_sensor reports a runless materialization of `index`
every INDEX_SNAPSHOT_EVERY_S (288 events a day at the default 5 minutes), whose numeric metadata
Dagster plots as time series on the asset's page.
"""

from datetime import UTC, datetime

import dagster as dg

from rag_pipeline.settings import Settings
from rag_pipeline.store import cadence, index_view, schedule, spaces

INDEX = dg.AssetKey("index")

index_asset = dg.AssetSpec(
    INDEX,
    group_name="index",
    deps=["embeddings"],
    kinds={"postgres"},
    description="The index as a whole, recorded every INDEX_SNAPSHOT_EVERY_S by delivery_sensor: live and "
                "tombstoned pages, aliases, chunks, cached vectors; each period's deliveries by outcome, tokens "
                "embedded and avoided (hash gate, vector reuse), estimated cost and saving; freshness; the recrawl "
                "schedule (spread of estimated change rates and cadences, pushes planned a day and made, the "
                "crawl budget).",
)


def snapshot_event(conn, settings: Settings, since: datetime, now: datetime) -> dg.AssetMaterialization:
    figures = {**index_view.snapshot(conn, since, now), **cadence.schedule_figures(conn, since, now)}
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
        # `hnsw`, or `exact (…)` while the index makes way for a bulk load: the UI says which.
        "vector_scan": spaces.search_scan(conn),
    }
    return dg.AssetMaterialization(asset_key=INDEX, metadata=metadata,
                                   description=f"the index at {now.astimezone(UTC).isoformat(timespec='seconds')}")
