"""A batch is applied a few statements per step, whatever its size; when a step fails as a whole
it is done again page by page, and only the page at fault fails."""

from __future__ import annotations

import gzip
import uuid

import psycopg
import pytest
from pgvector.psycopg import register_vector

from rag_pipeline.embedders.openai_embedder import OpenAIEmbedder
from rag_pipeline.ingest import batch_apply, indexing
from rag_pipeline.ingest.batch_apply import Failed, RetryPolicy, Switched
from rag_pipeline.ingest.routing import route_batch
from rag_pipeline.store import chunks as chunk_store
from rag_pipeline.store import deliveries, spaces
from rag_pipeline_tests.fakes.openai_server import FakeOpenAI

RETRY = RetryPolicy(3, 1.0)
MAX_PAGE_BYTES = 1_000_000


def url(n: int) -> str:
    return f"https://docs.example.com/sets/{n}"


def markdown(n: int, version: int = 1) -> str:
    return (f"# Page {n}\n\nPage {n} tells how the heron relay {n} is wired, version {version}.\n\n"
            f"## Parts\n\nThe relay {n} keeps {n + version} spare coils in the east shed.\n")


class CountingCursor(psycopg.Cursor):
    """Counts what a connection sends: every execute, executemany and COPY."""

    sent = 0

    def execute(self, *args, **kwargs):
        CountingCursor.sent += 1
        return super().execute(*args, **kwargs)

    def executemany(self, *args, **kwargs):
        CountingCursor.sent += 1
        return super().executemany(*args, **kwargs)

    def copy(self, *args, **kwargs):
        CountingCursor.sent += 1
        return super().copy(*args, **kwargs)


class RecordingCursor(psycopg.Cursor):
    """Keeps the text of every statement a connection executes."""

    statements: list[str] = []

    def execute(self, query, *args, **kwargs):
        RecordingCursor.statements.append(query.as_string(self) if hasattr(query, "as_string") else str(query))
        return super().execute(query, *args, **kwargs)


def connect(database_url: str, **kwargs) -> psycopg.Connection:
    """As the pool's connections are: autocommit, vectors registered."""
    conn = psycopg.connect(database_url, autocommit=True, **kwargs)
    register_vector(conn)
    return conn


@pytest.fixture
def embedder():
    with FakeOpenAI(dimensions=32) as fake:
        yield OpenAIEmbedder("text-embedding-3-small", 32, api_key="sk-test", base_url=fake.base_url, max_retries=0)


def deliver(conn, pages: dict[str, str]) -> list:
    for page_url, text in pages.items():
        deliveries.insert(conn, rid=uuid.uuid4().hex, url=page_url, pushed_url=None, crawler_status=200,
                          original_status=200, content_type="text/markdown",
                          body=gzip.compress(text.encode()), body_encoding="gzip")
    route_batch(conn, len(pages), MAX_PAGE_BYTES)
    return deliveries.queued_work(conn, len(pages))


def started(conn, work, embedder):
    """The batch's events as they come (a test may stop it part-way)."""
    return batch_apply.apply_batch(conn, work, batch_key=None, embedder_for=lambda _space: embedder,
                                   chunk_budget=lambda _space: (512, 64), max_page_bytes=MAX_PAGE_BYTES,
                                   retry=RETRY)


def apply(conn, work, embedder) -> list:
    return list(started(conn, work, embedder))


def test_a_batch_of_40_pages_takes_no_more_statements_than_a_batch_of_5(database_url, embedder):
    with connect(database_url, cursor_factory=CountingCursor) as conn:
        apply(conn, deliver(conn, {url(n): markdown(n) for n in range(1)}), embedder)   # makes the space
        sent = {}
        for size, first in ((5, 100), (40, 200)):
            work = deliver(conn, {url(n): markdown(n) for n in range(first, first + size)})
            CountingCursor.sent = 0
            events = apply(conn, work, embedder)
            sent[size] = CountingCursor.sent
            switched = [e for e in events if isinstance(e, Switched)]
            assert len(switched) == size and {e.result.status for e in switched} == {"switched"}
        assert 0 < sent[40] <= sent[5], sent
        live, staged, embedded = conn.execute(
            "SELECT (SELECT count(*) FROM chunks), (SELECT count(*) FROM staged_chunks),"
            " (SELECT count(*) FROM deliveries WHERE outcome = 'embedded')").fetchone()
        assert staged == 0 and embedded == 46
        assert conn.execute("SELECT count(*) FROM embedding_ledger").fetchone()[0] == 46
        assert conn.execute("SELECT count(*) FROM space_vectors").fetchone()[0] == live


