"""Re-chunks at site scale (issue 44): a re-chunk that rewrites most vector rows is a bulk load (the
search indexes make way before its first batch and are built again at its end), one that rewrites
few keeps them; rechunk_sensor keeps a set number of runs fed instead of leasing a tick's worth;
a range run (a UI backfill) never applies a page a sensor's batch holds, and says so."""

from __future__ import annotations

import dataclasses

import dagster as dg
import pytest

from rag_pipeline.core import chunking
from rag_pipeline.defs.index.rechunk_sensor import RUNS_AHEAD
from rag_pipeline.ingest import backfill, indexing
from rag_pipeline.store import spaces, text_search
from rag_pipeline_tests.fakes.openai_server import FakeOpenAI
from rag_pipeline_tests.harness import batch_pages, configure, deliver, evaluate_sensor, openai_stack

PAGES = 30
BUDGET = dict(CHUNK_MAX_TOKENS="64", CHUNK_OVERLAP_TOKENS="8")


def page(n: int) -> str:
    paragraphs = "\n\n".join(" ".join(f"Kestrel quay {n} line {p}.{i} on moorings and cranes." for i in range(6))
                             for p in range(6))
    return f"# Quay {n}\n\n{paragraphs}\n"


def url(n: int) -> str:
    return f"https://docs.example.com/q{n:02d}"


@pytest.fixture
def loaded(database_url, monkeypatch, conn):
    """A site of PAGES pages, indexed and with both search indexes valid."""
    with FakeOpenAI(dimensions=256) as fake, openai_stack(database_url, monkeypatch, fake) as (base, pipeline):
        configure(monkeypatch, HNSW_DEFER_FLOOR="20", HNSW_DEFER_RATIO="0.5", SENSOR_BATCH_SIZE="100", **BUDGET)
        for n in range(PAGES):
            deliver(base, url(n), page(n))
        pipeline.tick()
        pipeline.tick()                      # the load's indexes built again, if it dropped them
        assert conn.execute("SELECT count(*) FROM pages WHERE indexed_hash = source_hash").fetchone()[0] == PAGES
        assert scans(conn) == ("hnsw", "gin")
        pipeline.fake = fake
        yield pipeline


def scans(conn) -> tuple[str, str]:
    return spaces.search_scan(conn), text_search.lexical_scan(conn)


def rechunk(pipeline) -> dg.SensorResult:
    return evaluate_sensor(pipeline.defs, "rechunk_sensor", pipeline.instance)


def run_all(pipeline, requests) -> None:
    for request in requests:
        outcome = pipeline.job.execute_in_process(run_config=request.run_config, instance=pipeline.instance,
                                                  tags=request.tags)
        assert outcome.success


def ledger_since(conn, mark: int) -> dict[str, int]:
    return dict(conn.execute("SELECT page_url, count(*) FROM embedding_ledger WHERE id > %s GROUP BY page_url",
                             (mark,)).fetchall())


def test_a_rechunk_that_rewrites_most_rows_is_a_bulk_load_planned_on_its_first_tick(loaded, conn, monkeypatch):
    pipeline = loaded
    mark = conn.execute("SELECT max(id) FROM embedding_ledger").fetchone()[0]
    configure(monkeypatch, CHUNK_MAX_TOKENS="40", CHUNK_OVERLAP_TOKENS="0")     # every boundary moves
    signature = chunking.chunker_signature(40, 0)

    first = rechunk(pipeline)
    (observed,) = first.asset_events                # the plan, on the `index` asset
    plan = {k: v.value for k, v in observed.metadata.items()}
    assert observed.asset_key == dg.AssetKey("index") and plan["rechunk_to"] == signature
    assert plan["plan_pages"] == PAGES and plan["plan_rows_written"] > 0.8 * plan["plan_rows_live"] > 0
    assert plan["plan_estimate_s"] > 0          # at the pace the load's batch run measured
    # The indexes made way before the first batch wrote a row.
    assert scans(conn) == ("exact (HNSW index dropped for a bulk load)", "exact (GIN index dropped for a bulk load)")
    requests = first.run_requests
    while requests:
        run_all(pipeline, requests)
        later = rechunk(pipeline)
        assert not later.asset_events               # planned once
        requests = later.run_requests
    assert "every page is cut with" in later.skip_reason.skip_message
    assert {r[0] for r in conn.execute("SELECT DISTINCT chunker_version FROM chunks")} == {signature}
    embedded = conn.execute("SELECT sum(tokens_embedded) FROM embedding_ledger WHERE id > %s", (mark,)).fetchone()[0]
    assert embedded == plan["plan_tokens_to_embed"]     # every page planned (no sample at this size)
    assert set(ledger_since(conn, mark).values()) == {1}   # each page switched once
    built = pipeline.tick()                         # delivery_sensor: drained, build them again
    assert [r.job_name for r in built.runs] == ["space_index"]
    assert scans(conn) == ("hnsw", "gin")


