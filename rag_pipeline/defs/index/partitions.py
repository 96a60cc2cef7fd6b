"""Where a page's partition lives: the catch-all's partition set and asset keys, or its site's
(or its site shard's). One dynamic partition per normalized URL in each set."""

import dagster as dg

from rag_pipeline.core.site_spec import CATCH_ALL_PARTITIONS, asset_prefix, partition_set

STEPS = ("pages", "chunks", "embeddings")

# The catch-all: pages of no declared site, under the set every deployment before sites had.
pages_partitions = dg.DynamicPartitionsDefinition(name=CATCH_ALL_PARTITIONS)


def partitions_def(site: str | None, shard: int | None) -> dg.DynamicPartitionsDefinition:
    return dg.DynamicPartitionsDefinition(name=partition_set(site, shard))


def step_key(step: str, site: str | None, shard: int | None) -> dg.AssetKey:
    """The asset key of one step (`pages`, `chunks`, `embeddings`) of a page in `site`/`shard`."""
    return dg.AssetKey([*asset_prefix(site, shard), step])
