"""The resources own their configuration and their clients (issue 15, point 2): settings are read
when a run or an evaluation starts, never at import nor from a process-wide cache; secrets reach
them as `dg.EnvVar`; clients live as long as the run or evaluation that made them."""

import re
from pathlib import Path

import dagster as dg
import pytest

from rag_pipeline.defs.resources import CrawlerResource, EmbedderResource, SettingsResource
from rag_pipeline.embedders.hash_embedder import MODEL_PREFIX
from rag_pipeline_tests.harness import evaluate_sensor, load_defs

DEFS = Path(__file__).resolve().parents[2] / "rag_pipeline" / "defs"


def test_no_definition_reads_the_process_wide_settings():
    readers = [f"{path.relative_to(DEFS)}:{n}" for path in DEFS.rglob("*.py")
               for n, line in enumerate(path.read_text().splitlines(), 1)
               if re.search(r"\bget_settings\b", line)]
    assert readers == []


def test_a_changed_variable_takes_effect_at_the_next_evaluation_without_reloading(monkeypatch):
    settings = load_defs().resources["settings"]
    monkeypatch.setenv("SENSOR_BATCH_SIZE", "7")
    with dg.build_resources({"settings": settings}) as first:
        assert first.settings.get().sensor_batch_size == 7
    monkeypatch.setenv("SENSOR_BATCH_SIZE", "9")
    with dg.build_resources({"settings": settings}) as second:
        assert second.settings.get().sensor_batch_size == 9


def test_a_resources_fields_win_over_the_environment(monkeypatch):
    monkeypatch.setenv("EMBEDDING_PROVIDER", "local")
    monkeypatch.setenv("SENSOR_BATCH_SIZE", "7")
    with dg.build_resources({"embedder": EmbedderResource(provider="hash", dimensions=16),
                             "settings": SettingsResource(overrides={"SENSOR_BATCH_SIZE": "11"})}) as r:
        assert r.embedder.get().model == f"{MODEL_PREFIX}16"
        assert r.settings.get().sensor_batch_size == 11


def test_secrets_reach_the_resources_as_environment_variables_not_values(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret")
    monkeypatch.setenv("CRAWLBASE_TOKEN", "tok-secret")
    resources = load_defs().resources
    for resource, field, name in ((resources["embedder"], "api_key", "OPENAI_API_KEY"),
                                  (resources["crawler"], "token", "CRAWLBASE_TOKEN")):
        value = getattr(resource, field)
        assert isinstance(value, dg.EnvVar) and value.env_var_name == name   # what the UI shows
    with dg.build_resources({"embedder": resources["embedder"]}) as r:
        assert r.embedder.settings().openai_api_key == "sk-test-secret"
    # Used outside a run (a script), the variable's value, not its name.
    assert resources["embedder"].settings().openai_api_key == "sk-test-secret"
    monkeypatch.setenv("DATABASE_URL", "postgresql://somewhere/index")
    assert load_defs().resources["postgres"].url() == "postgresql://somewhere/index"


def test_a_crawler_made_for_an_evaluation_is_closed_when_it_ends(monkeypatch):
    monkeypatch.setenv("CRAWLER", "local")
    monkeypatch.setenv("CRAWLER_CALLBACK_URL", "http://127.0.0.1:9/webhook")
    monkeypatch.setenv("CRAWLER_DELIVERY_RETRIES", "0")
    with dg.build_resources({"crawler": CrawlerResource()}) as r:
        crawler = r.crawler.get()
        assert r.crawler.get() is crawler          # one client for the evaluation
        crawler.health()
        assert crawler._threads == []              # reading health starts no fetcher
        crawler.push("http://127.0.0.1:9/page")    # nothing listens: fetched and given up at once
        threads = list(crawler._threads)
        assert threads and all(t.is_alive() for t in threads)
    assert not any(t.is_alive() for t in threads)  # closed with it, not kept for the process
    with dg.build_resources({"crawler": CrawlerResource()}) as r:
        assert r.crawler.get() is not crawler


def test_a_bad_setting_fails_the_tick_with_its_line_and_leaves_the_code_location_loading(
        database_url, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("SENSOR_BATCH_SIZE", "0")
    monkeypatch.setenv("RECRAWL_INTERVAL_S", "0")
    defs = load_defs()   # loads: a bad value must not take the UI down with it
    assert defs.resolve_sensor_def("recrawl_sensor").minimum_interval_seconds == 60
    with dg.instance_for_test() as instance:
        with pytest.raises(dg.DagsterResourceFunctionError) as raised:
            evaluate_sensor(defs, "delivery_sensor", instance)
    assert "bad setting" in str(raised.value.__cause__) and "SENSOR_BATCH_SIZE='0'" in str(raised.value.__cause__)
