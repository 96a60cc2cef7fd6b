"""A failed page run is tried again after backoff, a bounded number of times, and never applies history."""

from __future__ import annotations

import dagster as dg
import pytest

from rag_pipeline.settings import Settings, get_settings
from rag_pipeline.store import deliveries
from rag_pipeline_tests.fakes.openai_server import FakeOpenAI
from rag_pipeline_tests.harness import TOKEN, Pipeline, deliver, load_defs
from rag_pipeline_tests.servers import serve
from webhook_sensor.app import create_app

URL = "https://docs.example.com/retry"
PAGE_V1 = "# Retry\n\nThe albatross protocol resends every frame twice before giving up."
PAGE_V2 = "# Retry\n\nThe albatross protocol now resends every frame three times."


@pytest.fixture
def stack(database_url, monkeypatch):
    with FakeOpenAI(dimensions=64) as fake:
        for name, value in {
            "DATABASE_URL": database_url, "EMBEDDING_PROVIDER": "openai", "OPENAI_API_KEY": "sk-test",
            "OPENAI_BASE_URL": fake.base_url, "EMBEDDING_DIMENSIONS": "64",
            "EMBEDDING_MAX_RETRIES": "0",       # the API's blips are the embedder's business, tested elsewhere
            "RUN_RETRY_BACKOFF_S": "0",         # retries due at once, so the test needs no clock
            "RUN_RETRY_MAX_ATTEMPTS": "3",
        }.items():
            monkeypatch.setenv(name, value)
        get_settings.cache_clear()
        app = create_app(Settings(WEBHOOK_TOKEN=TOKEN), database_url=database_url)
        with serve(app, health_path="/healthz") as base, dg.instance_for_test() as instance:
            yield base, fake, Pipeline(instance, load_defs())


def delivery(conn, delivery_id: int):
    return conn.execute(
        "SELECT outcome, attempts, retry_at IS NOT NULL, error FROM deliveries WHERE id = %s", (delivery_id,)
    ).fetchone()


def only_delivery_id(conn) -> int:
    return conn.execute("SELECT max(id) FROM deliveries").fetchone()[0]


def indexed(conn) -> bool:
    row = conn.execute("SELECT indexed_hash IS NOT NULL AND indexed_hash = source_hash FROM pages").fetchone()
    return bool(row and row[0])


def test_a_run_failed_by_an_outage_is_retried_and_then_indexes(stack, conn):
    base, fake, pipeline = stack
    deliver(base, URL, PAGE_V1)
    fake.fail_next(1, status=503)
    tick = pipeline.tick(expect_success=False)   # the batch records its page's failure itself
    delivery_id = only_delivery_id(conn)
    outcome, attempts, scheduled, error = delivery(conn, delivery_id)
    assert (outcome, attempts, scheduled) == ("failed", 1, True)
    assert "503" in error
    assert not indexed(conn)

    retry = pipeline.tick()  # the API is back
    assert retry.partitions == [URL]
    assert retry.result.run_requests[0].run_key != tick.result.run_requests[0].run_key
    assert delivery(conn, delivery_id)[:3] == ("embedded", 1, False)
    assert indexed(conn)
    assert pipeline.tick().result.run_requests in (None, [])  # nothing left to do


def test_retries_stop_after_the_configured_attempts(stack, conn):
    base, fake, pipeline = stack
    deliver(base, URL, PAGE_V1)
    fake.fail_next(100, status=500)
    keys = []
    for _ in range(3):
        tick = pipeline.tick(expect_success=False)
        keys += [r.run_key for r in tick.result.run_requests]
    delivery_id = only_delivery_id(conn)
    assert len(set(keys)) == 3   # one run, under its own key, per try
    assert delivery(conn, delivery_id)[:3] == ("failed", 3, False)
    assert pipeline.tick(execute=False).result.run_requests in (None, [])


def test_a_poisoned_input_is_not_retried(stack, conn):
    base, fake, pipeline = stack
    fake.poison("albatross")
    deliver(base, URL, PAGE_V1)
    pipeline.tick(expect_success=False)
    outcome, attempts, scheduled, error = delivery(conn, only_delivery_id(conn))
    assert (outcome, attempts, scheduled) == ("failed", 1, False)
    assert "refused" in error
    assert pipeline.tick(execute=False).result.run_requests in (None, [])


def test_a_newer_crawl_cancels_the_retry_of_an_older_one(stack, conn):
    base, fake, pipeline = stack
    deliver(base, URL, PAGE_V1)
    fake.fail_next(1, status=503)
    pipeline.tick(expect_success=False)
    old_id = only_delivery_id(conn)
    assert delivery(conn, old_id)[2] is True  # a retry is scheduled

    deliver(base, URL, PAGE_V2)
    tick = pipeline.tick()
    new_id = only_delivery_id(conn)
    assert tick.partitions == [URL]
    assert tick.result.run_requests[0].run_config["ops"]["index_pages"]["config"]["delivery_ids"] == [new_id]
    assert delivery(conn, old_id)[:3] == ("superseded", 1, False)
    assert delivery(conn, new_id)[0] == "embedded"
    texts = conn.execute("SELECT source_text FROM pages").fetchone()[0]
    assert "three times" in texts


