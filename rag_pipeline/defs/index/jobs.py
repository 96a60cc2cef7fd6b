import dagster as dg

from rag_pipeline.defs.index.assets import chunks, embeddings, pages

# What a changed page costs: its source, its chunks, its vectors, in one run.
index_page_job = dg.define_asset_job(
    name="index_page",
    # Index-wide checks run in their own scheduled job, not in every page run.
    selection=dg.AssetSelection.assets(pages, chunks, embeddings).without_checks(),
    description="Re-index one page: newest delivery → chunks → vectors, switched in one transaction.",
)

# Re-cut pages from their stored text (after a chunker or budget change): no crawl, no `pages` step.
rechunk_job = dg.define_asset_job(
    name="rechunk",
    selection=dg.AssetSelection.assets(chunks, embeddings).without_checks(),
    description="Re-chunk pages from stored source text; only chunk texts never embedded are sent to the model.",
)
