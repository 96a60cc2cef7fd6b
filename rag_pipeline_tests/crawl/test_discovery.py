"""Discovery on a real database and a loopback site: what one reading of robots.txt and the
sitemaps does to the pages, and every kind of bad input it must survive without losing a page."""

from __future__ import annotations

import gzip
from datetime import UTC, datetime, timedelta

import pytest

from rag_pipeline.core.addresses import parse_networks
from rag_pipeline.core.site_spec import SiteSpec
from rag_pipeline.crawl.discovery import read_site
from rag_pipeline.crawl.guarded_http import guarded_client
from rag_pipeline.crawl.robots_cache import RobotsCache
from rag_pipeline.crawl.loopback_site import LoopbackSite

AGENT = "rag-test/1"
ALLOWED = parse_networks("127.0.0.0/8")
NS = "http://www.sitemaps.org/schemas/sitemap/0.9"


def urlset(base: str, paths, lastmod: str | None = "2026-11-01") -> bytes:
    """A urlset of `paths` (or of (path, lastmod) pairs)."""
    pairs = [p if isinstance(p, tuple) else (p, lastmod) for p in paths]
    body = "".join(f"<url><loc>{base}{p}</loc>" + (f"<lastmod>{m}</lastmod>" if m else "") + "</url>"
                   for p, m in pairs)
    return f'<?xml version="1.0" encoding="UTF-8"?><urlset xmlns="{NS}">{body}</urlset>'.encode()


def index(base: str, files) -> bytes:
    body = "".join(f"<sitemap><loc>{base}{f}</loc></sitemap>" for f in files)
    return f'<?xml version="1.0" encoding="UTF-8"?><sitemapindex xmlns="{NS}">{body}</sitemapindex>'.encode()


@pytest.fixture
def site():
    with LoopbackSite() as s:
        s.set_raw("/robots.txt", b"User-agent: *\nDisallow: /private/\n", content_type="text/plain")
        yield s


def read(conn, spec: SiteSpec):
    with guarded_client(allowed=ALLOWED, user_agent=AGENT, timeout_s=5) as client:
        robots = RobotsCache(client, agent=AGENT, ttl_s=0.001, deadline_s=5)
        return read_site(conn, client, spec, robots_for=robots.rules_for, agent=AGENT,
                         every_for=lambda url: timedelta(days=1), allowed=ALLOWED, deadline_s=3)


def pages(conn) -> dict[str, tuple]:
    return {url: tuple(rest) for url, *rest in conn.execute(
        "SELECT url, site, next_crawl_at <= now(), listed_at IS NOT NULL, unlisted_at IS NOT NULL FROM pages")}


def spec_for(site, **kw) -> SiteSpec:
    return SiteSpec(name="docs", sitemaps=(site.url("/sitemap.xml"),), robots_sitemaps=False, **kw)


def test_a_sitemap_index_of_two_gzipped_sitemaps_registers_its_in_scope_pages(conn, site):
    base = site.base_url
    site.set_raw("/sitemap.xml", index(base, ["/a.xml.gz", "/b.xml.gz"]))
    site.set_raw("/a.xml.gz", gzip.compress(urlset(base, ["/guide", "/private/x"])), content_type="application/gzip")
    site.set_raw("/b.xml.gz", gzip.compress(urlset(base, ["/api", "/guide"])), content_type="application/gzip")
    result = read(conn, spec_for(site, exclude=("*/api",)))
    assert result.complete, result.errors
    c = result.counts
    assert (c["files_read"], c["listed"], c["new"], c["disallowed"], c["out_of_scope"]) == (3, 4, 1, 1, 1)
    guide = site.url("/guide").replace("http://", "https://")
    assert pages(conn) == {guide: ("docs", True, True, False)}
    crawl_url, every, by = conn.execute("SELECT crawl_url, recrawl_every, discovered_by FROM pages").fetchone()
    assert (crawl_url, every, by) == (site.url("/guide"), timedelta(days=1), "sitemap")


