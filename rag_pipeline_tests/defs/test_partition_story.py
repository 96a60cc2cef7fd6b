"""Every crawl is told on its page's partition: a run's materializations for new and changed
content, an event with its outcome for what routing settled (unchanged, tombstone, crawler
failure, superseded), and the redirect on the page it leads to."""

from __future__ import annotations

import dagster as dg

from rag_pipeline.store import deliveries
from rag_pipeline_tests.defs.test_index_asset import A, B, D, E, OLD, put
from rag_pipeline_tests.harness import Pipeline, configure, load_defs

GONE = "https://example.com/never-there"


def story(instance, page: str) -> list[tuple[str, str, int | None]]:
    """(asset, status, delivery) of every event of the page's partition, oldest first."""
    out = []
    for kind, fetch in (("materialization", instance.fetch_materializations), ("observation", instance.fetch_observations)):
        for asset in ("pages", "embeddings"):
            records = fetch(dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[page]), limit=100).records
            for r in records:
                event = r.asset_materialization if kind == "materialization" else r.asset_observation
                meta = event.metadata
                out.append((r.storage_id, asset, meta["status"].value if "status" in meta else kind,
                            meta["delivery_id"].value if "delivery_id" in meta else None))
    return [(asset, status, delivery) for _, asset, status, delivery in sorted(out)]


def test_each_delivery_is_one_event_of_its_page_with_its_outcome(database_url, conn, monkeypatch):
    configure(monkeypatch, DATABASE_URL=database_url, EMBEDDING_PROVIDER="hash", INDEX_SNAPSHOT_EVERY_S="3600")
    with dg.instance_for_test() as instance:
        pipeline = Pipeline(instance, load_defs())
        for url in (A, B, D):
            put(conn, url, f"# {url}\n\nThe first version of {url}.")
        pipeline.tick()
        put(conn, A, f"# {A}\n\nThe first version of {A}.")                 # unchanged
        put(conn, B, f"# {B}\n\nThe second version of {B}.")                # changed
        put(conn, D, "gone", status=404)                                     # tombstone
        put(conn, A, "", status=503, crawler=503)                            # the crawler failed
        put(conn, E, f"# {E}\n\nWhere the old address leads.", pushed=OLD)   # a redirect, new content
        put(conn, GONE, "gone", status=410)                                  # only ever gone
        pipeline.tick()
        ids = {url: [r[0] for r in conn.execute("SELECT id FROM deliveries WHERE url = %s ORDER BY id", (url,))]
               for url in (A, B, D, E, GONE)}

        assert story(instance, A) == [("pages", "updated", ids[A][0]), ("embeddings", "switched", None),
                                      ("pages", "unchanged", ids[A][1]), ("pages", "skipped", ids[A][2])]
        b = [(asset, status) for asset, status, _ in story(instance, B)]
        assert b.count(("embeddings", "switched")) == 2          # two contents, two switches
        d = story(instance, D)
        assert ("pages", "tombstoned", ids[D][1]) in d and d[-1] == ("embeddings", "tombstoned", ids[D][1])
        e = story(instance, E)
        assert ("pages", "redirect", ids[E][0]) in e and ("embeddings", "switched") in [(x, y) for x, y, _ in e]
        assert story(instance, GONE) == [("pages", "tombstoned", ids[GONE][0]), ("embeddings", "tombstoned", ids[GONE][0])]
        assert GONE in instance.get_dynamic_partitions("pages")   # a page that only ever answered 410 appears

        # Bounded: one event per settled delivery (two for a tombstone), none for the deliveries a run applied.
        settled = conn.execute("SELECT count(*) FILTER (WHERE outcome IN ('unchanged', 'skipped', 'superseded')),"
                               " count(*) FILTER (WHERE outcome = 'deleted') FROM deliveries").fetchone()
        observed = sum(len(instance.fetch_observations(dg.AssetRecordsFilter(
            asset_key=dg.AssetKey("pages"), asset_partitions=[url]), limit=100).records) for url in (A, B, D, E, GONE))
        assert observed == settled[0] + settled[1] + 1   # + the redirect of E
        assert deliveries.outcome_counts(conn)["unchanged"] == 1


def test_a_page_served_over_http_shows_the_address_that_opens(database_url, conn, monkeypatch):
    """The partition key is the page's identity (https-spelled, so a move to https keeps one
    history); each crawl event carries the address as served, which the UI links."""
    configure(monkeypatch, DATABASE_URL=database_url, EMBEDDING_PROVIDER="hash", INDEX_SNAPSHOT_EVERY_S="3600")
    served = "http://example.com/served-over-http"
    key = "https://example.com/served-over-http"
    with dg.instance_for_test() as instance:
        defs = load_defs()
        pipeline = Pipeline(instance, defs)
        put(conn, served, "# Served\n\nOver plain http.")
        pipeline.tick()
        put(conn, served, "# Served\n\nOver plain http.")                    # unchanged
        put(conn, served, "gone", status=404)                                # then gone
        pipeline.tick()
        opened = []
        for fetch in (instance.fetch_materializations, instance.fetch_observations):
            for asset in ("pages", "embeddings"):
                for r in fetch(dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[key]), limit=10).records:
                    event = r.asset_materialization or r.asset_observation
                    if event.metadata.get("status") and event.metadata["status"].value in ("updated", "unchanged", "tombstoned"):
                        opened.append(event.metadata["crawled_url"].value)
        assert len(opened) == 4 and set(opened) == {served}
        described = defs.resolve_asset_graph().get(dg.AssetKey("pages")).description
        assert "spelled https://" in described and "crawled_url" in described
