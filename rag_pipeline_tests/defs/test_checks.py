"""The index checks pass on a healthy index and name what is wrong on a broken one."""

import gzip
import uuid

import dagster as dg

from rag_pipeline.defs.index import checks
from rag_pipeline.settings import get_settings
from rag_pipeline.store import deliveries
from rag_pipeline_tests.fakes.openai_server import FakeOpenAI
from rag_pipeline_tests.harness import Pipeline, configure, load_defs


def evaluations(instance) -> dict[str, dg.AssetCheckEvaluation]:
    result = load_defs().resolve_job_def("index_checks").execute_in_process(instance=instance)
    assert result.success
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def test_checks_pass_then_catch_a_broken_index(database_url, conn, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("EMBEDDING_PROVIDER", "hash")
    get_settings.cache_clear()
    with dg.instance_for_test() as instance:
        pipeline = Pipeline(instance, load_defs())
        for url in ("https://example.com/a", "https://example.com/b"):
            deliveries.insert(conn, rid=uuid.uuid4().hex, url=url, pushed_url=None, crawler_status=200,
                              original_status=200, content_type=None,
                              body=gzip.compress(b"# Title\n\nSome words about " + url.encode()),
                              body_encoding="gzip")
        assert len(pipeline.tick().partitions) == 2

        healthy = evaluations(instance)
        assert set(healthy) == {checks.INDEX_MATCHES_SOURCE, checks.NO_TOMBSTONED_CHUNKS,
                                checks.ONE_ACTIVE_SPACE, checks.NO_STUCK_DELIVERIES, checks.INDEX_RUNS_SUCCEED,
                                checks.QUEUE_DRAINS, checks.EMBEDDING_API_ANSWERS}
        assert all(e.passed for e in healthy.values()), healthy

        # Break the invariants by hand: a tombstone that kept its chunks, and an old unrouted delivery.
        conn.execute("UPDATE pages SET deleted_at = now() WHERE url = 'https://example.com/a'")
        deliveries.insert(conn, rid="stuck-1", url="https://example.com/c", pushed_url=None, crawler_status=200,
                          original_status=200, content_type=None, body=b"x", body_encoding="identity")
        conn.execute("UPDATE deliveries SET received_at = now() - interval '2 hours' WHERE rid = 'stuck-1'")
        broken = evaluations(instance)
        tomb = broken[checks.NO_TOMBSTONED_CHUNKS]
        assert not tomb.passed and tomb.severity == dg.AssetCheckSeverity.ERROR
        assert "https://example.com/a" in tomb.description
        stuck = broken[checks.NO_STUCK_DELIVERIES]
        assert not stuck.passed and "stuck-1" in stuck.description
        assert broken[checks.ONE_ACTIVE_SPACE].passed

        # A live chunk whose vector is missing from the space search reads.
        conn.execute("DELETE FROM space_vectors WHERE chunk_id IN (SELECT chunk_id FROM chunks c"
                     " JOIN pages p USING (page_id) WHERE p.url = 'https://example.com/b')")
        missing = evaluations(instance)[checks.ONE_ACTIVE_SPACE]
        assert not missing.passed and "https://example.com/b" in missing.description


def deliver_page(conn, url: str, text: str) -> None:
    deliveries.insert(conn, rid=uuid.uuid4().hex, url=url, pushed_url=None, crawler_status=200,
                      original_status=200, content_type=None, body=gzip.compress(text.encode()),
                      body_encoding="gzip")


def test_every_index_run_failing_turns_the_checks_red_at_their_next_run(database_url, conn, monkeypatch):
    with FakeOpenAI(dimensions=64) as fake, dg.instance_for_test() as instance:
        configure(monkeypatch, DATABASE_URL=database_url, EMBEDDING_PROVIDER="openai", OPENAI_API_KEY="sk-test",
                  OPENAI_BASE_URL=fake.base_url, EMBEDDING_DIMENSIONS="64", EMBEDDING_MAX_RETRIES="0",
                  RUN_RETRY_BACKOFF_S="0")
        pipeline = Pipeline(instance, load_defs())
        deliver_page(conn, "https://example.com/ok", "# Fine\n\nIndexed before the outage.")
        pipeline.tick()
        assert all(e.passed for e in evaluations(instance).values())

        # The embedding API goes down: every index run from now on fails.
        fake.outage(503)
        for n in range(2):
            deliver_page(conn, f"https://example.com/down/{n}", f"# Down {n}\n\nNever indexed: the API is down.")
            failed = pipeline.tick(expect_success=False).runs
            assert [r.status for r in failed] == [dg.DagsterRunStatus.FAILURE]
        red = evaluations(instance)
        runs = red[checks.INDEX_RUNS_SUCCEED]
        assert not runs.passed and runs.severity == dg.AssetCheckSeverity.ERROR
        assert "the newest 2 index runs all failed" in runs.description and "switched no page" in runs.description
        assert "pages fail with: embeddings: EmbeddingError" in runs.description and "HTTP 503" in runs.description
        api = red[checks.EMBEDDING_API_ANSWERS]
        assert not api.passed and api.severity == dg.AssetCheckSeverity.ERROR and "OPENAI_API_KEY" in api.description

        # A run succeeding again (the API back) turns them green at the next check run.
        fake.recover()
        deliver_page(conn, "https://example.com/back", "# Back\n\nIndexed after the outage.")
        pipeline.tick()
        green = evaluations(instance)
        assert green[checks.INDEX_RUNS_SUCCEED].passed and green[checks.EMBEDDING_API_ANSWERS].passed
        assert "1 of the newest 2 index runs succeeded" in green[checks.INDEX_RUNS_SUCCEED].description

        # Runs that fail for one page the model refuses, while the others switch: a warning, not an error.
        fake.poison("POISONED")
        for n in range(2):
            deliver_page(conn, f"https://example.com/fine/{n}", f"# Fine {n}\n\nThis one indexes.")
            deliver_page(conn, f"https://example.com/bad/{n}", f"# Bad {n}\n\nPOISONED text the model refuses.")
            pipeline.tick(expect_success=False)
        partial = evaluations(instance)[checks.INDEX_RUNS_SUCCEED]
        assert not partial.passed and partial.severity == dg.AssetCheckSeverity.WARN
        assert "some pages fail on their own" in partial.description


def test_a_queue_that_does_not_drain_is_red_with_what_to_do(database_url, conn, monkeypatch):
    configure(monkeypatch, DATABASE_URL=database_url, EMBEDDING_PROVIDER="hash", CHECK_WINDOW_MINUTES="10")
    with dg.instance_for_test() as instance:
        deliver_page(conn, "https://example.com/waiting", "# Waiting\n\nNobody routes me.")
        conn.execute("UPDATE deliveries SET received_at = now() - interval '25 minutes'")
        stalled = evaluations(instance)[checks.QUEUE_DRAINS]
        assert not stalled.passed and stalled.severity == dg.AssetCheckSeverity.ERROR
        assert "the oldest for 25 min" in stalled.description and "daemon" in stalled.description
        assert "last 10 min" in stalled.description

        Pipeline(instance, load_defs()).tick()   # the sensor routes it and its run applies it
        drained = evaluations(instance)[checks.QUEUE_DRAINS]
        assert drained.passed and drained.metadata["waiting"].value == 0
