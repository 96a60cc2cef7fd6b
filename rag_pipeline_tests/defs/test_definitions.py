import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from rag_pipeline_tests.harness import load_defs

REPO = Path(__file__).resolve().parents[2]


def test_asset_graph_is_pages_chunks_embeddings_and_the_index_as_a_whole():
    graph = load_defs().resolve_asset_graph()
    parents = {key.to_user_string(): {p.to_user_string() for p in graph.get(key).parent_keys}
               for key in graph.get_all_asset_keys()}
    assert parents == {"pages": set(), "chunks": {"pages"}, "embeddings": {"chunks"}, "index": {"embeddings"}}
    for name in ("pages", "chunks", "embeddings"):
        node = graph.get(dg.AssetKey(name))
        assert node.partitions_def == dg.DynamicPartitionsDefinition(name="pages")
    assert graph.get(dg.AssetKey("index")).partitions_def is None   # one view of the whole index


def test_the_index_is_downstream_of_every_sites_embeddings(monkeypatch):
    """With the sample site declared, `index` reads the site's `embeddings` too, not only the
    catch-all's: the lineage shows where the index as a whole comes from."""
    monkeypatch.setenv("SAMPLE_SITE_URL", "http://127.0.0.1:8900")
    graph = load_defs().resolve_asset_graph()
    assert {p.to_user_string() for p in graph.get(dg.AssetKey("index")).parent_keys} == {
        "embeddings", "sample/embeddings"}
    assert {p.to_user_string() for p in graph.get(dg.AssetKey(["sample", "embeddings"])).parent_keys} == {
        "sample/chunks"}


def test_chunks_code_version_is_the_chunker_version():
    from rag_pipeline.core.chunking import CHUNKER_VERSION

    graph = load_defs().resolve_asset_graph()
    assert graph.get(dg.AssetKey("chunks")).code_version == CHUNKER_VERSION


def test_delivery_sensor_runs_by_default():
    sensor = load_defs().resolve_sensor_def("delivery_sensor")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING


def test_dagster_cli_validates_the_workspace(tmp_path):
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    dagster = Path(sys.executable).with_name("dagster")
    proc = subprocess.run(
        [str(dagster), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_page_runs_do_not_run_index_wide_checks():
    defs = load_defs()
    for name in ("index_page", "rechunk"):
        assert not defs.resolve_job_def(name).asset_layer.asset_graph.asset_check_keys
    assert defs.resolve_job_def("index_checks").asset_layer.asset_graph.asset_check_keys


def test_index_wide_checks_sit_on_the_index_asset_not_on_a_part_of_it():
    from rag_pipeline.crawl.crawler_health import CHECK_NAMES
    from rag_pipeline.defs.index import checks

    keys = load_defs().resolve_asset_graph().asset_check_keys
    index_wide = {checks.INDEX_MATCHES_SOURCE, checks.NO_TOMBSTONED_CHUNKS, checks.ONE_ACTIVE_SPACE,
                  checks.NO_STUCK_DELIVERIES, checks.INDEX_RUNS_SUCCEED, checks.QUEUE_DRAINS,
                  checks.EMBEDDING_API_ANSWERS, *CHECK_NAMES}
    assert {k.name for k in keys if k.asset_key == dg.AssetKey("index")} == index_wide
    # A part of the index (here the catch-all's pages) carries only its own partition set's checks.
    from rag_pipeline.defs.index import set_checks

    assert {k.to_user_string() for k in keys if k.asset_key in {dg.AssetKey(s) for s in ("pages", "chunks", "embeddings")}} == {
        f"pages:{set_checks.PAGES_MATCH_SOURCE}", f"chunks:{set_checks.NO_TOMBSTONED_CHUNKS}",
        f"embeddings:{set_checks.VECTORS_IN_ACTIVE_SPACE}"}
    # The job runs the index's seven; crawler_health_sensor records the crawler's four.
    job_keys = load_defs().resolve_job_def("index_checks").asset_layer.asset_graph.asset_check_keys
    assert {k.name for k in job_keys} == index_wide - set(CHECK_NAMES)


@pytest.mark.parametrize("provider, kind, not_kind", [("local", "onnx", "openai"), ("openai", "openai", "onnx")])
def test_the_embeddings_asset_shows_the_configured_embedders_kind(provider, kind, not_kind):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EMBEDDING_", "OPENAI_"))}
    env.update(EMBEDDING_PROVIDER=provider, OPENAI_API_KEY="sk-test")
    shown = subprocess.run(
        [sys.executable, "-W", "ignore", "-c",
         "import dagster as dg; from rag_pipeline.definitions import defs; "
         "print(' '.join(sorted(defs().resolve_asset_graph().get(dg.AssetKey('embeddings')).kinds)))"],
        env=env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    kinds = shown.stdout.split()
    assert kind in kinds and not_kind not in kinds and "pgvector" in kinds


def test_evaluating_a_sensor_warns_nothing_about_dagsters_own_beta_parameters(database_url, monkeypatch):
    import importlib
    import warnings

    import rag_pipeline.definitions
    from rag_pipeline_tests.harness import configure, evaluate_sensor

    configure(monkeypatch, DATABASE_URL=database_url, EMBEDDING_PROVIDER="hash")
    defs = load_defs()
    with dg.instance_for_test() as instance, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")          # every warning, each time
        evaluate_sensor(defs, "delivery_sensor", instance)
        assert [w for w in caught if "owners" in str(w.message)]   # Dagster does warn...
        caught.clear()
        importlib.reload(rag_pipeline.definitions)   # ...and the code location's filter, set on import,
        evaluate_sensor(defs, "delivery_sensor", instance)   # silences it
    assert not [w for w in caught if "owners" in str(w.message)]
