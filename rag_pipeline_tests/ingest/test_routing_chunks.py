"""Routing commits in small transactions, so a crawler's retry of a delivery never waits for a whole batch."""

from __future__ import annotations

import threading
import time

import psycopg

from rag_pipeline.ingest import routing
from rag_pipeline.store import deliveries
from rag_pipeline_tests.ingest.pagework import MAX, put


def rid_of(conn, delivery_id: int) -> str:
    return conn.execute("SELECT rid FROM deliveries WHERE id = %s", (delivery_id,)).fetchone()[0]


def repeat(database_url: str, rid: str) -> int | None:
    """The receiver's INSERT of an already stored rid, waiting at most 1 s on row locks."""
    with psycopg.connect(database_url, autocommit=True) as other:
        other.execute("SET lock_timeout = '1s'")
        return deliveries.insert(
            other, rid=rid, url="https://a.example.com/x", pushed_url=None, crawler_status=200,
            original_status=200, content_type="text/markdown", body=b"x", body_encoding="identity",
        )


def test_routed_chunks_commit_before_the_batch_ends(db_conn, database_url, monkeypatch):
    ids = [put(db_conn, f"https://a.example.com/p{i}", f"# Page {i}\n\nText {i}.") for i in range(12)]
    blocked, release = threading.Event(), threading.Event()
    decode = routing.decode_stored
    calls = []

    def slow_decode(body, encoding, max_bytes):
        calls.append(1)
        if len(calls) == 7:  # the second delivery of the second chunk
            blocked.set()
            release.wait(30)
        return decode(body, encoding, max_bytes)

    monkeypatch.setattr(routing, "decode_stored", slow_decode)
    done: list[routing.RoutingResult] = []
    worker = threading.Thread(target=lambda: done.append(routing.route_batch(db_conn, 100, MAX, chunk=5)))
    worker.start()
    try:
        assert blocked.wait(30)
        with psycopg.connect(database_url, autocommit=True) as observer:
            routed = observer.execute(
                "SELECT count(*) FROM deliveries WHERE processed_at IS NOT NULL").fetchone()[0]
            first_rid, current_rid = rid_of(observer, ids[0]), rid_of(observer, ids[5])
        assert routed == 5  # the first chunk is committed while the second is still being routed
        assert repeat(database_url, first_rid) is None  # a repeat of a committed row: answered at once
        # A repeat of a row being routed right now is answered at once too: the chunk's writes are
        # held to its end (ingest/routing_writes.py), and only then wait for its commit.
        assert repeat(database_url, current_rid) is None
    finally:
        release.set()
        worker.join(30)
    assert sum(done[0].outcomes.values()) == 12 and done[0].outcomes["queued"] == 12


def test_routing_stops_at_its_deadline_after_one_chunk_and_leaves_the_rest_unrouted(db_conn):
    """The sensor routes against a time budget (a tick must end within the daemon's 60 s): past the
    deadline no chunk starts, but one always runs, so a slow tick still advances."""
    for i in range(12):
        put(db_conn, f"https://a.example.com/d{i}", f"# Page {i}\n\nText {i}.")
    first = routing.route_batch(db_conn, 100, MAX, chunk=5, until=time.monotonic())
    assert first.routed == 5 and first.cut_short
    unrouted = db_conn.execute("SELECT count(*) FROM deliveries WHERE processed_at IS NULL").fetchone()[0]
    assert unrouted == 7
    rest = routing.route_batch(db_conn, 100, MAX, chunk=5, until=time.monotonic() + 60)
    assert rest.routed == 7 and not rest.cut_short
    # At its limit, a call is not "cut short" even past the deadline.
    assert not routing.route_batch(db_conn, 100, MAX, chunk=5, until=time.monotonic()).cut_short


