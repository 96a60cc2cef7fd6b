"""A delivery is decoded, normalized and hashed once, by routing; the page step uses what it kept."""

from __future__ import annotations

from rag_pipeline.core import text as core_text
from rag_pipeline.ingest import indexing, routing
from rag_pipeline.ingest.routing import route_batch
from rag_pipeline_tests.ingest.pagework import MAX, CountingEmbedder, doc, index, put


def test_the_page_step_neither_normalizes_nor_hashes_what_routing_did(conn, monkeypatch):
    url = "https://example.com/once"
    put(conn, url, doc(2, tag="once"))
    calls = {"normalize": 0, "hash": 0}
    for module in (routing, indexing):
        real_norm, real_hash = module.normalize_markdown, module.content_hash

        def counting_norm(*a, _real=real_norm, **k):
            calls["normalize"] += 1
            return _real(*a, **k)

        def counting_hash(*a, _real=real_hash, **k):
            calls["hash"] += 1
            return _real(*a, **k)

        monkeypatch.setattr(module, "normalize_markdown", counting_norm)
        monkeypatch.setattr(module, "content_hash", counting_hash)
    route_batch(conn, 100, MAX)
    kept = conn.execute("SELECT normalized_hash FROM deliveries").fetchone()[0]
    assert kept is not None and calls == {"normalize": 1, "hash": 1}
    index(conn, url, CountingEmbedder())
    assert calls == {"normalize": 1, "hash": 1}          # the page step reused both
    source = conn.execute("SELECT source_hash, indexed_hash, source_text FROM pages").fetchone()
    assert source[0] == source[1] == kept == core_text.content_hash(source[2])
    # Settled, the delivery no longer keeps the text or its hash (the page row holds them).
    assert conn.execute("SELECT normalized_text, normalized_hash FROM deliveries").fetchone() == (None, None)
