import dagster as dg

from rag_pipeline.defs.index.assets import chunks, embeddings, pages

# What a changed page costs: its source, its chunks, its vectors, in one run.
index_page_job = dg.define_asset_job(
    name="index_page",
    # Index-wide checks run in their own scheduled job, not in every page run.
    selection=dg.AssetSelection.assets(pages, chunks, embeddings).without_checks(),
    description="Re-index one page: newest delivery → chunks → vectors, switched in one transaction.",
)

# Re-cut chosen pages from their stored text (a UI backfill over some partitions): no crawl, no
# `pages` step. In bulk, rechunk_sensor re-cuts every outdated page in batch runs instead.
rechunk_job = dg.define_asset_job(
    name="rechunk",
    selection=dg.AssetSelection.assets(chunks, embeddings).without_checks(),
    # No delivery carries a re-chunk's retries: a failed step waits and tries again here. A
    # poisoned input or a model mismatch raises Failure(allow_retries=False).
    op_retry_policy=dg.RetryPolicy(max_retries=3, delay=30, backoff=dg.Backoff.EXPONENTIAL),
    description="Re-chunk pages from stored source text; only chunk texts never embedded are sent to the model.",
)