def test_a_chunk_of_100_deliveries_takes_no_more_statements_than_a_chunk_of_5(database_url):
    """Routing reads and writes a chunk a set at a time: new pages, changed pages and unchanged
    recrawls cost the same few statements whatever the chunk's size."""
    from rag_pipeline_tests.ingest.test_batch_sets import CountingCursor

    with psycopg.connect(database_url, autocommit=True, cursor_factory=CountingCursor) as conn:
        sent = {}
        for size, first in ((5, 0), (100, 100)):
            texts = {f"https://a.example.com/s{n}": f"# Page {n}\n\nText {n}." for n in range(first, first + size)}
            for page_url, text in texts.items():
                put(conn, page_url, text)
            CountingCursor.sent = 0
            assert routing.route_batch(conn, size, MAX, chunk=size).outcomes == {"queued": size}
            sent[("new", size)] = CountingCursor.sent
            # Their indexed text is what was delivered: the same crawl again is an unchanged recrawl.
            conn.execute("UPDATE pages SET indexed_hash = crawl_hash, source_hash = crawl_hash WHERE url = ANY(%s)",
                         (list(texts),))
            conn.execute("UPDATE deliveries SET outcome = 'embedded' WHERE outcome = 'queued'")
            for page_url, text in texts.items():
                put(conn, page_url, text)
            CountingCursor.sent = 0
            assert routing.route_batch(conn, size, MAX, chunk=size).outcomes == {"unchanged": size}
            sent[("unchanged", size)] = CountingCursor.sent
        assert 0 < sent[("new", 100)] <= sent[("new", 5)], sent
        assert 0 < sent[("unchanged", 100)] <= sent[("unchanged", 5)], sent
        verified, observed = conn.execute(
            "SELECT (SELECT count(*) FROM pages WHERE last_verified_at IS NOT NULL),"
            " (SELECT count(*) FROM crawl_observations)").fetchone()
        assert verified == 105 and observed == 105      # each recrawl stamped, and observed unchanged


def test_a_page_delivered_twice_in_one_chunk_reads_what_its_first_delivery_wrote(db_conn):
    """The second delivery of a page in a chunk sees the first one's writes (held writes are
    flushed before it is read): the older one is superseded, the newer one queued, the crawl
    noted twice."""
    first = put(db_conn, "https://a.example.com/twice", "# Twice\n\nThe first text.")
    put(db_conn, "https://a.example.com/other", "# Other\n\nAnother page.")
    second = put(db_conn, "https://a.example.com/twice", "# Twice\n\nThe second text.")
    result = routing.route_batch(db_conn, 10, MAX, chunk=10)
    assert dict(result.outcomes) == {"queued": 3}
    assert [q.delivery_id for q in result.queued if q.page_url.endswith("/twice")] == [first, second]
    work = deliveries.queued_work(db_conn, 10)
    assert sorted(w.delivery_id for w in work if w.page_url.endswith("/twice")) == [second]
    assert db_conn.execute("SELECT count(*) FROM crawl_observations").fetchone()[0] == 1


def test_a_second_router_leaves_routing_to_the_first(db_conn, database_url):
    """Each code location's delivery_sensor routes: while one routes a chunk, another routes
    nothing (it never waits: a router whose host died holds the lock until PostgreSQL notices),
    so no page is read by two routers before either wrote it (newest crawl wins)."""
    put(db_conn, "https://a.example.com/turns", "# Turns\n\nThe first crawl.")
    put(db_conn, "https://a.example.com/turns", "# Turns\n\nThe second crawl.")
    with psycopg.connect(database_url) as first:
        with first.transaction():
            assert len(deliveries.claim_unrouted(first, 1)) == 1   # the first crawl, being routed
            started = time.monotonic()
            beside = routing.route_batch(db_conn, 10, MAX)
            # Not the second crawl beside it (it would read the page before the first is written),
            # and no wait.
            assert beside.routed == 0 and time.monotonic() - started < 5
    # The first router's transaction ended without routing: the next tick routes both, in turn.
    assert routing.route_batch(db_conn, 10, MAX).routed == 2