def test_a_rechunk_that_rewrites_few_rows_keeps_the_indexes(loaded, conn, monkeypatch):
    pipeline = loaded
    real = chunking.chunk_markdown

    def first_chunk_reworded(text, max_tokens=512, overlap_tokens=64, window=None):
        pieces = real(text, max_tokens, overlap_tokens, window)
        return [dataclasses.replace(pieces[0], embed_text=pieces[0].embed_text + " (v2)"), *pieces[1:]]

    monkeypatch.setattr(chunking, "CHUNKER_VERSION", "test-v2")
    for module in (indexing, backfill):
        monkeypatch.setattr(module, "chunk_markdown", first_chunk_reworded)
    first = rechunk(pipeline)
    plan = {k: v.value for k, v in first.asset_events[0].metadata.items()}
    assert plan["plan_rows_written"] == PAGES < 0.2 * plan["plan_rows_live"]
    assert scans(conn) == ("hnsw", "gin")
    run_all(pipeline, first.run_requests)
    assert scans(conn) == ("hnsw", "gin")           # written through them: a few rows
    assert not rechunk(pipeline).run_requests
    assert [r.job_name for r in pipeline.tick().runs] == []


def test_the_sensor_keeps_its_runs_fed_not_a_tick_s_worth_leased(loaded, conn, monkeypatch):
    pipeline = loaded
    configure(monkeypatch, CHUNK_MAX_TOKENS="40", CHUNK_OVERLAP_TOKENS="0", BATCH_MAX_PAGES="4", BATCH_SPREAD="1")
    first = rechunk(pipeline)
    assert [len(batch_pages(r)) for r in first.run_requests] == [4] * RUNS_AHEAD
    queued = [pipeline.instance.create_run_for_job(pipeline.job, run_config=r.run_config, tags=r.tags)
              for r in first.run_requests]
    waiting = rechunk(pipeline)
    assert not waiting.run_requests and f"{RUNS_AHEAD} re-chunk run(s) queued or running" in waiting.skip_reason.skip_message
    run_all(pipeline, first.run_requests[:1])       # one ends: one more is leased
    pipeline.instance.delete_run(queued[0].run_id)
    refill = rechunk(pipeline)
    assert [len(batch_pages(r)) for r in refill.run_requests] == [4]
    assert not set(batch_pages(refill.run_requests[0])) & {u for r in first.run_requests for u in batch_pages(r)}


def test_a_range_run_leaves_the_pages_a_sensor_batch_holds_and_says_so(loaded, conn, monkeypatch):
    pipeline = loaded
    mark = conn.execute("SELECT max(id) FROM embedding_ledger").fetchone()[0]
    configure(monkeypatch, CHUNK_MAX_TOKENS="40", CHUNK_OVERLAP_TOKENS="0", BATCH_MAX_PAGES="5", BATCH_SPREAD="1")
    held = rechunk(pipeline).run_requests           # leased, not run yet
    by_sensor = {u for r in held for u in batch_pages(r)}
    assert len(by_sensor) == 5 * RUNS_AHEAD
    keys = pipeline.partitions()
    ranged = pipeline.defs.resolve_job_def("rechunk").execute_in_process(raise_on_error=False,
        instance=pipeline.instance, tags={"dagster/asset_partition_range_start": keys[0],
                                          "dagster/asset_partition_range_end": keys[-1]})
    assert ranged.success
    for key in keys:
        (record,) = pipeline.instance.fetch_materializations(dg.AssetRecordsFilter(
            asset_key=dg.AssetKey("embeddings"), asset_partitions=[key]), limit=1).records
        meta = record.asset_materialization.metadata
        if key in by_sensor:
            assert "applied there, not twice" in meta["skipped"].value
        else:
            assert meta["status"].value == "switched"
    run_all(pipeline, held)                          # the sensor's batches apply theirs
    assert ledger_since(conn, mark) == {url(n): 1 for n in range(PAGES)}   # every page once
    assert not rechunk(pipeline).run_requests
    # The same range again (a retried backfill): every page says it has nothing to do, none is applied.
    again = pipeline.defs.resolve_job_def("rechunk").execute_in_process(
        instance=pipeline.instance, tags={"dagster/asset_partition_range_start": keys[0],
                                          "dagster/asset_partition_range_end": keys[-1]})
    assert again.success
    for asset in ("chunks", "embeddings"):   # one step for both: one lease, one reason
        for key in keys:
            (record,) = pipeline.instance.fetch_materializations(dg.AssetRecordsFilter(
                asset_key=dg.AssetKey(asset), asset_partitions=[key]), limit=1).records
            assert record.run_id == again.run_id
            assert "already cut with" in record.asset_materialization.metadata["skipped"].value
    assert ledger_since(conn, mark) == {url(n): 1 for n in range(PAGES)}


