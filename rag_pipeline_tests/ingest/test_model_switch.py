"""A model switch builds a second space beside the live one, then flips search in one go."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rag_pipeline.cli import main as cli
from rag_pipeline.embedders.hash_embedder import HashEmbedder
from rag_pipeline.ingest import model_switch
from rag_pipeline.ingest.routing import route_batch
from rag_pipeline.settings import get_settings
from rag_pipeline.store import search, spaces
from rag_pipeline_tests.ingest.pagework import MAX, CountingEmbedder, doc, index, put


def test_build_then_activate_moves_search_to_the_new_model(db_conn, database_url, monkeypatch, hash_embedded):
    old = CountingEmbedder()  # hash-v1-64
    urls = [f"https://example.com/s{i}" for i in range(3)]
    for i, url in enumerate(urls):
        put(db_conn, url, doc(2, tag=f" s{i}"))
    route_batch(db_conn, 100, MAX)
    for url in urls:
        index(db_conn, url, old)
    live_texts = {r[0] for r in db_conn.execute("SELECT embed_text FROM chunks").fetchall()}

    new = HashEmbedder(dimensions=32)
    calls = hash_embedded()
    built = model_switch.build(db_conn, new)
    assert built.space.status == "building" and built.texts_embedded == len(live_texts)
    assert set(calls) == live_texts   # from stored chunk text: no crawl, no re-chunk
    active = spaces.active(db_conn)
    assert active.model == "hash-v1-64"   # search untouched while building

    # A page changes while the new space is being built, under the old model.
    put(db_conn, urls[0], doc(3, tag=" s0 changed"))
    route_batch(db_conn, 100, MAX)
    index(db_conn, urls[0], old)

    calls.clear()
    flipped = model_switch.activate(db_conn, new)
    assert flipped.model == "hash-v1-32" and flipped.status == "active"
    assert calls and all(" s0 changed" in c or "Part 2" in c for c in calls)  # only the catch-up
    # Every live chunk has its vector, of its current text, in the space search reads now.
    assert db_conn.execute(
        "SELECT count(*) FROM chunks c LEFT JOIN space_vectors v ON v.chunk_id = c.chunk_id"
        " AND v.space_id = %s AND v.embed_hash = c.embed_hash WHERE v.chunk_id IS NULL",
        (flipped.space_id,)).fetchone() == (0,)
    statuses = {s.model: s.status for s in spaces.list_all(db_conn)}
    assert statuses == {"hash-v1-64": "retired", "hash-v1-32": "active"}
    hits = search.nearest(db_conn, flipped, new.embed(["topic2 details s0 changed"]).vectors[0], k=3)
    assert hits[0].url == urls[0]

    # Switching back reuses the retired space's cached vectors for unchanged texts.
    calls.clear()
    model_switch.build(db_conn, old)
    back = model_switch.activate(db_conn, old)
    assert back.model == "hash-v1-64"
    assert len(calls) == 0 or all(" s0 changed" in c for c in calls)


def test_cli_space_commands(db_conn, database_url, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("EMBEDDING_PROVIDER", "hash")
    monkeypatch.setenv("EMBEDDING_DIMENSIONS", "64")
    get_settings.cache_clear()
    put(db_conn, "https://example.com/c", doc(1))
    route_batch(db_conn, 100, MAX)
    index(db_conn, "https://example.com/c", CountingEmbedder())
    monkeypatch.setenv("EMBEDDING_DIMENSIONS", "48")
    get_settings.cache_clear()
    runner = CliRunner()
    out = runner.invoke(cli, ["space", "build"])
    assert out.exit_code == 0 and "building" in out.output, out.output
    chunks = db_conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
    # Not a terminal: plain progress lines, the last one the whole walk.
    assert f"{chunks:,} of {chunks:,} chunks walked" in out.output, out.output
    out = runner.invoke(cli, ["space", "activate"])
    assert out.exit_code == 0 and "hash-v1-48" in out.output, out.output
    listing = runner.invoke(cli, ["space", "list"]).output
    assert "retired" in listing and "active" in listing
    result = runner.invoke(cli, ["search", "topic0 details", "--json"])
    assert result.exit_code == 0 and "https://example.com/c" in result.output


def test_build_refuses_chunks_without_stored_text(db_conn):
    put(db_conn, "https://example.com/o", doc(1))
    route_batch(db_conn, 100, MAX)
    index(db_conn, "https://example.com/o", CountingEmbedder())
    db_conn.execute("UPDATE chunks SET embed_text = NULL")
    with pytest.raises(model_switch.ModelSwitchError, match="re-chunk backfill"):
        model_switch.build(db_conn, HashEmbedder(dimensions=32))


# -- a page whose run straddles `space activate` ------------------------------------------------


def _changed_during_a_build(db_conn, url: str, old) -> HashEmbedder:
    """`url` indexed with `old`, a new space built, then a change staged: what a run has to switch."""
    from rag_pipeline.ingest import indexing

    put(db_conn, url, doc(2, tag=" before"))
    route_batch(db_conn, 100, MAX)
    index(db_conn, url, old)
    new = HashEmbedder(dimensions=32)
    model_switch.build(db_conn, new)
    put(db_conn, url, doc(2, tag=" after"))
    route_batch(db_conn, 100, MAX)
    indexing.take_newest_delivery(db_conn, url, MAX)
    indexing.stage_chunks(db_conn, url, 512, 64)
    return new


def _straddling_page(db_conn, database_url):
    """A page indexed in hash-v1-64, a hash-v1-32 space built, then the page changed and staged.

    Returns the URL and an old-model embedder that runs `space activate` (another connection)
    while the run embeds the changed text, the moment a flip can land between embed and switch."""
    import psycopg
    from pgvector.psycopg import register_vector

    url = "https://example.com/straddle"
    new = _changed_during_a_build(db_conn, url, CountingEmbedder())

    class FlipWhileEmbedding(CountingEmbedder):
        def embed(self, texts, token_counts=None):
            result = super().embed(texts, token_counts)
            with psycopg.connect(database_url, autocommit=True) as other:
                register_vector(other)
                model_switch.activate(other, new)
            return result

    return url, new, FlipWhileEmbedding()


def _live_spaces(db_conn, url) -> set[int]:
    """The spaces (not retired) holding a vector of the current text of every chunk of the page."""
    rows = db_conn.execute(
        "SELECT sv.space_id FROM chunks c JOIN pages p USING (page_id)"
        " JOIN space_vectors sv ON sv.chunk_id = c.chunk_id AND sv.embed_hash = c.embed_hash"
        " JOIN embedding_spaces s ON s.space_id = sv.space_id AND s.status <> 'retired'"
        " WHERE p.url = %s GROUP BY sv.space_id"
        " HAVING count(*) = (SELECT count(*) FROM chunks c2 JOIN pages p2 USING (page_id) WHERE p2.url = %s)",
        (url, url),
    ).fetchall()
    return {r[0] for r in rows}


def test_a_run_pinned_to_the_old_model_never_switches_into_a_retired_space(db_conn, database_url):
    from rag_pipeline.ingest import indexing
    from rag_pipeline.store.spaces import SpaceMismatch

    url, new, old = _straddling_page(db_conn, database_url)
    before = db_conn.execute("SELECT indexed_hash FROM pages WHERE url = %s", (url,)).fetchone()[0]
    with pytest.raises(SpaceMismatch, match="hash-v1-32"):
        indexing.embed_and_switch(db_conn, url, old)
    active = spaces.active(db_conn)
    assert active.model == "hash-v1-32"
    # The old version stays searchable, in the space search reads; the page is still due.
    assert _live_spaces(db_conn, url) == {active.space_id}
    assert db_conn.execute("SELECT indexed_hash FROM pages WHERE url = %s", (url,)).fetchone()[0] == before


def test_a_run_following_the_active_space_switches_into_the_space_activated_meanwhile(db_conn, database_url):
    from rag_pipeline.ingest import indexing

    url, new, old = _straddling_page(db_conn, database_url)
    chosen: list[str | None] = []

    def embedder_for(space):
        chosen.append(space.model if space else None)
        return old if space is None or space.model == old.model else new

    result = indexing.embed_and_switch(db_conn, url, embedder_for)
    active = spaces.active(db_conn)
    assert chosen == ["hash-v1-64", "hash-v1-32"]   # embedded again, once, for the space now active
    assert result.status == "switched" and result.space_id == active.space_id
    assert _live_spaces(db_conn, url) == {active.space_id}
    indexed, source = db_conn.execute("SELECT indexed_hash, source_hash FROM pages WHERE url = %s", (url,)).fetchone()
    assert source is not None and indexed == source
    hits = search.nearest(db_conn, active, new.embed(["topic1 details after"]).vectors[0], k=1)
    assert hits[0].url == url and "after" in hits[0].content


def test_a_flip_started_during_a_switch_waits_for_it_and_catches_up_on_its_texts(db_conn, database_url,
                                                                                monkeypatch):
    import threading

    import psycopg

    from rag_pipeline.ingest import indexing

    url = "https://example.com/during"
    old = CountingEmbedder()
    new = _changed_during_a_build(db_conn, url, old)

    flip = threading.Thread(target=lambda: _activate(database_url, new))
    reads = []
    real_maintained = spaces.maintained

    def maintained_then_flip(conn):
        found = real_maintained(conn)
        in_transaction = conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
        reads.append(([s.model for s in found if s.status == "active"], in_transaction))
        if in_transaction and not flip.is_alive():   # the switch's read of the spaces it writes
            flip.start()
            flip.join(1.0)    # the flip waits for this switch (or, unprotected, lands right here)
        return found

    monkeypatch.setattr(spaces, "maintained", maintained_then_flip)
    result = indexing.embed_and_switch(db_conn, url, old)
    flip.join(30)
    monkeypatch.setattr(spaces, "maintained", real_maintained)
    assert not flip.is_alive()
    assert result.status == "switched"
    assert [r for r in reads if r[1]] == [(["hash-v1-64"], True)]
    active = spaces.active(db_conn)
    assert active.model == "hash-v1-32"
    # The flip caught up on the texts this switch brought in: the page is searchable in the new space.
    assert _live_spaces(db_conn, url) == {active.space_id}
    hits = search.nearest(db_conn, active, new.embed(["topic1 details after"]).vectors[0], k=1)
    assert hits[0].url == url and "after" in hits[0].content


def _activate(database_url, embedder):
    import psycopg
    from pgvector.psycopg import register_vector

    with psycopg.connect(database_url, autocommit=True) as other:
        register_vector(other)
        model_switch.activate(other, embedder)


# -- a build at scale: keyset walk, index once, switches writing both spaces, a status flip ------


def _indexed(db_conn, n: int, old) -> list[str]:
    urls = [f"https://example.com/w{i}" for i in range(n)]
    for i, url in enumerate(urls):
        put(db_conn, url, doc(2, tag=f" w{i}"))
    route_batch(db_conn, 100, MAX)
    for url in urls:
        index(db_conn, url, old)
    return urls


def test_a_stopped_build_resumes_its_walk_where_it_got_to(db_conn):
    _indexed(db_conn, 6, CountingEmbedder())
    total = db_conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
    new = CountingEmbedder.__new__(CountingEmbedder)
    HashEmbedder.__init__(new, dimensions=32)
    new.inputs = []
    calls = {"n": 0}
    real = new.embed

    def fail_on_the_third_page(texts):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("embedding API down")
        return real(texts)

    new.embed = fail_on_the_third_page
    with pytest.raises(RuntimeError, match="API down"):
        model_switch.build(db_conn, new, page=2)
    embedded_before = len(new.inputs)
    assert 0 < embedded_before < total
    new.embed = real
    result = model_switch.build(db_conn, new, page=2)
    # The second walk starts after the last page the first one finished, and embeds only the rest.
    assert result.chunks_walked == total - 4 and result.index_built
    assert len(new.inputs) == total and len(set(new.inputs)) == total
    assert db_conn.execute("SELECT count(*) FROM space_vectors WHERE space_id = %s",
                           (result.space.space_id,)).fetchone() == (total,)


def test_the_index_is_built_once_after_the_walk_and_activate_rewrites_no_chunk(db_conn):
    old = CountingEmbedder()
    urls = _indexed(db_conn, 4, old)
    new = HashEmbedder(dimensions=32)
    states = []

    def during_the_walk(result):
        states.append(spaces.index_state(db_conn, result.space))

    result = model_switch.build(db_conn, new, page=3, on_progress=during_the_walk)
    assert states and set(states) == {"missing"}   # no index to maintain while the table loads
    assert spaces.index_state(db_conn, result.space) == "valid"

    # A page switched in after the build, under the old model: written into both spaces; its new
    # text has no vector of the new model yet, so its chunk waits on the new space's backlog.
    put(db_conn, urls[0], doc(2, tag=" w0 revised"))
    route_batch(db_conn, 100, MAX)
    index(db_conn, urls[0], old)
    assert db_conn.execute("SELECT count(*) FROM space_backlog WHERE space_id = %s",
                           (result.space.space_id,)).fetchone()[0] >= 1
    # The chunk rows of every page, with their row versions: the flip must not touch them.
    before = db_conn.execute("SELECT chunk_id, xmin::text FROM chunks ORDER BY chunk_id").fetchall()
    flipped = model_switch.activate(db_conn, new)
    assert flipped.status == "active"
    assert db_conn.execute("SELECT chunk_id, xmin::text FROM chunks ORDER BY chunk_id").fetchall() == before
    assert db_conn.execute("SELECT count(*) FROM space_backlog").fetchone() == (0,)
    for url in urls:
        assert _live_spaces(db_conn, url) == {flipped.space_id}
    hits = search.nearest(db_conn, flipped, new.embed(["topic1 details w0 revised"]).vectors[0], k=1)
    assert hits[0].url == urls[0] and "revised" in hits[0].content


def test_search_of_a_space_always_uses_its_index_even_with_a_generic_plan(db_conn):
    _indexed(db_conn, 2, CountingEmbedder())
    active = spaces.active(db_conn)
    from psycopg import sql

    query = sql.SQL(
        "SELECT v.chunk_id FROM {table} v JOIN chunks c ON c.chunk_id = v.chunk_id"
        " ORDER BY v.embedding{cast} <=> $1::text::vector{cast} LIMIT $2").format(
        table=active.table(), cast=active.cast())
    db_conn.execute("SET plan_cache_mode = force_generic_plan")
    db_conn.execute("SET enable_seqscan = off")   # a few rows: the cost model would rather scan them
    db_conn.execute(sql.SQL("PREPARE nearest_test (text, int) AS {}").format(query))
    plan = "\n".join(r[0] for r in db_conn.execute(
        "EXPLAIN EXECUTE nearest_test ('[" + ",".join(["0.1"] * 64) + "]', 5)").fetchall())
    assert active.index_name() in plan, plan


def test_a_page_switched_during_a_build_is_embedded_for_both_spaces(db_conn):
    from rag_pipeline.ingest import indexing

    old = CountingEmbedder()
    urls = _indexed(db_conn, 2, old)
    new = HashEmbedder(dimensions=32)
    building = model_switch.build(db_conn, new).space
    put(db_conn, urls[1], doc(2, tag=" w1 revised"))
    route_batch(db_conn, 100, MAX)
    indexing.take_newest_delivery(db_conn, urls[1], MAX)
    indexing.stage_chunks(db_conn, urls[1], 512, 64)
    result = indexing.embed_and_switch(db_conn, urls[1], lambda s: new if s and s.model == new.model else old)
    assert result.status == "switched"
    active = spaces.active(db_conn)
    # Both spaces hold the page's new texts at once: nothing waits for the build.
    assert _live_spaces(db_conn, urls[1]) == {active.space_id, building.space_id}
    assert db_conn.execute("SELECT count(*) FROM space_backlog").fetchone() == (0,)