def test_the_next_reading_marks_gone_and_moved_pages_due_and_keeps_the_rest(conn, site):
    base = site.base_url
    site.set_raw("/sitemap.xml", urlset(base, ["/a", "/b", "/c"], lastmod="2026-11-01"))
    assert read(conn, spec_for(site)).counts["new"] == 3
    # The three were crawled since: nothing is due.
    conn.execute("UPDATE pages SET last_crawled_at = '2026-11-15', next_crawl_at = now() + interval '1 day'")
    site.set_raw("/sitemap.xml", urlset(base, [("/a", "2026-11-01"), ("/b", "2026-11-20")]))
    result = read(conn, spec_for(site))
    assert result.complete, result.errors
    assert (result.counts["new"], result.counts["gone"], result.counts["lastmod_moved"]) == (0, 1, 1)
    https = base.replace("http://", "https://")
    assert pages(conn) == {
        f"{https}/a": ("docs", False, True, False),     # listed, unchanged: not due
        f"{https}/b": ("docs", True, True, False),      # lastmod moved past its last crawl: due now
        f"{https}/c": ("docs", True, True, True),       # gone from the sitemap: unlisted, due for a check
    }
    # Listed again: no longer unlisted.
    site.set_raw("/sitemap.xml", urlset(base, ["/a", "/b", "/c"], "2026-11-01"))
    read(conn, spec_for(site))
    assert not pages(conn)[f"{https}/c"][3]


def test_the_page_cap_and_the_robots_sitemap_lines(conn, site):
    base = site.base_url
    site.set_raw("/robots.txt", f"User-agent: *\nDisallow:\nSitemap: {base}/listed-by-robots.xml\n".encode(),
                 content_type="text/plain")
    site.set_raw("/listed-by-robots.xml", urlset(base, [f"/p{i}" for i in range(10)]))
    spec = SiteSpec(name="docs", seeds=(site.url("/"),), max_pages=4)
    result = read(conn, spec)
    assert result.counts["seeds_registered"] == 1
    assert (result.counts["new"], result.counts["over_cap"]) == (3, 7)
    assert any("over the site's page cap (4)" in e for e in result.errors)
    assert len(pages(conn)) == 4


BAD = {
    "malformed XML": (b"<urlset><url><loc>x</url></urlset>", "application/xml", "not XML: mismatched tag"),
    "entity bomb": (b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;">]>'
                    b"<urlset><url><loc>&lol2;</loc></url></urlset>", "application/xml", "DTDs are not allowed"),
    "external entity": (b'<?xml version="1.0"?><!DOCTYPE u [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>'
                        b"<urlset><url><loc>&xxe;</loc></url></urlset>", "application/xml", "DTDs are not allowed"),
    "an HTML page": (b"<!doctype html><html><body>Not found</body></html>", "text/html",
                     "not a sitemap: root element <html> (served as text/html)"),
    "not UTF-8": ("<urlset><url><loc>https://x/caf\u00e9</loc></url></urlset>".encode("latin-1"), "application/xml",
                  "UTF-8"),
    "a binary file": (bytes(range(256)) * 4, "image/png", "(served as image/png)"),
    "a gzip bomb": (None, "application/gzip", "uncompressed"),
}


@pytest.mark.parametrize("kind", list(BAD))
def test_bad_input_is_a_reason_on_the_reading_and_no_known_page_is_lost(conn, site, kind):
    base = site.base_url
    site.set_raw("/sitemap.xml", index(base, ["/good.xml", "/bad.xml"]))
    site.set_raw("/good.xml", urlset(base, ["/a", "/b"]))
    site.set_raw("/bad.xml", urlset(base, ["/c"]))
    assert read(conn, spec_for(site)).counts["new"] == 3
    body, content_type, reason = BAD[kind]
    if body is None:   # 60 MB of zeros, gzip'd to ~60 KB: past the protocol's 50 MB
        body = gzip.compress(bytes(60 * 1024 * 1024), compresslevel=9)
    site.set_raw("/bad.xml", body, content_type=content_type)
    result = read(conn, spec_for(site))
    assert not result.complete
    assert result.counts["files_failed"] == 1 and result.counts["gone"] == 0
    assert any(e.startswith(site.url("/bad.xml")) and reason in e for e in result.errors), result.errors
    # /c is no longer listed, but an incomplete reading never marks a page gone.
    assert [v[3] for v in pages(conn).values()] == [False, False, False]
    newest = conn.execute("SELECT complete, errors FROM site_readings ORDER BY reading_id DESC LIMIT 1").fetchone()
    assert newest[0] is False and reason in newest[1][0]


