"""`rag-pipeline status`: the index, its queue and the last hour, as tables and as JSON."""

from __future__ import annotations

import json

from click.testing import CliRunner

from rag_pipeline.cli import main as cli
from rag_pipeline.ingest.routing import route_batch
from rag_pipeline.settings import get_settings
from rag_pipeline_tests.ingest.pagework import MAX, CountingEmbedder, doc, index, put


def test_status_reports_pages_queue_last_hour_and_cost(conn, database_url, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("EMBEDDING_PROVIDER", "hash")
    get_settings.cache_clear()
    embedder = CountingEmbedder()
    for n in range(2):
        put(conn, f"https://example.com/s{n}", doc(2, tag=str(n)))
    route_batch(conn, 100, MAX)
    switched = [index(conn, f"https://example.com/s{n}", embedder) for n in range(2)]
    put(conn, "https://example.com/s0", doc(2, tag="0"))              # a recrawl, unchanged
    route_batch(conn, 100, MAX)
    put(conn, "https://example.com/waiting", "# Waiting\n\nNot routed yet.")
    conn.execute("UPDATE deliveries SET received_at = now() - interval '90 minutes' WHERE processed_at IS NULL")

    shown = CliRunner().invoke(cli, ["status", "--json"])
    assert shown.exit_code == 0, shown.output
    report = json.loads(shown.output)
    assert report["pages"] == {"indexed": 2, "tombstoned": 0, "pending": 0}
    assert report["queue"]["unrouted"] == 1 and report["queue"]["queued"] == 0
    assert 89 <= report["queue"]["oldest_waiting_minutes"] <= 95
    assert report["last_hour"]["deliveries"] == {"embedded": 2, "unchanged": 1}
    tokens = sum(s.tokens_embedded for s in switched)
    assert report["last_hour"]["embedding"]["tokens_embedded"] == report["embedding"]["tokens_embedded"] == tokens > 0
    assert report["chunks"] == sum(s.chunks_total for s in switched)

    table = CliRunner().invoke(cli, ["status"])
    assert table.exit_code == 0, table.output
    lines = [" ".join(line.split()) for line in table.output.splitlines()]
    for title in ("pages", "queue", "last hour", "all time"):
        assert title in lines
    assert "unrouted 1" in lines and "unchanged 1" in lines and f"tokens embedded {tokens:,}" in lines
