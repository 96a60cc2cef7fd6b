"""Routing keeps the network guard's rule: content delivered under an internal address (whoever
crawled it) is stored, marked `refused`, and never becomes a page."""

from __future__ import annotations

import gzip
import uuid

from rag_pipeline.core.addresses import parse_networks
from rag_pipeline.ingest.routing import route_batch
from rag_pipeline.store import deliveries

MAX = 10_000_000


def _deliver(conn, url: str) -> int:
    return deliveries.insert(
        conn, rid=uuid.uuid4().hex, url=url, pushed_url=None, crawler_status=200, original_status=200,
        content_type="text/markdown", body=gzip.compress(b"# Metadata\n\niam credentials"), body_encoding="gzip",
    )


def test_a_delivery_under_an_internal_address_is_refused_and_never_indexed(db_conn):
    ids = {url: _deliver(db_conn, url) for url in (
        "http://169.254.169.254/latest/meta-data/", "http://127.0.0.1:8080/admin",
        "http://localhost/x", "http://[::1]/y", "https://example.com/ok")}
    routed = route_batch(db_conn, 100, MAX, allowed_networks=())
    assert dict(routed.outcomes) == {"refused": 4, "queued": 1}
    assert [w.page_url for w in routed.queued] == ["https://example.com/ok"]
    assert routed.settled == []          # no partition is told about a URL that is no page of ours
    rows = dict(db_conn.execute("SELECT id, outcome || ': ' || coalesce(error, '') FROM deliveries").fetchall())
    assert rows[ids["http://169.254.169.254/latest/meta-data/"]].startswith("refused: not indexed: 169.254.169.254 is a link-local")
    assert "names this machine" in rows[ids["http://localhost/x"]]
    assert db_conn.execute("SELECT array_agg(url) FROM pages").fetchone()[0] == ["https://example.com/ok"]


def test_an_allowed_network_is_indexed(db_conn):
    _deliver(db_conn, "http://127.0.0.1:8900/pricing")
    routed = route_batch(db_conn, 100, MAX, allowed_networks=parse_networks("127.0.0.0/8"))
    assert dict(routed.outcomes) == {"queued": 1}