def test_a_sitemap_that_never_ends_or_loops_or_is_missing_is_a_reason(conn, site):
    base = site.base_url
    site.set_raw("/sitemap.xml", index(base, ["/slow.xml", "/loop.xml", "/missing.xml"]))
    site.set_raw("/slow.xml", urlset(base, [f"/p{i}" for i in range(200)]), drip_s=0.2)
    site.redirect("/loop.xml", "/loop2.xml")
    site.redirect("/loop2.xml", "/loop.xml")
    result = read(conn, spec_for(site))
    errors = "\n".join(result.errors)
    assert "slow.xml: took longer than the fetch's deadline" in errors
    assert "loop.xml: redirect loop" in errors
    assert "missing.xml: answered 404" in errors
    assert result.counts["files_failed"] == 3 and not result.complete


def test_a_sitemap_on_an_internal_address_is_refused(conn, site):
    spec = SiteSpec(name="docs", sitemaps=("http://169.254.169.254/sitemap.xml",), robots_sitemaps=False)
    result = read(conn, spec)
    assert not result.complete
    assert "169.254.169.254 is a link-local" in result.errors[0]


def test_an_unreachable_robots_txt_registers_nothing_and_loses_nothing(conn, site):
    base = site.base_url
    site.set_raw("/sitemap.xml", urlset(base, ["/a", "/b"]))
    assert read(conn, spec_for(site)).counts["new"] == 2
    site.set_page("/robots.txt", "down", status=503, content_type="text/plain")
    site.set_raw("/sitemap.xml", urlset(base, ["/a", "/b", "/new"]))
    result = read(conn, spec_for(site))
    assert not result.complete and result.counts["gone"] == 0 and result.counts["new"] == 0
    assert any("robots.txt could not be read" in e for e in result.errors)
    assert len(pages(conn)) == 2


def test_the_reading_is_recorded_for_the_next_one(conn, site):
    site.set_raw("/sitemap.xml", urlset(site.base_url, ["/a"]))
    spec = spec_for(site, discover_every=timedelta(hours=6))
    from rag_pipeline.store import sites

    with conn.transaction():
        sites.sync_declared(conn, [spec])
    assert sites.due(conn, ["docs"]) == ["docs"]
    read(conn, spec)
    assert sites.due(conn, ["docs"]) == []
    next_at, = conn.execute("SELECT next_discovery_at FROM sites").fetchone()
    assert timedelta(hours=5, minutes=59) < next_at - datetime.now(UTC) <= timedelta(hours=6)
    reading = sites.newest_reading(conn, "docs")
    assert reading.complete and reading.counts["new"] == 1


def test_a_page_first_seen_outside_discovery_lands_in_the_site_that_scopes_it(conn, site):
    """A seed or a redirect target in a declared site's scope is that site's page (in its shard);
    anything else is the catch-all's."""
    import uuid

    from rag_pipeline.core.site_spec import shard_of
    from rag_pipeline.crawl.cadence_rules import load_rules, parse_seeds
    from rag_pipeline.crawl.pushing import register_seeds
    from rag_pipeline.crawl.site_cadences import SiteRules
    from rag_pipeline.ingest.routing import route_batch
    from rag_pipeline.store import deliveries, sites

    spec = SiteSpec(name="docs", seeds=("https://docs.example.com/",), shards=4)
    with conn.transaction():
        sites.sync_declared(conn, [spec])
    seeds = parse_seeds("https://docs.example.com/guide\nhttps://other.example.com/x\n")
    register_seeds(conn, seeds, SiteRules(load_rules()))
    deliveries.insert(conn, rid=uuid.uuid4().hex, url="https://docs.example.com/moved-here",
                      pushed_url="https://docs.example.com/old", crawler_status=200, original_status=200,
                      content_type="text/markdown", body=gzip.compress(b"# Moved\n"), body_encoding="gzip")
    route_batch(conn, 10, 10_000_000, allowed_networks=())
    placed = {url: (site_, shard, by) for url, site_, shard, by in
              conn.execute("SELECT url, site, shard, discovered_by FROM pages")}
    assert placed == {
        "https://docs.example.com/guide": ("docs", shard_of("https://docs.example.com/guide", 4), "seed"),
        "https://other.example.com/x": (None, None, "seed"),
        "https://docs.example.com/moved-here": ("docs", shard_of("https://docs.example.com/moved-here", 4),
                                                "redirect"),
        "https://docs.example.com/old": ("docs", None, "redirect"),     # the alias, never indexed
    }


