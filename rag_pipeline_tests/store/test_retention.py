"""Retention: what `prune` deletes, what it must keep, and that indexing works the same afterwards.

The indexing steps are driven directly (no Dagster) to build real histories: routed deliveries,
runs that switched or failed, edits and reverts. Ages are set by moving timestamps back.
"""

from __future__ import annotations

import gzip
import uuid

import pytest
from pydantic import ValidationError

from rag_pipeline.core.urls import page_id
from rag_pipeline.embedders.base import EmbeddingError
from rag_pipeline.embedders.hash_embedder import HashEmbedder
from rag_pipeline.ingest import indexing
from rag_pipeline.ingest.routing import route_batch
from rag_pipeline.settings import Settings
from rag_pipeline.store import chunks as chunk_store
from rag_pipeline.store import deliveries, pages, pushes, retention, spaces

MAX = 10_000_000
DIMS = 64
DELIVERIES_ONLY = retention.Policy(delivery_days=14, push_days=0, vector_days=0)
PUSHES_ONLY = retention.Policy(delivery_days=0, push_days=30, vector_days=0)
VECTORS_ONLY = retention.Policy(delivery_days=0, push_days=0, vector_days=30)


class CountingEmbedder(HashEmbedder):
    def __init__(self):
        super().__init__(dimensions=DIMS)
        self.inputs: list[str] = []

    def embed(self, texts, token_counts=None):
        self.inputs.extend(texts)
        return super().embed(texts, token_counts)


class DownEmbedder(HashEmbedder):
    """The same model as CountingEmbedder, whose API is down."""

    def __init__(self):
        super().__init__(dimensions=DIMS)

    def embed(self, texts, token_counts=None):
        raise EmbeddingError("embedding API down")


def put(conn, url: str, text: str, *, crawler: int = 200, status: int = 200, rid: str | None = None) -> int:
    return deliveries.insert(
        conn, rid=rid or uuid.uuid4().hex, url=url, pushed_url=None, crawler_status=crawler,
        original_status=status, content_type="text/markdown", body=gzip.compress(text.encode()),
        body_encoding="gzip",
    )


def route(conn):
    return route_batch(conn, 100, MAX)


def index(conn, url: str, embedder) -> indexing.SwitchResult:
    indexing.take_newest_delivery(conn, url, MAX)
    indexing.stage_chunks(conn, url, 512, 64)
    return indexing.embed_and_switch(conn, url, embedder)


def fail_run(conn, url: str) -> None:
    """A page run whose embedding step failed: the page keeps its old version, its delivery is
    `failed` (the run-failure path records that, whoever records it)."""
    indexing.take_newest_delivery(conn, url, MAX)
    indexing.stage_chunks(conn, url, 512, 64)
    with pytest.raises(EmbeddingError):
        indexing.embed_and_switch(conn, url, DownEmbedder())
    conn.execute("UPDATE deliveries SET outcome = 'failed' WHERE page_url = %s AND outcome = 'queued'", (url,))


def age(conn, table: str, column: str, days: int, key: str, ids) -> None:
    conn.execute(f"UPDATE {table} SET {column} = {column} - make_interval(days => %s) WHERE {key} = ANY(%s)",
                 (days, list(ids)))


def outcomes(conn) -> dict[int, str]:
    return dict(conn.execute("SELECT id, coalesce(outcome, 'unrouted') FROM deliveries").fetchall())


def live_text(conn, url: str) -> str:
    return " ".join(r[0] for r in conn.execute(
        "SELECT c.content FROM chunks c JOIN pages p USING (page_id) WHERE p.url = %s ORDER BY chunk_index",
        (url,)).fetchall())


