"""A batch goes slice by slice: the next slice is cut while the last one is being embedded, a text
two slices share is embedded once, a poisoned input fails its pages alone, and an outage fails the
rest of the batch at once (each page retried later) instead of once a slice."""

from __future__ import annotations

import threading

import psycopg
import pytest

from rag_pipeline.core.tokens import count_tokens
from rag_pipeline.embedders.base import EmbeddingError
from rag_pipeline.embedders.hash_embedder import HashEmbedder
from rag_pipeline.embedders.openai_embedder import OpenAIEmbedder
from rag_pipeline.ingest import batch_apply, indexing
from rag_pipeline.ingest.batch_apply import Failed, Staged, Switched
from rag_pipeline.store import db
from rag_pipeline_tests.fakes.openai_server import FakeOpenAI
from rag_pipeline_tests.ingest.test_batch_sets import apply, connect, deliver, markdown, started, url

@pytest.fixture(autouse=True)
def slices_of_three(monkeypatch):
    monkeypatch.setattr(batch_apply, "SLICE_PAGES", 3)


class Recorder(HashEmbedder):
    """Every call's texts, and what the test asks to happen during a call."""

    def __init__(self, during=None):
        super().__init__(dimensions=32)
        self.calls: list[list[str]] = []
        self.during = during

    def embed(self, texts, token_counts=None):
        self.calls.append(list(texts))
        if self.during is not None:
            self.during(len(self.calls))
        return super().embed(texts, token_counts)


def test_the_next_slice_is_staged_while_the_last_one_is_being_embedded(database_url, monkeypatch):
    next_staged = threading.Event()
    staged_calls = []
    original = indexing.stage_many

    def stage_many(conn, urls, *args, **kwargs):
        staged_calls.append(list(urls))
        if len(staged_calls) == 2:
            next_staged.set()
        return original(conn, urls, *args, **kwargs)

    monkeypatch.setattr(indexing, "stage_many", stage_many)
    seen = {}

    def during(call: int) -> None:
        # The first slice's call returns only once the second slice was staged (or after 30 s,
        # when it was not: the batch would then run one step after the other).
        if call == 1:
            seen["overlapped"] = next_staged.wait(30)

    embedder = Recorder(during)
    with connect(database_url) as conn:
        events = apply(conn, deliver(conn, {url(n): markdown(n) for n in range(7)}), embedder)
    assert [len(c) for c in staged_calls] == [3, 3, 1]
    assert seen == {"overlapped": True}
    assert len(embedder.calls) == 3
    assert sorted(e.page_url for e in events if isinstance(e, Switched)) == sorted(url(n) for n in range(7))
    for n in range(7):   # each page's steps in order, whatever the slices interleave
        steps = [type(e).__name__ for e in events if e.page_url == url(n)]
        assert steps == ["Sourced", "Staged", "Switched"], (n, steps)


def test_a_text_two_slices_share_is_embedded_once_and_paid_by_its_first_page(database_url):
    embedder = Recorder()
    # Slices of three: pages 3-5 say what pages 0-2 say, word for word.
    pages = {url(n): markdown(n % 3) for n in range(6)}
    with connect(database_url) as conn:
        events = apply(conn, deliver(conn, pages), embedder)
        ledger = dict(conn.execute(
            "SELECT page_url, tokens_embedded FROM embedding_ledger").fetchall())
    results = {e.page_url: e.result for e in events if isinstance(e, Switched)}
    assert sorted(results) == sorted(pages)
    assert len(embedder.calls) == 1   # the second slice found every text of its in the cache
    sent = embedder.calls[0]
    assert len(sent) == len(set(sent)) == sum(results[url(n)].chunks_total for n in range(3))
    for n in range(3, 6):
        assert results[url(n)].chunks_embedded == 0 and results[url(n)].tokens_embedded == 0
        assert results[url(n)].chunks_total == results[url(n - 3)].chunks_total
    assert sum(ledger.values()) == sum(count_tokens(t) for t in sent) > 0


def test_an_outage_that_outlasts_the_embedders_retries_fails_the_rest_of_the_batch_without_calling_again(
        database_url):
    def during(call: int) -> None:
        raise EmbeddingError("embedding API unreachable: connection refused")

    embedder = Recorder(during)
    with connect(database_url) as conn:
        events = apply(conn, deliver(conn, {url(n): markdown(n) for n in range(8)}), embedder)
        rows = conn.execute("SELECT page_url, outcome, retry_at IS NOT NULL, error FROM deliveries").fetchall()
    assert len(embedder.calls) == 1   # the first slice's call; the later slices wait with it
    failed = [e for e in events if isinstance(e, Failed)]
    assert sorted(e.page_url for e in failed) == sorted(url(n) for n in range(8))
    assert {e.step for e in failed} == {"embeddings"} and all(e.failure.retryable for e in failed)
    assert not any(isinstance(e, Switched) for e in events)
    # The second slice was cut before the first one's answer came; the third never was.
    assert sorted(e.page_url for e in events if isinstance(e, Staged)) == sorted(url(n) for n in range(6))
    for page_url, outcome, retry_due, error in rows:
        assert outcome == "failed" and retry_due and "unreachable" in error, page_url
        # The pages whose texts were never sent say so, and are tried again whatever the first
        # call's failure was.
        assert ("not sent" in error) == (page_url not in {url(n) for n in range(3)}), (page_url, error)