def test_an_unchanged_crawl_supersedes_a_failed_older_one(stack, conn):
    base, fake, pipeline = stack
    deliver(base, URL, PAGE_V1)
    pipeline.tick()
    deliver(base, URL, PAGE_V2)
    fake.fail_next(1, status=503)
    pipeline.tick(expect_success=False)
    failed_id = only_delivery_id(conn)

    # The site reverted to what the index shows: unchanged, and V2's retry would now apply history.
    deliver(base, URL, PAGE_V1)
    tick = pipeline.tick()
    assert tick.result.run_requests in (None, [])
    assert delivery(conn, failed_id)[:3] == ("superseded", 1, False)
    assert indexed(conn)  # the source is the newest crawl again, not the failed run's V2


def test_record_run_failure_counts_each_try_once(conn):
    delivery_id = deliveries.insert(
        conn, rid="r1", url=URL, pushed_url=None, crawler_status=200, original_status=200,
        content_type="text/markdown", body=b"x", body_encoding="identity",
    )
    conn.execute("UPDATE deliveries SET processed_at = now(), outcome = 'queued', page_url = %s", (URL,))
    policy = dict(retryable=True, max_attempts=4, backoff_s=60, max_backoff_s=300)
    first = deliveries.record_run_failure(conn, delivery_id, 0, "boom", **policy)
    again = deliveries.record_run_failure(conn, delivery_id, 0, "boom", **policy)
    second = deliveries.record_run_failure(conn, delivery_id, 1, "boom", **policy)
    third = deliveries.record_run_failure(conn, delivery_id, 2, "boom", **policy)
    assert first is not None and again is None and second is not None and third is not None
    now = conn.execute("SELECT now()").fetchone()[0]
    # Backoff x4 up to the cap: 1 min, 4 min, then 5 (not 16).
    assert 55 <= (first - now).total_seconds() <= 65
    assert 235 <= (second - now).total_seconds() <= 245
    assert 295 <= (third - now).total_seconds() <= 305
    assert conn.execute("SELECT attempts FROM deliveries").fetchone()[0] == 3
    # The last allowed try fails for good: no retry after it.
    assert deliveries.record_run_failure(conn, delivery_id, 3, "boom", **policy) is None


# -- bad page text --------------------------------------------------------------------------------

PAGE_WITH_NUL = b"# Retry\x00\n\nThe albatross\x00 protocol resends every frame\x00 twice.\x00\n"


def test_a_page_with_nul_bytes_is_indexed_without_them(stack, conn):
    base, fake, pipeline = stack
    assert deliver(base, URL, PAGE_WITH_NUL).status_code == 200
    tick = pipeline.tick()                 # the run succeeds: nothing to fail, nothing to retry
    first = only_delivery_id(conn)
    assert delivery(conn, first)[:3] == ("embedded", 0, False)
    text, digest = conn.execute("SELECT source_text, indexed_hash FROM pages").fetchone()
    assert text == "# Retry\n\nThe albatross protocol resends every frame twice."
    assert indexed(conn) and tick.partitions == [URL]
    assert all("\x00" not in c for (c,) in conn.execute("SELECT content FROM chunks"))
    assert fake.inputs and all("\x00" not in t for t in fake.inputs)

    # The same bytes again hash the same: unchanged, no run, nothing embedded.
    embedded = len(fake.inputs)
    deliver(base, URL, PAGE_WITH_NUL)
    assert pipeline.tick().result.run_requests in (None, [])
    assert delivery(conn, only_delivery_id(conn))[0] == "unchanged"
    assert conn.execute("SELECT indexed_hash FROM pages").fetchone()[0] == digest
    assert len(fake.inputs) == embedded


def _keep_text_out(mark_many):
    """Routing without the text it normalized (the run normalizes the stored body itself)."""
    def without_text(conn, rows):
        return mark_many(conn, [(i, outcome, url, error, None, digest, at)
                                for i, outcome, url, error, _text, digest, at in rows])
    return without_text


def test_text_postgres_refuses_fails_the_run_once_and_is_not_retried(stack, conn, monkeypatch):
    base, fake, pipeline = stack
    # Routing and the chunker made unable to clean the text (what any such gap would do): the
    # run's first write of it, the page's source text, is refused by PostgreSQL.
    monkeypatch.setattr("rag_pipeline.ingest.routing.normalize_markdown", lambda text, *a, **k: text)
    monkeypatch.setattr("rag_pipeline.ingest.routing_writes.deliveries.mark_many",
                        _keep_text_out(deliveries.mark_many))
    monkeypatch.setattr("rag_pipeline.ingest.indexing.normalize_markdown", lambda text, *a, **k: text)
    deliver(base, URL, PAGE_WITH_NUL)
    pipeline.tick(expect_success=False)
    outcome, attempts, scheduled, error = delivery(conn, only_delivery_id(conn))
    assert (outcome, attempts, scheduled) == ("failed", 1, False)
    assert "NUL" in error and "a retry would fail the same way" in error
    assert pipeline.tick(execute=False).result.run_requests in (None, [])
    assert fake.inputs == [] and not indexed(conn)
