"""Checks read as evaluated in the UI: none is greyed out ("Not evaluated") by a materialization of
its asset that came after it, neither the index-wide ones by the `index` snapshot nor a partition
set's by the batch runs that materialize its pages."""

from __future__ import annotations

import dagster as dg

from rag_pipeline import compat
from rag_pipeline.defs.index.assets import INDEX
from rag_pipeline.settings import get_settings
from rag_pipeline.store.crawl_observations import NO_BUDGET_YET
from rag_pipeline_tests.defs.test_index_asset import A, B, put
from rag_pipeline_tests.harness import Pipeline, configure, evaluate_sensor, load_defs


def greyed(instance: dg.DagsterInstance, defs: dg.Definitions) -> list[str]:
    keys = defs.resolve_asset_graph().asset_check_keys
    return sorted(k.to_user_string() for k, shown in compat.shown_as_evaluated(instance, list(keys)).items()
                  if not shown)


def record_crawler_checks(pipeline: Pipeline) -> None:
    for event in evaluate_sensor(pipeline.defs, "crawler_health_sensor", pipeline.instance).asset_events:
        pipeline.instance.report_runless_asset_event(event)


def test_every_check_reads_as_evaluated_after_snapshots_and_batches(database_url, conn, monkeypatch):
    configure(monkeypatch, DATABASE_URL=database_url, EMBEDDING_PROVIDER="hash", INDEX_SNAPSHOT_EVERY_S="0",
              CRAWLER="local")
    defs = load_defs()
    with dg.instance_for_test() as instance:
        pipeline = Pipeline(instance, defs)
        record_crawler_checks(pipeline)
        pipeline.snapshot()
        put(conn, A, f"# {A}\n\nThe first version of {A}, with a few words of its own.")
        pipeline.tick()
        pipeline.snapshot()
        assert greyed(instance, defs) == []
        # The snapshot before the first cadence_refresh says that no budget is allocated yet,
        # rather than a budget of 0 beside the pushes planned.
        snapshot = instance.fetch_materializations(INDEX, limit=1).records[0].asset_materialization.metadata
        assert "crawl_budget_per_day" not in snapshot and snapshot["crawl_budget_note"].value == NO_BUDGET_YET

        # A batch run materializes the catch-all's assets: their checks come with it, in that run.
        put(conn, B, f"# {B}\n\nAnother page, changed after the snapshot.")
        tick = pipeline.tick()
        assert tick.runs and greyed(instance, defs) == []
        keys = [dg.AssetCheckKey(dg.AssetKey("pages"), "pages_match_their_source"),
                dg.AssetCheckKey(dg.AssetKey("embeddings"), "every_chunk_in_the_active_space")]
        records = compat.latest_check_records(instance, keys)
        assert {records[k].run_id for k in keys} == {tick.runs[0].run_id}
        # The vectors' check reads every chunk of the set: the run carries the snapshot's forward,
        # with its time, rather than paying for it in every run.
        carried, _ = compat.evaluation_of(records[keys[1]])
        assert carried.passed and "(as of " in carried.description and carried.metadata["count"].value == 0
        pages_check, _ = compat.evaluation_of(records[keys[0]])
        assert "(as of " not in pages_check.description

        # The index-wide checks hang on the snapshot: evaluated with it, in the same tick.
        pipeline.snapshot()
        assert greyed(instance, defs) == []

        # What the UI showed before: checks run by the job, then a newer snapshot greys them out.
        assert defs.resolve_job_def("index_checks").execute_in_process(instance=instance).success
        instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=INDEX))
        assert "index:delivery_queue_drains" in greyed(instance, defs)
    get_settings.cache_clear()
