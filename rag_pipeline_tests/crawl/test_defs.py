import dagster as dg

from rag_pipeline.crawl.crawler_health import CHECK_NAMES
from rag_pipeline_tests.harness import load_defs


def test_crawl_definitions():
    defs = load_defs()
    for name in ("recrawl_sensor", "crawler_health_sensor"):
        assert defs.resolve_sensor_def(name).default_status == dg.DefaultSensorStatus.RUNNING
    assert {job.name for job in defs.resolve_sensor_def("recrawl_sensor").jobs} == {"push", "cadence_refresh"}
    for job in ("push", "seed", "recrawl_now", "cadence_refresh"):
        defs.resolve_job_def(job)
    graph = defs.resolve_asset_graph()
    checks = {key.name for key in graph.asset_check_keys if key.asset_key == dg.AssetKey("index")}
    assert set(CHECK_NAMES) <= checks