def test_old_settled_deliveries_go_and_what_may_still_be_needed_stays(conn):
    emb = CountingEmbedder()
    a, b, c, d = (f"https://example.com/{x}" for x in "abcd")
    # a: indexed, then an unchanged recrawl, then a crawler failure.
    a1 = put(conn, a, "# A\n\nalpha one")
    route(conn)
    index(conn, a, emb)
    a2 = put(conn, a, "# A\n\nalpha one")
    a3 = put(conn, a, "", crawler=500)
    # b: indexed, then a change whose run failed: b's newest delivery, waiting for its retry.
    b1 = put(conn, b, "# B\n\nbeta one")
    route(conn)
    index(conn, b, emb)
    b2 = put(conn, b, "# B\n\nbeta two")
    route(conn)
    fail_run(conn, b)
    # c: a failed change, overtaken by a later change that was applied.
    c1 = put(conn, c, "# C\n\ngamma one")
    route(conn)
    fail_run(conn, c)
    c2 = put(conn, c, "# C\n\ngamma two")
    route(conn)
    index(conn, c, emb)
    # d: a failed change, then only a crawler failure: d still waits for the failed one.
    d1 = put(conn, d, "# D\n\ndelta one")
    route(conn)
    index(conn, d, emb)
    d2 = put(conn, d, "# D\n\ndelta two")
    route(conn)
    fail_run(conn, d)
    d3 = put(conn, d, "", crawler=503)
    # q: routed, its run not done yet; x: a body that cannot be decoded (failed, no page known).
    q1 = put(conn, "https://example.com/q", "# Q\n\nqueued")
    x1 = deliveries.insert(conn, rid="undecodable", url="https://example.com/x", pushed_url=None,
                           crawler_status=200, original_status=200, content_type=None,
                           body=b"not gzip at all", body_encoding="gzip")
    route(conn)
    # r: settled but recent; u: never routed.
    r1 = put(conn, "https://example.com/r", "# R\n\nrecent")
    route(conn)
    index(conn, "https://example.com/r", emb)
    u1 = put(conn, "https://example.com/u", "# U\n\nunrouted")

    before = outcomes(conn)
    assert before[b2] == before[d2] == before[x1] == "failed"
    assert (before[q1], before[u1], before[d3]) == ("queued", "unrouted", "skipped")
    age(conn, "deliveries", "received_at", 20, "id", set(before) - {r1})
    prunable = {a1, a2, a3, b1, c1, c2, d1, d3}

    dry = retention.prune(conn, DELIVERIES_ONLY, dry_run=True)
    assert (dry.dry_run, dry.deliveries, dry.pushes, dry.vectors) == (True, len(prunable), 0, 0)
    assert outcomes(conn) == before

    done = retention.prune(conn, DELIVERIES_ONLY)
    assert done.deliveries == len(prunable)
    assert set(outcomes(conn)) == set(before) - prunable == {b2, d2, q1, x1, r1, u1}
    # Every source text a page has not switched in yet still has its delivery row.
    orphaned = conn.execute(
        "SELECT count(*) FROM pages p WHERE p.source_delivery_id > coalesce(p.applied_delivery_id, 0)"
        " AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.id = p.source_delivery_id)").fetchone()[0]
    assert orphaned == 0
    assert retention.prune(conn, DELIVERIES_ONLY).deliveries == 0

    # The pipeline reads pages, not old deliveries: the same text is still unchanged, a new one changes.
    route(conn)                                           # u's delivery, kept unrouted so far
    same = put(conn, a, "# A\n\nalpha one")
    assert dict(route(conn).outcomes) == {"unchanged": 1} and outcomes(conn)[same] == "unchanged"
    put(conn, c, "# C\n\ngamma three")
    assert len(route(conn).queued) == 1
    assert index(conn, c, emb).status == "switched" and "gamma three" in live_text(conn, c)
    # The failed delivery kept for b is the one its retry applies and marks.
    assert index(conn, b, emb).status == "switched" and "beta two" in live_text(conn, b)
    assert outcomes(conn)[b2] == "embedded"


