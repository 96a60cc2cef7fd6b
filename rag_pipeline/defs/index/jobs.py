import dagster as dg

from rag_pipeline.defs.index.assets import CHUNKS, EMBEDDINGS, PAGES

# What a changed page costs: its source, its chunks, its vectors; started by hand from the UI.
index_page_job = dg.define_asset_job(
    name="index_page",
    # Index-wide checks run in their own scheduled job, not in every page run.
    selection=dg.AssetSelection.assets(PAGES, CHUNKS, EMBEDDINGS).without_checks(),
    description="Re-index pages (one, or a UI backfill in ranges of up to 2,000 a run): newest delivery → "
                "chunks → vectors, each page switched in its own transaction.",
)

# Re-cut chosen pages from their stored text (a UI backfill over some partitions, in ranges of up
# to RANGE_PAGES pages a run): no crawl, no `pages` step. rechunk_sensor re-cuts every outdated
# page in batch runs instead, leased like delivery batches.
rechunk_job = dg.define_asset_job(
    name="rechunk",
    selection=dg.AssetSelection.assets(CHUNKS, EMBEDDINGS).without_checks(),
    # No delivery carries a re-chunk's retries: a failed step waits and tries again here. A
    # poisoned input or a model mismatch raises Failure(allow_retries=False).
    op_retry_policy=dg.RetryPolicy(max_retries=3, delay=30, backoff=dg.Backoff.EXPONENTIAL),
    description="Re-chunk pages from stored source text; only chunk texts never embedded are sent to the model.",
)
