"""Routing commits in small transactions, so a crawler's retry of a delivery never waits for a whole batch."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

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
        with pytest.raises(psycopg.errors.LockNotAvailable):
            repeat(database_url, current_rid)  # a repeat of a row routed right now waits for its chunk
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