def test_a_delivery_stays_while_pushes_delivered_looks_for_it(conn):
    url = "https://example.com/p"
    ids = pushes.begin(conn, [(url, url), (url, url)], reason="schedule", crawler="local", run_id=None)
    pushes.finish(conn, [pushes.Outcome(ids[0], "rid-old", 1), pushes.Outcome(ids[1], "rid-recent", 1)])
    old = put(conn, url, "", crawler=500, rid="rid-old")
    recent = put(conn, url, "", crawler=500, rid="rid-recent")
    route(conn)
    age(conn, "pushes", "pushed_at", 10, "push_id", [ids[0]])
    age(conn, "deliveries", "received_at", 10, "id", [old])
    age(conn, "pushes", "pushed_at", 3, "push_id", [ids[1]])
    age(conn, "deliveries", "received_at", 3, "id", [recent])

    # One day of retention, but the push of `recent` is inside the check's 7-day window.
    result = retention.prune(conn, retention.Policy(delivery_days=1, push_days=0, vector_days=0))
    assert result.deliveries == 1 and set(outcomes(conn)) == {recent}
    assert pushes.undelivered(conn, 3600).count == 0


def test_finished_old_pushes_go_pending_and_recent_ones_stay(conn):
    urls = [f"https://example.com/{i}" for i in range(6)]
    ids = pushes.begin(conn, [(u, u) for u in urls], reason="schedule", crawler="local", run_id=None)
    pushes.finish(conn, [
        pushes.Outcome(ids[0], "rid-0", 1),                     # pushed, delivered, routed
        pushes.Outcome(ids[1], None, 3, "HTTP 503"),             # refused by the crawler
        # ids[2] stays pending: its run died mid-push
        pushes.Outcome(ids[3], "rid-3", 1),                     # delivered, not routed yet
        pushes.Outcome(ids[4], "rid-4", 1),                     # recent
        pushes.Outcome(ids[5], None, 1, "HTTP 429"),             # a few days old
    ])
    put(conn, urls[0], "", crawler=500, rid="rid-0")
    route(conn)
    put(conn, urls[3], "", crawler=500, rid="rid-3")
    age(conn, "pushes", "pushed_at", 40, "push_id", ids[:4])
    age(conn, "pushes", "pushed_at", 3, "push_id", [ids[5]])

    def remaining():
        return {r[0] for r in conn.execute("SELECT push_id FROM pushes").fetchall()}

    assert retention.prune(conn, PUSHES_ONLY, dry_run=True).pushes == 2 and remaining() == set(ids)
    assert retention.prune(conn, PUSHES_ONLY).pushes == 2
    assert remaining() == {ids[2], ids[3], ids[4], ids[5]}
    # A day of retention still keeps what the crawler health checks look at (7 days).
    assert retention.prune(conn, retention.Policy(0, 1, 0)).pushes == 0
    # Once its delivery is routed, the old push of rid-3 has nothing left to give.
    route(conn)
    assert retention.prune(conn, PUSHES_ONLY).pushes == 1 and remaining() == {ids[2], ids[4], ids[5]}


ONE = "# Page\n\n## Setup\n\nInstall the tool and run it once.\n\n## Tokens\n\nRotate the webhook token monthly."
TWO = ONE.replace("Rotate the webhook token monthly.", "Rotate the webhook token weekly, and log it.")


def used_hashes(conn) -> set[bytes]:
    return {bytes(r[0]) for r in conn.execute("SELECT embed_hash FROM chunks").fetchall()}


def unused_marks(conn) -> dict[tuple[int, bytes], bool]:
    rows = conn.execute("SELECT space_id, embed_hash, unused_since IS NOT NULL FROM vectors").fetchall()
    return {(s, bytes(h)): marked for s, h, marked in rows}


def age_marks(conn, days: int) -> None:
    conn.execute("UPDATE vectors SET unused_since = unused_since - make_interval(days => %s)"
                 " WHERE unused_since IS NOT NULL", (days,))


