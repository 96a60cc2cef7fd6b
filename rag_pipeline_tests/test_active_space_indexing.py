"""Indexing follows the active embedding space: a key set for answers never changes how pages are embedded.

The configured embedder (EMBEDDING_PROVIDER, EMBEDDING_MODEL, keys) decides the first space of an
empty index and what `space build` / `space activate` switch to; nothing else.
"""

from __future__ import annotations

import json

import dagster as dg
import pytest
from click.testing import CliRunner

from rag_pipeline.cli import main as cli
from rag_pipeline.embedders import local_embedder
from rag_pipeline.settings import Settings, get_settings
from rag_pipeline.store import spaces
from rag_pipeline_tests.fakes.openai_server import FakeOpenAI
from rag_pipeline_tests.harness import TOKEN, Pipeline, configure, evaluate_sensor, deliver, load_defs
from rag_pipeline_tests.ingest.pagework import put
from rag_pipeline_tests.servers import serve
from webhook_sensor.app import create_app

URL = "https://docs.example.com/tides"
OTHER = "https://docs.example.com/storage"
V1 = "# Tides\n\nThe heron observatory records tide heights every six minutes on a brass gauge."
V2 = V1 + "\n\n## Calibration\n\nThe gauge is calibrated against the kelp benchmark every spring equinox."
V3 = V2 + "\n\n## Archive\n\nReadings older than a decade move to the lighthouse vault on microfilm."
OTHER_PAGE = "# Storage\n\nSamples are frozen at minus eighty degrees in the walrus freezer."


@pytest.fixture
def receiver(database_url):
    app = create_app(Settings(WEBHOOK_TOKEN=TOKEN), database_url=database_url)
    with serve(app, health_path="/healthz") as base, dg.instance_for_test() as instance:
        yield base, Pipeline(instance, load_defs())


def live_spaces(conn, url: str) -> set[str]:
    rows = conn.execute(
        "SELECT DISTINCT s.model FROM chunks c JOIN pages p USING (page_id)"
        " JOIN space_vectors v ON v.chunk_id = c.chunk_id AND v.embed_hash = c.embed_hash"
        " JOIN embedding_spaces s ON s.space_id = v.space_id AND s.status = 'active' WHERE p.url = %s", (url,)
    ).fetchall()
    return {r[0] for r in rows}


def switched(conn, url: str) -> bool:
    return conn.execute(
        "SELECT indexed_hash = source_hash AND d.outcome = 'embedded' FROM pages p"
        " JOIN deliveries d ON d.id = p.applied_delivery_id WHERE p.url = %s", (url,)
    ).fetchone()[0]


def embeddings_metadata(instance: dg.DagsterInstance, url: str) -> dict:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("embeddings"), asset_partitions=[url]), limit=1).records
    materialization = records[0].asset_materialization
    assert materialization.partition == url
    return {k: v.value for k, v in materialization.metadata.items()}


def search_urls(question: str) -> list[str]:
    result = CliRunner().invoke(cli, ["search", question, "--json"])
    assert result.exit_code == 0, result.output
    return [r["url"] for r in json.loads(result.stdout)["results"]]


def test_a_key_set_later_indexes_changed_pages_in_the_active_space(database_url, conn, monkeypatch, receiver):
    base, pipeline = receiver
    configure(monkeypatch, DATABASE_URL=database_url, EMBEDDING_PROVIDER="hash", EMBEDDING_DIMENSIONS="64")
    deliver(base, URL, V1)
    deliver(base, OTHER, OTHER_PAGE)
    assert sorted(pipeline.tick().partitions) == sorted([URL, OTHER])
    assert "note" not in embeddings_metadata(pipeline.instance, URL)   # configured = active: nothing to say

    with FakeOpenAI(dimensions=64) as fake:
        # The case: a key set for `ask`, the provider left to its default (now `openai`).
        configure(monkeypatch, EMBEDDING_PROVIDER=None, EMBEDDING_DIMENSIONS=None,
                  OPENAI_API_KEY="sk-chat", OPENAI_BASE_URL=fake.base_url)
        assert get_settings().resolved_embedding_provider() == "openai"
        deliver(base, URL, V2)
        tick = pipeline.tick()        # the run succeeds (it failed every `embeddings` step)
        assert tick.partitions == [URL]
        assert fake.requests == 0 and fake.calls == []   # nothing sent to the embeddings endpoint
    assert switched(conn, URL)
    assert live_spaces(conn, URL) == {"hash-v1-64"}
    assert [s.model for s in spaces.list_all(conn)] == ["hash-v1-64"]
    meta = embeddings_metadata(pipeline.instance, URL)
    assert meta["embedding_space"] == "hash-v1-64 (64 dims)"
    # Said once, as a note: what is configured, what indexing used, and how to switch.
    assert "text-embedding-3-small" in meta["note"] and "hash-v1-64" in meta["note"]
    assert "space build" in meta["note"]
    assert search_urls("kelp benchmark calibration")[0] == URL


