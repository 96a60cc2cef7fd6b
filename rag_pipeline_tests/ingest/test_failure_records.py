"""A delivery that fails is recorded as failed, with a reason that can itself be stored, and the rest go on."""

from __future__ import annotations

import pytest

from rag_pipeline.embedders.base import EmbeddingError
from rag_pipeline.embedders.hash_embedder import HashEmbedder
from rag_pipeline.ingest import indexing, routing
from rag_pipeline.store import deliveries, pages
from rag_pipeline_tests.ingest.pagework import MAX, put

BAD = "https://a.example.com/refused"


def row(conn, delivery_id: int):
    return conn.execute(
        "SELECT outcome, error, retry_at, page_url FROM deliveries WHERE id = %s", (delivery_id,)
    ).fetchone()


def refuse_one_page(monkeypatch, url: str) -> None:
    """Postgres refuses the data of one page (SQLSTATE class 22), after part of its routing was written."""
    ensure_many = pages.ensure_many

    def ensure_then_refuse(conn, rows):
        ensure_many(conn, rows)
        if any(page_url == url for _, page_url, *_ in rows):
            conn.execute("SELECT %s::integer", ("not a number",))   # 22P02, a psycopg.DataError

    monkeypatch.setattr(pages, "ensure_many", ensure_then_refuse)


def test_a_data_error_fails_its_delivery_only(db_conn, monkeypatch):
    before = put(db_conn, "https://a.example.com/one", "# One\n\nThe first page.")
    bad = put(db_conn, BAD, "# Refused\n\nThe page Postgres will not take.")
    after = put(db_conn, "https://a.example.com/two", "# Two\n\nThe second page.")
    refuse_one_page(monkeypatch, BAD)

    result = routing.route_batch(db_conn, 100, MAX)   # does not raise

    assert dict(result.outcomes) == {"queued": 2, "failed": 1}
    assert [q.delivery_id for q in result.queued] == [before, after]
    outcome, error, retry_at, _ = row(db_conn, bad)
    assert outcome == "failed" and retry_at is None          # not retryable: no retry is scheduled
    assert "cannot be stored" in error and "22P02" in error and "not a number" in error
    # Its savepoint was rolled back: the page row it had written is gone, the others stay.
    assert pages.get(db_conn, BAD) is None
    assert pages.get(db_conn, "https://a.example.com/two") is not None
    # Routed once and for all: neither routed again nor picked up as a due retry.
    assert routing.route_batch(db_conn, 100, MAX).routed == 0
    assert deliveries.claim_due_retries(db_conn, 100) == 0


def test_the_delivery_sensor_tick_survives_a_data_error(database_url, db_conn, monkeypatch):
    import dagster as dg

    from rag_pipeline.settings import get_settings
    from rag_pipeline_tests.harness import Pipeline, load_defs

    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("EMBEDDING_PROVIDER", "hash")
    get_settings.cache_clear()
    good = put(db_conn, "https://a.example.com/good", "# Good\n\nA page that routes.")
    bad = put(db_conn, BAD, "# Refused\n\nThe page Postgres will not take.")
    refuse_one_page(monkeypatch, BAD)
    with dg.instance_for_test() as instance:
        tick = Pipeline(instance, load_defs()).tick(execute=False)
    assert tick.partitions == ["https://a.example.com/good"]
    assert row(db_conn, good)[0] == "queued"
    assert row(db_conn, bad)[0] == "failed"


def test_a_run_failure_text_with_nul_is_stored_without_it(db_conn):
    delivery_id = put(db_conn, "https://a.example.com/nul", "# Nul\n\nText.")
    routing.route_batch(db_conn, 100, MAX)
    due = deliveries.record_run_failure(
        db_conn, delivery_id, 0, "embeddings: server said \x00bad\x00 input",
        retryable=True, max_attempts=3, backoff_s=60, max_backoff_s=300,
    )
    assert due is not None
    outcome, error, _, _ = row(db_conn, delivery_id)
    assert (outcome, error) == ("failed", "embeddings: server said bad input")


class BrokenEmbedder(HashEmbedder):
    def embed(self, texts, token_counts=None):
        raise EmbeddingError("upstream answered 'bad\x00byte'")


def test_an_embedding_failure_with_nul_is_recorded_and_raised_as_itself(db_conn):
    url = "https://a.example.com/broken"
    delivery_id = put(db_conn, url, "# Broken\n\nThe embedder will fail on this page.")
    routing.route_batch(db_conn, 100, MAX)
    indexing.take_newest_delivery(db_conn, url, MAX)
    indexing.stage_chunks(db_conn, url, 512, 64)
    with pytest.raises(EmbeddingError, match="bad"):   # not a psycopg.DataError from recording it
        indexing.embed_and_switch(db_conn, url, BrokenEmbedder(dimensions=64))
    outcome, error, _, _ = row(db_conn, delivery_id)
    assert outcome == "failed" and error == "embedding failed: upstream answered 'badbyte'"


def test_a_delivery_marked_failed_with_nul_in_its_reason_is_stored(db_conn):
    delivery_id = put(db_conn, "https://a.example.com/mark", "# Mark\n\nText.")
    deliveries.mark(db_conn, delivery_id, "failed", error="cannot decode \x00 body")
    assert row(db_conn, delivery_id)[:2] == ("failed", "cannot decode  body")
