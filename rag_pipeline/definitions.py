"""The code location: every definition under rag_pipeline/defs, found by the defs loader.

The loader is handed the defs module itself rather than left to find the checkout's
pyproject.toml (`dg.load_from_defs_folder`): an installed release, a wheel in an image, has no
pyproject.toml above it, and its code server would not start.
"""

import importlib
import warnings
from pathlib import Path

import dagster as dg

# Dagster 1.13 passes `owners` itself each time it copies a sensor (binding resources, evaluating a
# tick), set or not, and warns that the parameter is in beta: eight lines a start in the daemon's
# log, nothing of ours to act on.
warnings.filterwarnings("ignore", message=r"Parameter `owners` of initializer `SensorDefinition", category=dg.BetaWarning)


@dg.definitions
def defs() -> dg.Definitions:
    tree = dg.ComponentTree(
        defs_module=importlib.import_module("rag_pipeline.defs"),
        project_root=Path(__file__).resolve().parents[1],
    )
    with warnings.catch_warnings():
        # As load_from_defs_folder does: the loader's own preview and beta notices, and those of
        # beta parameters the assets use (backfill_policy), are not the user's to act on.
        for category in (dg.PreviewWarning, dg.BetaWarning, dg.SupersessionWarning):
            warnings.simplefilter("ignore", category)
        return _index_reads_every_site(tree.build_defs())


def _index_reads_every_site(built: dg.Definitions) -> dg.Definitions:
    """`index` is the whole index: its lineage comes from every `embeddings` asset, the catch-all's
    and each site's (shard's), which only the built tree knows."""
    from rag_pipeline.defs.index.index_asset import INDEX

    keys = [spec.key for asset in built.assets or [] for spec in
            (asset.specs if isinstance(asset, dg.AssetsDefinition) else [asset] if isinstance(asset, dg.AssetSpec) else [])]
    embeddings = sorted((key for key in keys if key.path[-1] == "embeddings"), key=lambda k: k.to_user_string())
    return built.map_asset_specs(
        func=lambda spec: spec.replace_attributes(deps=embeddings) if spec.key == INDEX else spec)
