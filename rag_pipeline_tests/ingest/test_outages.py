"""The embedding API going away in the middle of a batch's requests: what it answered is kept."""

from __future__ import annotations

from rag_pipeline.embedders.openai_embedder import OpenAIEmbedder
from rag_pipeline.ingest import routing
from rag_pipeline.ingest.batch_apply import Failed, RetryPolicy, Switched, apply_batch
from rag_pipeline.store import deliveries
from rag_pipeline_tests.fakes.openai_server import FakeOpenAI
from rag_pipeline_tests.ingest.pagework import MAX, doc, put


def _apply(conn, embedder):
    work = deliveries.queued_work(conn, 100)
    return list(apply_batch(conn, work, batch_key=None, embedder_for=lambda _space: embedder,
                            chunk_budget=lambda _space: (256, 0), max_page_bytes=MAX,
                            retry=RetryPolicy(max_attempts=4, backoff_s=0)))


def test_vectors_answered_before_an_outage_are_kept_and_never_paid_for_again(db_conn):
    urls = [f"https://docs.example.com/outage/{n}" for n in range(3)]
    for n, url in enumerate(urls):
        put(db_conn, url, doc(4, tag=f" of page {n}"))
    routing.route_batch(db_conn, 100, MAX)
    with FakeOpenAI(dimensions=64) as fake:
        embedder = OpenAIEmbedder("text-embedding-3-small", 64, api_key="sk-test", base_url=fake.base_url,
                                  max_retries=0, max_inputs_per_request=2)
        fake.fail_next(1000, status=503, after=2)   # two requests answered, then the API is gone

        first = _apply(db_conn, embedder)

        assert [type(e) for e in first if isinstance(e, (Failed, Switched))] == [Failed] * 3
        assert all(e.failure.retryable for e in first if isinstance(e, Failed))
        answered = fake.inputs
        assert len(answered) == 4
        cached = db_conn.execute("SELECT count(*) FROM vectors").fetchone()[0]
        assert cached == 4                       # kept, though every page failed
        rows = db_conn.execute("SELECT outcome, attempts, retry_at IS NOT NULL FROM deliveries").fetchall()
        assert rows == [("failed", 1, True)] * 3
        # Nothing was switched: search still has what it had (here, nothing).
        assert db_conn.execute("SELECT count(*) FROM chunks").fetchone()[0] == 0

        fake.reset()                             # the API is back
        assert deliveries.claim_due_retries(db_conn, 100) == 3
        second = _apply(db_conn, embedder)

        assert [type(e) for e in second if isinstance(e, (Failed, Switched))] == [Switched] * 3
        retried = fake.inputs
        assert set(answered).isdisjoint(retried)  # no text paid for twice
        texts = db_conn.execute("SELECT count(DISTINCT embed_hash) FROM chunks").fetchone()[0]
        assert len(answered) + len(retried) == texts
        assert db_conn.execute("SELECT count(*) FROM deliveries WHERE outcome = 'embedded'").fetchone()[0] == 3