def test_a_page_with_nothing_staged_fails_alone_when_its_partitions_switch_together(database_url, embedder):
    urls = [url(n) for n in range(6)]
    with connect(database_url) as conn:
        deliver(conn, {u: markdown(n) for n, u in enumerate(urls)})
        list(batch_apply.take_sources(conn, urls, MAX_PAGE_BYTES, RETRY))
        # The `chunks` step ran for every partition but page 2's: its text has no chunks to switch in.
        list(batch_apply.stage_pages(conn, [u for u in urls if u != url(2)], lambda _space: (512, 64), RETRY))
        events = list(batch_apply.switch_pages(conn, urls, lambda _space: embedder, None, RETRY))

        failed = [e for e in events if isinstance(e, Failed)]
        assert [e.page_url for e in failed] == [url(2)] and "no staged chunks" in failed[0].failure.reason
        assert sorted(e.page_url for e in events if isinstance(e, Switched)) == sorted(set(urls) - {url(2)})
        outcomes = dict(conn.execute("SELECT page_url, outcome FROM deliveries").fetchall())
        assert outcomes.pop(url(2)) == "failed" and set(outcomes.values()) == {"embedded"}
        assert conn.execute("SELECT count(*) FROM chunks c JOIN pages p USING (page_id) WHERE p.url = %s",
                            (url(2),)).fetchone()[0] == 0


def test_the_embeddings_step_reads_staged_chunks_in_as_many_statements_for_12_pages_as_for_3(
        database_url, embedder):
    reads = {}
    with connect(database_url, cursor_factory=RecordingCursor) as conn:
        for size, first in ((3, 300), (12, 400)):
            urls = [url(n) for n in range(first, first + size)]
            deliver(conn, {u: markdown(n) for n, u in enumerate(urls)})
            list(batch_apply.take_sources(conn, urls, MAX_PAGE_BYTES, RETRY))
            list(batch_apply.stage_pages(conn, urls, lambda _space: (512, 64), RETRY))
            expected = {u: [c.content for c in chunk_store.staged(conn, pid, source)] for u, pid, source in
                        conn.execute("SELECT url, page_id, source_hash FROM pages WHERE url = ANY(%s)", (urls,))}
            assert all(expected.values())
            RecordingCursor.statements = []
            events = list(batch_apply.switch_pages(conn, urls, lambda _space: embedder, None, RETRY))
            reads[size] = [q for q in RecordingCursor.statements
                           if q.lstrip().startswith("SELECT") and "staged_chunks" in q]
            assert sorted(e.page_url for e in events if isinstance(e, Switched)) == sorted(urls)
            live = {u: [r[0] for r in conn.execute(
                "SELECT c.content FROM chunks c JOIN pages p USING (page_id) WHERE p.url = %s ORDER BY c.chunk_index",
                (u,)).fetchall()] for u in urls}
            assert live == expected
    assert len(reads[12]) == len(reads[3]), reads


def test_a_page_whose_source_moved_on_is_superseded_and_the_others_switch(database_url, embedder):
    urls = [url(n) for n in range(3)]
    with connect(database_url) as conn:
        apply(conn, deliver(conn, {urls[0]: markdown(0)}), embedder)   # makes the space
        deliver(conn, {u: markdown(n, 2) for n, u in enumerate(urls)})
        sources = {u: r for u, r in indexing.take_newest_deliveries(conn, urls, MAX_PAGE_BYTES).items()}
        staged = {u: (r[0].source_hash, r[1]) for u, r in indexing.stage_many(conn, urls, 512, 64).items()}
        conn.commit()
        vectors = {c.embed_hash: [1.0] + [0.0] * 31 for _, chunks in staged.values() for c in chunks}
        space = spaces.active(conn)
        chunk_store.cache_vectors(conn, space, [(h, v, 1) for h, v in vectors.items()])
        # A newer crawl of page 1 becomes its source after its chunks were cut.
        deliver(conn, {urls[1]: markdown(1, 3)})
        indexing.take_newest_delivery(conn, urls[1], MAX_PAGE_BYTES)
        conn.commit()

        results = indexing.switch_many(conn, staged, lambda _space: embedder, None, {})
        conn.commit()
        assert {u: r.status for u, r in results.items()} == {
            urls[0]: "switched", urls[1]: "superseded", urls[2]: "switched"}
        indexed = dict(conn.execute("SELECT url, indexed_hash FROM pages").fetchall())
        assert indexed[urls[0]] == sources[urls[0]].source_hash and indexed[urls[2]] == sources[urls[2]].source_hash
        assert indexed[urls[1]] != staged[urls[1]][0]