def test_link_discovery_follows_in_scope_links_to_its_depth_limit(conn, site):
    """A site with no sitemap: its seed's links become pages one hop at a time, within the scope,
    robots.txt, the depth limit and the page cap."""
    root = site.url("/")
    spec = SiteSpec(name="docs", seeds=(root,), link_depth=2, max_pages=5)
    https = site.base_url.replace("http://", "https://")
    assert read(conn, spec).counts["seeds_registered"] == 1

    def write(path: str, text: str) -> None:
        conn.execute("UPDATE pages SET source_text = %s, last_changed_at = now() WHERE url = %s",
                     (text, https + path if path != "/" else https))

    def depths() -> dict[str, int | None]:
        return dict(conn.execute("SELECT url, link_depth FROM pages WHERE url <> %s", (https,)).fetchall())

    write("/", "[a](/a) [b](b) [away](https://elsewhere.example/x) [keep out](/private/p) [a again](/a#s)")
    result = read(conn, spec)
    assert (result.counts["links_found"], result.counts["new_from_links"]) == (2, 2)
    # What the links led to that was left out is counted apart from the sitemaps' figures.
    assert (result.counts["disallowed"], result.counts["out_of_scope"], result.counts["links_left_out"]) == (0, 0, 2)
    assert depths() == {f"{https}/a": 1, f"{https}/b": 1}
    by, due = conn.execute("SELECT discovered_by, next_crawl_at <= now() FROM pages WHERE url = %s",
                           (f"{https}/a",)).fetchone()
    assert (by, due) == ("link", True)

    write("/a", "[c](/c)")                   # depth 1 leads to depth 2
    assert read(conn, spec).counts["new_from_links"] == 1
    write("/c", "[d](/d)")                   # depth 2 is the limit: its links are not followed
    assert read(conn, spec).counts["link_pages_read"] == 0
    assert set(depths()) == {f"{https}/a", f"{https}/b", f"{https}/c"}

    write("/b", "[e](/e) [f](/f) [g](/g)")   # 4 pages held, a cap of 5: one more
    result = read(conn, spec)
    assert (result.counts["new_from_links"], result.counts["over_cap"]) == (1, 2)
    assert len(depths()) == 4


def test_a_failed_reading_is_tried_again_soon_and_later_each_time(conn, site):
    """Not at the site's daily cadence: 2 minutes, then 4, 8 …, at most an hour (and the cadence)."""
    from rag_pipeline.store import sites

    spec = spec_for(site)         # discover_every 1d; /sitemap.xml answers 404
    with conn.transaction():
        sites.sync_declared(conn, [spec])

    def next_in() -> timedelta:
        at, started = conn.execute("SELECT s.next_discovery_at, r.started_at FROM sites s JOIN site_readings r"
                                   " ON r.site = s.name ORDER BY r.reading_id DESC LIMIT 1").fetchone()
        return at - started

    for expected in (2, 4, 8):
        assert not read(conn, spec).complete
        assert next_in() == timedelta(minutes=expected)
    site.set_raw("/sitemap.xml", urlset(site.base_url, ["/a"]))
    assert read(conn, spec).complete and next_in() == timedelta(days=1)


@pytest.mark.parametrize("error, content_type, note", [
    ("DTDs are not allowed in a sitemap", "application/gzip", ""),
    ("not XML: mismatched tag at line 1", "application/xml", ""),
    ("not XML: syntax error at line 1", "image/png", " (served as image/png)"),
    ("not a sitemap: root element <html>", "text/html; charset=utf-8", " (served as text/html)"),
    ("not gzip data (it does not start with 1f 8b)", "application/gzip", " (served as application/gzip)"),
    ("larger than 52428800 bytes uncompressed", "application/gzip", ""),
])
def test_the_content_type_is_named_only_where_it_explains_the_error(error, content_type, note):
    from rag_pipeline.core.sitemap_notes import served_note

    assert served_note(error, content_type) == note
