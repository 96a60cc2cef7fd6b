"""The `index` asset: delivery_sensor records the index as a whole, and over a run of ticks its
figures add up to what the database holds."""

from __future__ import annotations

import gzip
import uuid

import dagster as dg

from rag_pipeline.settings import get_settings
from rag_pipeline.store import deliveries
from rag_pipeline_tests.harness import Pipeline, configure, load_defs

A, B, D, E = (f"https://example.com/{name}" for name in ("a", "b", "d", "e"))
OLD = "https://example.com/old-e"


def put(conn, url: str, text: str, *, status: int = 200, crawler: int = 200, pushed: str | None = None) -> None:
    deliveries.insert(conn, rid=uuid.uuid4().hex, url=url, pushed_url=pushed, crawler_status=crawler,
                      original_status=status, content_type="text/markdown", body=gzip.compress(text.encode()),
                      body_encoding="gzip")


def test_the_index_asset_adds_up_to_what_the_database_holds(database_url, conn, monkeypatch):
    configure(monkeypatch, DATABASE_URL=database_url, EMBEDDING_PROVIDER="hash", INDEX_SNAPSHOT_EVERY_S="0",
              EMBEDDING_PRICE_PER_MTOK="0.5")
    with dg.instance_for_test() as instance:
        pipeline = Pipeline(instance, load_defs())
        empty = pipeline.snapshot()
        # No `index` event while nothing is searchable (all zeros would say "empty"), but the checks.
        assert empty.skip_reason.skip_message.startswith("no page is searchable yet; 10 checks evaluated")
        assert not any(isinstance(e, dg.AssetMaterialization) for e in empty.asset_events)
        for url in (A, B, D):
            put(conn, url, f"# {url}\n\nThe first version of {url}, with a few words of its own.")
        pipeline.tick()
        # The first switch is recorded at once, not an interval after the checks above.
        first = pipeline.snapshot()
        assert isinstance(first.asset_events[0], dg.AssetMaterialization)
        assert not first.run_requests
        # A recrawl: A unchanged, B changed, D gone, a crawler failure, and a redirect to a new page.
        put(conn, A, f"# {A}\n\nThe first version of {A}, with a few words of its own.")
        put(conn, B, f"# {B}\n\nThe second version of {B}, changed.")
        put(conn, D, "gone", status=404)
        put(conn, A, "", status=503, crawler=503)
        put(conn, E, f"# {E}\n\nThe page the old address redirects to.", pushed=OLD)
        pipeline.tick()
        pipeline.snapshot()
        pipeline.tick()
        pipeline.snapshot()   # records the period in which the recrawl was applied

        records = instance.fetch_materializations(dg.AssetKey("index"), limit=100).records
        figures = [r.asset_materialization.metadata for r in reversed(records)]   # oldest first
        assert len(figures) == 3

        def total(name: str) -> float:
            return sum(f[name].value for f in figures)

        db = {o: n for o, n in conn.execute("SELECT outcome, count(*) FROM deliveries GROUP BY outcome").fetchall()}
        assert total("deliveries_embedded") == db["embedded"] == 5
        assert total("deliveries_unchanged") == db["unchanged"] == 1
        assert total("deliveries_tombstoned") == db["deleted"] == 1
        assert total("deliveries_skipped") == db["skipped"] == 1
        ledger = [int(v) for v in conn.execute(
            "SELECT sum(tokens_embedded), sum(tokens_reused) FROM embedding_ledger").fetchone()]
        assert total("tokens_embedded") == ledger[0] > 0
        assert total("tokens_avoided_by_reuse") == ledger[1]
        a_tokens = int(conn.execute("SELECT sum(token_count) FROM chunks c JOIN pages p USING (page_id)"
                                    " WHERE p.url = %s", (A,)).fetchone()[0])
        assert total("tokens_avoided_by_hash_gate") == a_tokens > 0   # A's recrawl, not embedded again
        assert abs(total("cost_usd") - ledger[0] / 1e6 * 0.5) < 1e-5       # EMBEDDING_PRICE_PER_MTOK
        assert abs(total("saved_usd") - (a_tokens + ledger[1]) / 1e6 * 0.5) < 1e-5
        assert abs(total("saved_usd_at_reference_price") - (a_tokens + ledger[1]) / 1e6 * 0.02) < 1e-5
        assert figures[-1]["price_note"].value.startswith("hash model at 0.5 USD")

        latest = figures[-1]
        live = conn.execute("SELECT count(*) FROM pages WHERE deleted_at IS NULL AND alias_of IS NULL"
                            " AND indexed_hash IS NOT NULL").fetchone()[0]
        assert latest["pages_live"].value == live == 3            # A, B, E
        assert latest["pages_tombstoned"].value == 1 and latest["aliases"].value == 1
        assert latest["chunks"].value == conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
        assert latest["verified_age_p95_minutes"].value < 5
        # A model that costs nothing says so, and prices what was avoided at the reference price.
        from datetime import UTC, datetime, timedelta

        from rag_pipeline.defs.index.index_asset import snapshot_event
        from rag_pipeline.settings import Settings
        now = datetime.now(UTC)
        free = snapshot_event(conn, Settings(EMBEDDING_PROVIDER="hash", EMBEDDING_PRICE_PER_MTOK=0), now - timedelta(hours=1),
                              now).metadata
        assert free["cost_usd"].value == 0 and free["price_note"].value.startswith("local model: embedding costs")
        assert free["saved_usd_at_reference_price"].value > 0
    get_settings.cache_clear()
