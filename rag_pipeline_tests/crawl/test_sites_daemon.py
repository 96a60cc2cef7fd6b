"""Issue 23 acceptance, through the real daemon: a site declared as a component (the sample site,
pointed at a loopback site) is read by its discovery sensor, its pages are pushed to the local
crawler by recrawl_sensor and indexed by delivery_sensor's batch runs, each on the site's own
partition set. Then the site changes: pages leave the sitemap (one 404, one 200), a <lastmod>
moves, and a sitemap turns hostile; robots.txt is obeyed throughout."""

from __future__ import annotations

import gzip
import uuid

import dagster as dg
import pytest

from rag_pipeline.crawl.loopback_site import LoopbackSite
from rag_pipeline.store import db
from rag_pipeline_tests.daemons import daemon_stack
from rag_pipeline_tests.harness import TOKEN

NS = "http://www.sitemaps.org/schemas/sitemap/0.9"
SITE_KEYS = [dg.AssetKey(["sample", step]) for step in ("pages", "chunks", "embeddings")]


def urlset(base: str, entries: dict[str, str]) -> bytes:
    body = "".join(f"<url><loc>{base}{path}</loc><lastmod>{mod}</lastmod></url>" for path, mod in entries.items())
    return f'<?xml version="1.0" encoding="UTF-8"?><urlset xmlns="{NS}">{body}</urlset>'.encode()


def page(title: str, text: str) -> str:
    return f"<html><head><title>{title}</title></head><body><main><h1>{title}</h1><p>{text}</p></main></body></html>"


@pytest.fixture
def dagster_url(database_url):
    return db.as_url(db.with_database(database_url, f"dagster_{uuid.uuid4().hex[:8]}"))


