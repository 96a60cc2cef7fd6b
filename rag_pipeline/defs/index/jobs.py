import dagster as dg

from rag_pipeline.defs.index.assets import chunks, embeddings, pages

# What a changed page costs: its source, its chunks, its vectors, in one run.
index_page_job = dg.define_asset_job(
    name="index_page",
    selection=dg.AssetSelection.assets(pages, chunks, embeddings),
    description="Re-index one page: newest delivery → chunks → vectors, switched in one transaction.",
)
