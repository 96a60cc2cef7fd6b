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


def test_build_then_activate_moves_search_to_the_new_model(db_conn, database_url, monkeypatch):
    old = CountingEmbedder()  # hash-v1-64
    urls = [f"https://example.com/s{i}" for i in range(3)]
    for i, url in enumerate(urls):
        put(db_conn, url, doc(2, tag=f" s{i}"))
    route_batch(db_conn, 100, MAX)
    for url in urls:
        index(db_conn, url, old)
    live_texts = {r[0] for r in db_conn.execute("SELECT embed_text FROM chunks").fetchall()}

    new = HashEmbedder(dimensions=32)
    calls: list[str] = []
    original = HashEmbedder.embed

    def counting(self, texts):
        calls.extend(texts)
        return original(self, texts)

    monkeypatch.setattr(HashEmbedder, "embed", counting)
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
    assert db_conn.execute("SELECT DISTINCT space_id FROM chunks").fetchall() == [(flipped.space_id,)]
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