def test_unused_vectors_are_kept_a_while_and_never_one_a_chunk_uses(conn):
    emb = CountingEmbedder()
    url = "https://example.com/page"
    put(conn, url, ONE)
    route(conn)
    index(conn, url, emb)
    first = used_hashes(conn)
    put(conn, url, TWO)
    route(conn)
    index(conn, url, emb)
    second = used_hashes(conn)
    edited_away, edited_in = first - second, second - first
    assert edited_away and edited_in
    active = spaces.active(conn)
    # A space being built for another model: vectors of live texts no chunk row of that space
    # references yet, and one of a text no chunk uses.
    other = spaces.ensure_building(conn, "other-model", 8)
    dead = b"\x01" * 32
    chunk_store.cache_vectors(conn, other, [(h, [1.0] * 8, 1) for h in second | {dead}])
    # A generation staged by a run in flight, about to switch in with its cached vector.
    staged_page = "https://example.com/staged"
    pages.ensure(conn, page_id(staged_page), staged_page)
    staged = b"\x02" * 32
    chunk_store.stage(conn, {page_id(staged_page): ("h", [chunk_store.StagedChunk(
        uuid.uuid4(), 0, "staged text", "staged text", staged, 2, "test")])})
    chunk_store.cache_vectors(conn, active, [(staged, [1.0] * DIMS, 2)])

    # First prune: nothing is old enough to go; each unused vector's clock starts now.
    result = retention.prune(conn, VECTORS_ONLY)
    assert (result.vectors, result.vectors_unused) == (0, len(edited_away) + 1)
    marked = {key for key, is_marked in unused_marks(conn).items() if is_marked}
    assert marked == {(active.space_id, h) for h in edited_away} | {(other.space_id, dead)}
    age_marks(conn, 29)
    assert retention.prune(conn, VECTORS_ONLY).vectors == 0           # unused for 29 days only

    # Days later the edit is reverted: the old texts are used again, and nothing is embedded.
    age_marks(conn, 2)
    put(conn, url, ONE)
    route(conn)
    emb.inputs.clear()
    assert index(conn, url, emb).chunks_embedded == 0 and emb.inputs == []

    dry = retention.prune(conn, VECTORS_ONLY, dry_run=True)
    assert dry.vectors == 1 and unused_marks(conn)[(active.space_id, next(iter(edited_in)))] is False
    result = retention.prune(conn, VECTORS_ONLY)
    assert result.vectors == 1 and (other.space_id, dead) not in unused_marks(conn)
    marks = unused_marks(conn)
    assert not any(marks[(active.space_id, h)] for h in edited_away)   # used again: mark cleared
    assert all(marks[(active.space_id, h)] for h in edited_in)          # unused from now on
    assert marks[(active.space_id, staged)] is False

    # Another month: the texts of the reverted edit go; every vector a chunk or a staged chunk uses
    # stays, in every space.
    age_marks(conn, 31)
    # (the building space's vectors of those texts too: no chunk uses them in any space)
    assert retention.prune(conn, VECTORS_ONLY).vectors == 2 * len(edited_in)
    left = unused_marks(conn)
    assert set(left) == ({(active.space_id, h) for h in first | {staged}}
                         | {(other.space_id, h) for h in second & first})
    assert not any(left.values())


