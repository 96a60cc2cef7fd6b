"""The code location `bench/ui_partitions.py` loads: one site, `big`, built from the project's own
factories (`page_assets`, `partitions_def`, `discovery_asset`), as a site component builds it:
discovery → pages → chunks → embeddings in the group `site_big`, on one partition set of all its
pages (UI_PARTITIONS_SHARDS=1, asset keys `big/pages`…) or on one set per shard
(UI_PARTITIONS_SHARDS=S>1, `big/shard_00/pages`… on `big__pages_00`…). No sensor, no job: only
the asset shapes the UI's asset pages read."""

import os
import warnings

import dagster as dg

from rag_pipeline.core.site_spec import SiteSpec

SITE = "big"
GROUP = f"site_{SITE}"
SITEMAP = "https://docs.example.com/sitemap.xml"


def shards_from_env() -> int:
    return int(os.environ.get("UI_PARTITIONS_SHARDS", "1"))


def spec(shards: int) -> SiteSpec:
    return SiteSpec(name=SITE, sitemaps=(SITEMAP,), max_pages=max(1, shards) * 100_000, shards=shards)


def shard_ids(shards: int) -> list[int | None]:
    return [None] if shards == 1 else list(range(shards))


def build(shards: int) -> dg.Definitions:
    from rag_pipeline.components.discovery_asset import discovery_asset
    from rag_pipeline.defs.index.assets import page_assets
    from rag_pipeline.defs.index.partitions import partitions_def
    from rag_pipeline.defs.resources import defs as resource_defs

    site = spec(shards)
    discovery = discovery_asset(site, None, GROUP)
    assets = [discovery]
    for shard in shard_ids(shards):
        assets += page_assets(site.asset_prefix(shard), partitions_def(SITE, shard), GROUP,
                              embedder_kind="local", upstream=discovery.key)
    return dg.Definitions.merge(dg.Definitions(assets=assets), resource_defs())


@dg.definitions
def defs() -> dg.Definitions:
    with warnings.catch_warnings():
        for category in (dg.PreviewWarning, dg.BetaWarning, dg.SupersessionWarning):
            warnings.simplefilter("ignore", category)
        return build(shards_from_env())