def test_a_ui_backfill_alone_plans_the_rechunk_and_makes_way_for_it(loaded, conn, monkeypatch):
    pipeline = loaded
    configure(monkeypatch, CHUNK_MAX_TOKENS="40", CHUNK_OVERLAP_TOKENS="0")
    keys = pipeline.partitions()
    ranged = pipeline.defs.resolve_job_def("rechunk").execute_in_process(
        instance=pipeline.instance, tags={"dagster/asset_partition_range_start": keys[0],
                                          "dagster/asset_partition_range_end": keys[-1]})
    assert ranged.success
    (planned,) = pipeline.instance.fetch_observations(dg.AssetKey("index"), limit=5).records
    assert planned.run_id == ranged.run_id and planned.asset_observation.metadata["plan_pages"].value == PAGES
    # The run let the indexes make way before it wrote (no sensor ran), and delivery_sensor builds them.
    assert scans(conn) == ("exact (HNSW index dropped for a bulk load)", "exact (GIN index dropped for a bulk load)")
    assert [r.job_name for r in pipeline.tick().runs] == ["space_index"]
    assert scans(conn) == ("hnsw", "gin")
    assert {r[0] for r in conn.execute("SELECT DISTINCT chunker_version FROM chunks")} == {
        chunking.chunker_signature(40, 0)}


def test_a_range_run_cuts_and_switches_in_one_step_and_a_refused_page_fails_alone(loaded, conn, monkeypatch):
    """A UI backfill's range run takes `chunks` and `embeddings` in one step, as a batch does (a
    slice cut while the one before it is embedded); a page the model refuses fails on its own
    partition, keeps serving its old chunks, and is not left leased."""
    pipeline = loaded
    configure(monkeypatch, CHUNK_MAX_TOKENS="40", CHUNK_OVERLAP_TOKENS="0")
    old = conn.execute("SELECT chunker_version FROM pages WHERE url = %s", (url(7),)).fetchone()[0]
    pipeline.fake.poison("Kestrel quay 7 line")
    keys = pipeline.partitions()
    ranged = pipeline.defs.resolve_job_def("rechunk").execute_in_process(raise_on_error=False,
        instance=pipeline.instance, tags={"dagster/asset_partition_range_start": keys[0],
                                          "dagster/asset_partition_range_end": keys[-1]})
    assert not ranged.success
    assert [s.step_key for s in pipeline.instance.get_run_step_stats(ranged.run_id)] == ["chunks_and_embeddings"]
    (failure,) = [e for e in ranged.all_events if e.is_step_failure]
    assert "1 of 30 page(s) failed" in failure.step_failure_data.error.message and url(7) in failure.step_failure_data.error.message

    def latest(asset: str, key: str, fetch):
        records = fetch(dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[key]), limit=1).records
        return records[0] if records and records[0].run_id == ranged.run_id else None

    signature = chunking.chunker_signature(40, 0)
    for key in keys:
        switched = latest("embeddings", key, pipeline.instance.fetch_materializations)
        observed = latest("embeddings", key, pipeline.instance.fetch_observations)
        assert latest("chunks", key, pipeline.instance.fetch_materializations) is not None   # cut, in this run
        if key == url(7):
            assert switched is None and observed.asset_observation.metadata["status"].value == "failed"
        else:
            assert switched.asset_materialization.metadata["status"].value == "switched" and observed is None
    versions = dict(conn.execute("SELECT url, chunker_version FROM pages").fetchall())
    assert versions == {key: old if key == url(7) else signature for key in keys}
    assert conn.execute("SELECT count(*) FROM chunks c JOIN pages p USING (page_id) WHERE p.url = %s "
                        "AND c.chunker_version = %s", (url(7), old)).fetchone()[0] > 0   # still served
    assert conn.execute("SELECT count(*) FROM pages WHERE leased_until IS NOT NULL").fetchone()[0] == 0