def test_a_poisoned_input_in_one_slice_fails_its_pages_alone_and_the_next_slice_switches(database_url):
    with FakeOpenAI(dimensions=32) as fake:
        fake.poison("relay 1 ", "Invalid input: refused by the content filter")
        embedder = OpenAIEmbedder("text-embedding-3-small", 32, api_key="sk-test", base_url=fake.base_url,
                                  max_retries=0)
        with connect(database_url) as conn:
            events = apply(conn, deliver(conn, {url(n): markdown(n) for n in range(6)}), embedder)
    failed = [e for e in events if isinstance(e, Failed)]
    assert [e.page_url for e in failed] == [url(1)] and not failed[0].failure.retryable
    assert sorted(e.page_url for e in events if isinstance(e, Switched)) == sorted(url(n) for n in range(6) if n != 1)


def test_a_batch_stopped_while_a_slice_is_being_embedded_frees_its_page_locks(database_url):
    release, called = threading.Event(), threading.Event()

    def during(call: int) -> None:
        called.set()
        release.wait(30)

    embedder = Recorder(during)
    with connect(database_url) as conn, connect(database_url) as other:
        work = deliver(conn, {url(n): markdown(n) for n in range(6)})
        events = started(conn, work, embedder)
        to_the_second_slice(events)   # the first slice's call is under way
        assert called.wait(30) and len(embedder.calls) == 1
        assert page_locks(other, conn) == 6
        events.close()   # the run stops here; the call under way is not waited for
        locked = page_locks(other, conn)
        # Nor would the process's exit wait for it (a cancelled run exits while the API is slow).
        calls = [t for t in threading.enumerate() if t.name == "embedding"]
        release.set()
        assert locked == 0
        assert calls and all(t.daemon for t in calls)
        assert conn.execute("SELECT count(*) FROM chunks").fetchone()[0] == 0


def to_the_second_slice(events) -> None:
    """Take a batch's events up to the second slice's chunks (slices of three pages)."""
    for event in events:
        if isinstance(event, Staged) and event.page_url == url(3):
            return
    raise AssertionError("the batch ended before its second slice was staged")


def page_locks(observer, conn) -> int:
    return observer.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s AND classid = %s AND objsubid = 2",
        (conn.info.backend_pid, batch_apply.PAGE_LOCK_CLASS)).fetchone()[0]


def test_what_a_call_paid_for_is_cached_though_the_run_stops_before_its_switch(database_url):
    """The thread that made the call caches its vectors: a run killed while it cuts the next slice
    does not pay for the same texts again on its retry."""
    embedder = Recorder()
    with connect(database_url) as conn:
        work = deliver(conn, {url(n): markdown(n) for n in range(6)})
        events = started(conn, work, embedder)
        to_the_second_slice(events)   # the first slice's call was sent
        for thread in [t for t in threading.enumerate() if t.name == "embedding"]:
            thread.join(30)
        events.close()   # the run stops before the first slice's answer was taken
        assert conn.execute("SELECT count(*) FROM chunks").fetchone()[0] == 0   # nothing switched
        cached = conn.execute("SELECT count(*) FROM vectors").fetchone()[0]
        assert len(embedder.calls) == 1 and cached == len(set(embedder.calls[0])) > 0

        again = Recorder()   # the retry: the same pages, the first slice's texts all cached
        events = apply(conn, deliver(conn, {url(n): markdown(n) for n in range(6)}), again)
    assert sorted(e.page_url for e in events if isinstance(e, Switched)) == sorted(url(n) for n in range(6))
    assert not set(embedder.calls[0]) & {text for call in again.calls for text in call}


def test_without_a_connection_to_spare_the_batch_caches_what_its_calls_paid_for_itself(database_url, monkeypatch,
                                                                                       caplog):
    def no_connection(_conn):
        def refuse():
            raise psycopg.OperationalError("sorry, too many clients already")
        return refuse

    monkeypatch.setattr(db, "opener", no_connection)
    embedder = Recorder()
    with connect(database_url) as conn:
        events = apply(conn, deliver(conn, {url(n): markdown(n) for n in range(6)}), embedder)
        cached = conn.execute("SELECT count(*) FROM vectors").fetchone()[0]
    assert sorted(e.page_url for e in events if isinstance(e, Switched)) == sorted(url(n) for n in range(6))
    assert cached == len({text for call in embedder.calls for text in call}) > 0
    assert "too many clients" in caplog.text and "the batch's own connection caches them" in caplog.text
