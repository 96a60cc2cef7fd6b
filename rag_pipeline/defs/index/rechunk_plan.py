"""A re-chunk's plan as Dagster shows it: recorded once per chunker signature, by rechunk_sensor's
first tick or the first run of a UI backfill, as an observation of the `index` asset."""

import dagster as dg

from rag_pipeline.core.chunking import ChunkBudget, chunker_signature
from rag_pipeline.defs.index.bulk_index import RECHUNK_SEEN_S
from rag_pipeline.ingest.backfill import SAMPLE_PAGES, plan, priced
from rag_pipeline.store import rechunks


def record_plan(conn, active, budget: ChunkBudget, price: float) -> tuple[dg.AssetObservation, dict] | None:
    """The re-chunk's plan, on a sample of its pages, recorded once per signature (the first tick,
    or the first run of a UI backfill): the `index` asset's observation of it, and its figures.
    None when already recorded."""
    signature = chunker_signature(*budget)
    if rechunks.recorded(conn, signature, RECHUNK_SEEN_S) is not None:
        return None
    figures = priced(conn, plan(conn, active, *budget, sample=SAMPLE_PAGES), price)
    with conn.transaction():
        if not rechunks.record(conn, signature, figures["pages"], figures["rows_written"], figures, RECHUNK_SEEN_S):
            return None   # another tick or run recorded it first
    from rag_pipeline.defs.index.assets import INDEX   # assets.py's range runs record plans too

    return dg.AssetObservation(asset_key=INDEX, metadata=plan_metadata(figures)), figures


def plan_metadata(figures: dict) -> dict:
    """A plan as the `index` asset shows it."""
    shown = {"rechunk_to": figures["signature"]}
    for name in ("pages", "sampled_pages", "rows_written", "rows_live", "chunks_total", "chunks_to_embed",
                 "tokens_to_embed", "tokens_reused", "cost_usd", "price_per_mtok_usd", "estimate_s"):
        if figures.get(name) is not None:
            shown[f"plan_{name}"] = figures[name]
    return shown