def test_a_page_changed_while_a_space_builds_ends_up_in_the_space_activated(database_url, conn, monkeypatch,
                                                                            receiver):
    base, pipeline = receiver
    configure(monkeypatch, DATABASE_URL=database_url, EMBEDDING_PROVIDER="hash", EMBEDDING_DIMENSIONS="64")
    deliver(base, URL, V1)
    deliver(base, OTHER, OTHER_PAGE)
    pipeline.tick()

    # The operator configures the next model and builds its space; Dagster runs with that environment.
    configure(monkeypatch, EMBEDDING_DIMENSIONS="32")
    runner = CliRunner()
    built = runner.invoke(cli, ["space", "build"])
    assert built.exit_code == 0 and "building" in built.output, built.output

    deliver(base, URL, V2)
    assert pipeline.tick().partitions == [URL]   # indexed, in the space search still reads
    assert switched(conn, URL) and live_spaces(conn, URL) == {"hash-v1-64"}
    assert "hash-v1-32" in embeddings_metadata(pipeline.instance, URL)["note"]
    assert search_urls("kelp benchmark calibration")[0] == URL

    flipped = runner.invoke(cli, ["space", "activate"])   # catches up on V2's texts, then flips
    assert flipped.exit_code == 0 and "hash-v1-32" in flipped.output, flipped.output
    assert live_spaces(conn, URL) == live_spaces(conn, OTHER) == {"hash-v1-32"}
    assert search_urls("kelp benchmark calibration")[0] == URL

    deliver(base, URL, V3)
    assert pipeline.tick().partitions == [URL]   # now indexed in the new active space
    assert switched(conn, URL) and live_spaces(conn, URL) == {"hash-v1-32"}
    meta = embeddings_metadata(pipeline.instance, URL)
    assert meta["embedding_space"] == "hash-v1-32 (32 dims)" and "note" not in meta
    assert search_urls("lighthouse vault microfilm")[0] == URL


def test_a_key_keeps_a_local_index_on_its_model_and_chunk_budget(database_url, conn, monkeypatch):
    # `make run`'s index: the offline model, chunks sized to its 256-wordpiece window.
    configure(monkeypatch, DATABASE_URL=database_url)
    local_budget = get_settings().chunk_budget()
    assert local_budget == (160, 32)
    with dg.instance_for_test() as instance:
        defs = load_defs()
        pipeline = Pipeline(instance, defs)
        put(conn, URL, V1)
        put(conn, OTHER, OTHER_PAGE)
        pipeline.tick()
        signature = conn.execute("SELECT DISTINCT chunker_version FROM pages").fetchall()
        assert live_spaces(conn, URL) == {local_embedder.MODEL_NAME} and len(signature) == 1
        assert signature[0][0].endswith("/160/32/wp256")   # cut to the model's wordpiece window too

        with FakeOpenAI(dimensions=64) as fake:
            configure(monkeypatch, OPENAI_API_KEY="sk-chat", OPENAI_BASE_URL=fake.base_url)
            assert get_settings().chunk_budget() != local_budget   # what a key alone would choose
            put(conn, URL, V2)
            assert pipeline.tick().partitions == [URL]
            # The rechunk sensor finds nothing outdated: the budget is still the local model's.
            result = evaluate_sensor(defs, "rechunk_sensor", instance)
            assert not result.run_requests, [r.partition_key for r in result.run_requests]
            assert fake.requests == 0
        assert switched(conn, URL) and live_spaces(conn, URL) == {local_embedder.MODEL_NAME}
        assert conn.execute("SELECT DISTINCT chunker_version FROM pages").fetchall() == signature