def test_batches_walk_every_table_and_a_dry_run_counts_the_same(conn):
    conn.execute(
        "INSERT INTO deliveries (rid, url, page_url, body, body_encoding, received_at, processed_at, outcome)"
        " SELECT 'old-' || i, 'https://example.com/' || i, 'https://example.com/' || i, '\\x00'::bytea,"
        "        'identity', now() - interval '30 days', now() - interval '30 days',"
        "        CASE WHEN i % 5 = 0 THEN 'queued' ELSE 'skipped' END"
        "   FROM generate_series(1, 50) i")
    conn.execute(
        "INSERT INTO deliveries (rid, url, page_url, body, body_encoding, processed_at, outcome)"
        " SELECT 'new-' || i, 'https://example.com/n', 'https://example.com/n', '\\x00'::bytea, 'identity',"
        "        now(), 'skipped' FROM generate_series(1, 5) i")
    conn.execute(
        "INSERT INTO pushes (url, page_url, reason, crawler, pushed_at, result)"
        " SELECT 'https://example.com/' || i, 'https://example.com/' || i, 'schedule', 'local',"
        "        now() - interval '40 days', 'failed' FROM generate_series(1, 21) i")
    space_id = conn.execute("INSERT INTO embedding_spaces (model, dimensions, status)"
                            " VALUES ('m', 2, 'retired') RETURNING space_id").fetchone()[0]
    conn.execute(
        "INSERT INTO vectors (space_id, embed_hash, embedding, token_count, unused_since)"
        " SELECT %s, sha256(i::text::bytea), '[1,0]', 1, now() - interval '40 days'"
        "   FROM generate_series(1, 10) i", (space_id,))
    # Batch records: ended long ago (go), ended now, and one still open for its run (both stay).
    conn.execute("INSERT INTO batches (batch_key, ended_at) SELECT 'old-' || i, now() - interval '20 days'"
                 " FROM generate_series(1, 3) i")
    conn.execute("INSERT INTO batches (batch_key, ended_at) VALUES ('recent', now()), ('open', NULL)")
    policy = retention.Policy(delivery_days=14, push_days=30, vector_days=30, batch_size=4)

    def sizes():
        return tuple(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                     for t in ("deliveries", "pushes", "vectors", "batches"))

    dry = retention.prune(conn, policy, dry_run=True)
    assert (dry.deliveries, dry.pushes, dry.vectors, dry.ended_batches) == (40, 21, 10, 3)
    assert sizes() == (55, 21, 10, 5)
    done = retention.prune(conn, policy)
    assert (done.deliveries, done.pushes, done.vectors, done.ended_batches) == (40, 21, 10, 3)
    assert sizes() == (15, 0, 0, 2)
    # Ranges of 4 rows: 50 old deliveries, then the range that reaches the recent ones ends the walk.
    assert done.batches == {"deliveries": 13, "pushes": 6, "vectors": 3, "observations": 1, "ledger": 0}
    assert retention.prune(conn, policy).deliveries == 0


def test_retention_settings(monkeypatch):
    defaults = retention.Policy.from_settings(Settings())
    assert defaults == retention.Policy(delivery_days=14, push_days=30, vector_days=30, batch_size=2000)
    monkeypatch.setenv("VECTOR_RETENTION_DAYS", "0")
    assert retention.Policy.from_settings(Settings()).vector_days == 0      # keep forever
    monkeypatch.setenv("DELIVERY_RETENTION_DAYS", "-1")
    with pytest.raises(ValidationError, match="DELIVERY_RETENTION_DAYS"):
        Settings()
    with pytest.raises(ValueError):
        retention.Policy(batch_size=0)


def test_a_prune_refuses_to_run_inside_an_open_transaction(database_url):
    import psycopg

    with psycopg.connect(database_url) as conn:
        conn.execute("SELECT 1")          # an implicit transaction is now open
        with pytest.raises(RuntimeError, match="outside any transaction"):
            retention.prune(conn, DELIVERIES_ONLY)


def test_crawl_observations_beyond_the_newest_of_each_page_are_pruned(conn):
    import uuid

    pages = [uuid.uuid4() for _ in range(5)]
    for n, pid in enumerate(pages):
        conn.execute("INSERT INTO pages (page_id, url) VALUES (%s, %s)", (pid, f"https://example.com/o{n}"))
        conn.execute("INSERT INTO crawl_observations (page_id, crawled_at, interval_s, changed)"
                     " SELECT %s, now() - make_interval(hours => i), 3600, i %% 2 = 0 FROM generate_series(1, %s) i",
                     (pid, 3 + 2 * n))     # 3, 5, 7, 9, 11 observations
    policy = retention.Policy(delivery_days=0, push_days=0, vector_days=0, batch_size=2, observations_kept=4)
    dry = retention.prune(conn, policy, dry_run=True)
    assert dry.observations == 0 + 1 + 3 + 5 + 7
    assert conn.execute("SELECT count(*) FROM crawl_observations").fetchone()[0] == 35
    done = retention.prune(conn, policy)
    assert done.observations == 16 and done.batches["observations"] == 3      # ranges of 2 pages
    kept = dict(conn.execute("SELECT page_id, count(*) FROM crawl_observations GROUP BY 1").fetchall())
    assert [kept[pid] for pid in pages] == [3, 4, 4, 4, 4]
    # The newest stay: each page's oldest kept is at most 4 hours old.
    assert conn.execute("SELECT max(now() - crawled_at) FROM crawl_observations").fetchone()[0].total_seconds() \
        < 4 * 3600 + 60