# The longest end-to-end test (discovery, pushes, crawls, batches, then the site changing, in that
# order): about 2 minutes alone, over 5 on two cores that are busy with other test files.
@pytest.mark.timeout(600)
def test_a_site_is_discovered_indexed_and_kept_true_to_its_sitemap(database_url, dagster_url, conn, tmp_path,
                                                                  monkeypatch):
    with LoopbackSite() as site, daemon_stack(database_url, dagster_url, tmp_path, monkeypatch) as (base, _, start):
        b = site.base_url
        https = b.replace("http://", "https://")
        site.set_raw("/robots.txt", f"User-agent: *\nDisallow: /private/\nSitemap: {b}/sitemap.xml\n".encode(),
                     content_type="text/plain")
        index = (f'<?xml version="1.0" encoding="UTF-8"?><sitemapindex xmlns="{NS}">'
                 f"<sitemap><loc>{b}/a.xml.gz</loc></sitemap><sitemap><loc>{b}/b.xml.gz</loc></sitemap>"
                 "</sitemapindex>").encode()
        site.set_raw("/sitemap.xml", index)
        a = {"/a1": "2026-11-01", "/a2": "2026-11-01", "/private/secret": "2026-11-01"}
        bb = {"/b1": "2026-11-01", "/gone404": "2026-11-01", "/gone200": "2026-11-01"}
        site.set_raw("/a.xml.gz", gzip.compress(urlset(b, a)), content_type="application/gzip")
        site.set_raw("/b.xml.gz", gzip.compress(urlset(b, bb)), content_type="application/gzip")
        for path, text in (("/a1", "Otters hold hands while they sleep."), ("/a2", "Herons stand still."),
                           ("/b1", "Beavers build dams."), ("/gone404", "A page about to go."),
                           ("/gone200", "A page the sitemap will forget."), ("/private/secret", "Keep out.")):
            site.set_page(path, page(path.strip("/"), text))
        site.redirect("/docs/old-webhook-guide", "/a1")      # the sample site's seed

        # As deployed: only deliveries that answer a push of ours are indexed.
        daemon = start(SAMPLE_SITE_URL=b, CRAWLER="local", CRAWLER_CALLBACK_URL=f"{base}/webhook?token={TOKEN}",
                       RECRAWL_INTERVAL_S="1", DISCOVERY_INTERVAL_S="1", CRAWLER_USER_AGENT="rag-test/1",
                       WEBHOOK_ACCEPT_UNSOLICITED="false")

        def indexed() -> dict[str, str]:
            return dict(conn.execute("SELECT url, source_text FROM pages WHERE site = 'sample'"
                                     " AND indexed_hash IS NOT NULL AND deleted_at IS NULL").fetchall())

        listed = {f"{https}{p}" for p in ("/a1", "/a2", "/b1", "/gone404", "/gone200")}
        # 1. Discovered from a sitemap index of two gzip'd sitemaps, pushed, crawled and indexed.
        # Four runs in a row (discovery, push, the crawl's deliveries, a batch): each takes 20 s to
        # start on two cores busy with other daemon tests.
        daemon.wait(lambda: set(indexed()) == listed, 240, "the sitemap's pages indexed")
        assert site.hits["/private/secret"] == 0             # robots.txt: never fetched, never registered
        assert conn.execute("SELECT count(*) FROM pages WHERE url LIKE '%%/private/%%'").fetchone()[0] == 0
        partitions = set(daemon.instance.get_dynamic_partitions("sample__pages"))
        assert listed <= partitions
        # The run writes its events after the pages switched: waited for, not assumed.
        for key in SITE_KEYS:
            daemon.wait(lambda: listed <= daemon.instance.get_materialized_partitions(key), 30,
                        f"every page materialized on {key.to_user_string()}")
        first = daemon.instance.get_latest_materialization_event(dg.AssetKey(["sample", "discovery"]))
        meta = first.asset_materialization.metadata
        assert (meta["listed"].value, meta["new"].value, meta["disallowed"].value) == (6, 5, 1)
        pushed_a1 = conn.execute("SELECT count(*) FROM pushes WHERE url = %s", (site.url("/a1"),)).fetchone()[0]

        # 2. The site changes: two pages leave the sitemap (one now 404, one still 200), a1 is
        # edited and its <lastmod> moves past its last crawl.
        site.remove("/gone404")
        site.set_page("/a1", page("a1", "Otters now juggle pebbles."))
        a["/a1"] = "2030-01-01"
        del bb["/gone404"], bb["/gone200"]
        site.set_raw("/a.xml.gz", gzip.compress(urlset(b, a)), content_type="application/gzip")
        site.set_raw("/b.xml.gz", gzip.compress(urlset(b, bb)), content_type="application/gzip")
        conn.execute("UPDATE sites SET next_discovery_at = now() WHERE name = 'sample'")

        def state(path: str):
            return conn.execute("SELECT deleted_at IS NOT NULL, unlisted_at IS NOT NULL, last_crawled_at"
                                " FROM pages WHERE url = %s", (f"{https}{path}",)).fetchone()

        crawled_200 = state("/gone200")[2]
        daemon.wait(lambda: state("/gone404")[0], 180, "the page gone from the sitemap, answering 404, tombstoned")
        daemon.wait(lambda: state("/gone200")[2] > crawled_200, 180, "the page gone from the sitemap crawled to check it")
        assert state("/gone200")[:2] == (False, True)      # answered 200: kept, marked unlisted
        daemon.wait(lambda: "juggle" in indexed().get(f"{https}/a1", ""), 180, "the moved lastmod's page re-indexed")
        assert conn.execute("SELECT count(*) FROM pushes WHERE url = %s", (site.url("/a1"),)).fetchone()[0] > pushed_a1
        assert f"{https}/gone404" not in indexed() and f"{https}/gone200" in indexed()
        assert conn.execute("SELECT count(*) FROM deliveries WHERE outcome = 'unsolicited'").fetchone()[0] == 0

        # 3. A sitemap turns hostile (an entity bomb): the reading says why, nothing is lost, the
        # daemon goes on.
        site.set_raw("/b.xml.gz", b'<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaa"><!ENTITY b "&a;&a;">]>'
                                  b"<urlset><url><loc>&b;</loc></url></urlset>")
        before = conn.execute("SELECT max(reading_id) FROM site_readings").fetchone()[0]
        conn.execute("UPDATE sites SET next_discovery_at = now() WHERE name = 'sample'")
        reading = daemon.wait(lambda: conn.execute(
            "SELECT complete, errors, counts FROM site_readings WHERE reading_id > %s AND finished_at IS NOT NULL",
            (before,)).fetchone(), 60, "a reading of the hostile sitemap")
        complete, errors, counts = reading
        assert complete is False and counts["gone"] == 0
        assert any(e.startswith(f"{b}/b.xml.gz: DTDs are not allowed") for e in errors), errors
        assert state("/b1")[:2] == (False, False)           # listed only in the hostile file: not gone
        assert daemon.proc.poll() is None
        check = daemon.wait(lambda: daemon.instance.event_log_storage.get_latest_asset_check_execution_by_key(
            [dg.AssetCheckKey(dg.AssetKey(["sample", "discovery"]), "discovery_read_cleanly")]).get(
            dg.AssetCheckKey(dg.AssetKey(["sample", "discovery"]), "discovery_read_cleanly")), 30,
            "the discovery check's evaluation")
        assert check is not None
