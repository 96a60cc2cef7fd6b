"""The code location: every definition under rag_pipeline/defs, found by the defs loader.

The loader is handed the defs module itself rather than left to find the checkout's
pyproject.toml (`dg.load_from_defs_folder`): an installed release, a wheel in an image, has no
pyproject.toml above it, and its code server would not start.
"""

import importlib
import warnings
from pathlib import Path

import dagster as dg

from rag_pipeline.components.site_component import declared_sites
from rag_pipeline.components.site_files import declarations
from rag_pipeline.components.site_folder import refuse_when_validating
from rag_pipeline.core.location_holds import Holds
from rag_pipeline.settings import location_settings

# Dagster 1.13 passes `owners` itself each time it copies a sensor (binding resources, evaluating a
# tick), set or not, and warns that the parameter is in beta: eight lines a start in the daemon's
# log, nothing of ours to act on.
warnings.filterwarnings("ignore", message=r"Parameter `owners` of initializer `SensorDefinition", category=dg.BetaWarning)


@dg.definitions
def defs() -> dg.Definitions:
    refuse_when_validating()
    return held_by_location(whole_project(), location_settings().holds())


def whole_project() -> dg.Definitions:
    """Every definition, as the single location of the default `LOCATION_HOLDS=all` has them (and
    the CLI reads them, whatever this host's location holds)."""
    tree = dg.ComponentTree(
        defs_module=importlib.import_module("rag_pipeline.defs"),
        project_root=Path(__file__).resolve().parents[1],
    )
    with warnings.catch_warnings():
        # As load_from_defs_folder does: the loader's own preview and beta notices, and those of
        # beta parameters the assets use (backfill_policy), are not the user's to act on.
        for category in (dg.PreviewWarning, dg.BetaWarning, dg.SupersessionWarning):
            warnings.simplefilter("ignore", category)
        # The sites, the package's and SITES_DIR's, come from sites/defs.yaml's component
        # (components/site_folder.py), which reads each site file on its own.
        return _index_reads_every_site(tree.build_defs())


# Every location applies the batches of the pages it holds, and routes deliveries (one router at a
# time: deliveries.claim_unrouted). The rest of what is not a site's own is `main`'s.
EVERY_LOCATION = {"index_batch", "delivery_sensor", "delivery_failure_sensor", "rechunk_sensor"}
# A site's assets that are the whole site's, not a shard's, and the jobs and sensors named for them:
# the location that holds the site serves them.
SITE_WIDE = {"discovery", "answer_quality"}
SITE_WIDE_NAMES = {"discovery", "discovery_sensor", "answer_quality", "quality_sensor"}


def held_by_location(built: dg.Definitions, holds: Holds) -> dg.Definitions:
    """What this code location serves of the whole project (LOCATION_HOLDS): its sites' (or
    shards') assets, discovery job and sensor, and `main`'s catch-all and index-wide objects."""
    if holds.everything:
        return built
    sites = {spec.name: spec.shards for spec, _ in declared_sites()}
    # A site whose file does not load is still declared: a location that holds it loads (holding
    # nothing of it until the file is fixed; its stand-in is main's) instead of failing with every
    # other site it holds. Any of its shards may be named (SiteSpec allows 1,000).
    holds.check_against({**{p.name: 1_000 for p in declarations().problems}, **sites})

    def key_held(key: dg.AssetKey) -> bool:
        site = key.path[0] if len(key.path) > 1 and key.path[0] in sites else None
        if site is None:
            return holds.holds_main()
        if key.path[-1] in SITE_WIDE:
            return holds.holds_site(site)
        shard = int(key.path[1].removeprefix("shard_")) if len(key.path) == 3 else None
        return holds.holds_page(site, shard)

    def named_held(name: str) -> bool:
        if name in EVERY_LOCATION:
            return True
        site = next((s for s in sites if name in {f"{s}_{suffix}" for suffix in SITE_WIDE_NAMES}), None)
        return holds.holds_site(site) if site else holds.holds_main()

    def asset_held(asset) -> bool:
        keys = asset.keys if isinstance(asset, dg.AssetsDefinition) else {asset.key}
        return any(key_held(key) for key in keys)

    return dg.Definitions(
        assets=[a for a in built.assets or [] if asset_held(a)],
        asset_checks=[c for c in built.asset_checks or [] if any(key_held(k.asset_key) for k in c.check_keys)],
        jobs=[j for j in built.jobs or [] if named_held(j.name)],
        sensors=[s for s in built.sensors or [] if named_held(s.name)],
        schedules=[s for s in built.schedules or [] if holds.holds_main()],
        resources=built.resources,
        executor=built.executor,
        loggers=built.loggers,
        metadata=built.metadata,
    )


def _index_reads_every_site(built: dg.Definitions) -> dg.Definitions:
    """`index` is the whole index: its lineage comes from every `embeddings` asset, the catch-all's
    and each site's (shard's), which only the built tree knows."""
    from rag_pipeline.defs.index.assets import INDEX

    keys = [spec.key for asset in built.assets or [] for spec in
            (asset.specs if isinstance(asset, dg.AssetsDefinition) else [asset] if isinstance(asset, dg.AssetSpec) else [])]
    embeddings = sorted((key for key in keys if key.path[-1] == "embeddings"), key=lambda k: k.to_user_string())
    return built.map_asset_specs(
        func=lambda spec: spec.replace_attributes(deps=embeddings) if spec.key == INDEX else spec)
