"""Sites and their readings: the declared sites, each reading's listing staged in batches (COPY),
and one set-based transaction that turns a reading into new, re-listed, moved and gone pages."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from rag_pipeline.core.site_spec import SiteScope, SiteSpec, locate
from rag_pipeline.core.template_pins import pins_rows


@dataclass(frozen=True)
class Listed:
    """One in-scope URL a reading found, ready to stage."""

    page_id: UUID
    url: str                    # normalized
    crawl_url: str              # as listed
    lastmod: datetime | None
    shard: int | None
    every: timedelta
    depth: int | None = None    # link discovery: hops from a sitemap or seed page


@dataclass(frozen=True)
class Reading:
    reading_id: int
    site: str
    started_at: datetime
    finished_at: datetime | None
    complete: bool | None
    counts: dict
    errors: list[str]


def sync_declared(conn: psycopg.Connection, specs: Iterable[SiteSpec], *, by_location: bool = False) -> None:
    """The declared sites as rows (what routing, `status` and the discovery sensor read). A handful
    of rows, changed only when a declaration changes; `discover_every` applies from the next reading.
    `by_location`: a running code location synced them (its sensor or its run, not a shell), noted in
    `synced_at` at most once a minute, so `status` can tell a site it still declares from one gone."""
    specs = list(specs)
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO sites (name, shards, scope, exclude, max_pages, discover_every, link_depth, boilerplate,"
            "   crawler, cadence, template_pins) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (name) DO UPDATE SET shards = excluded.shards, scope = excluded.scope,"
            "   exclude = excluded.exclude, max_pages = excluded.max_pages, discover_every = excluded.discover_every,"
            "   link_depth = excluded.link_depth, boilerplate = excluded.boilerplate, crawler = excluded.crawler,"
            "   cadence = excluded.cadence, template_pins = excluded.template_pins"
            " WHERE (sites.shards, sites.scope, sites.exclude, sites.max_pages, sites.discover_every, sites.link_depth,"
            "        sites.boilerplate, sites.crawler, sites.cadence, sites.template_pins)"
            "   IS DISTINCT FROM (excluded.shards, excluded.scope, excluded.exclude, excluded.max_pages,"
            "                     excluded.discover_every, excluded.link_depth, excluded.boilerplate, excluded.crawler,"
            "                     excluded.cadence, excluded.template_pins)",
            [(s.name, s.shards, list(s.scope), list(s.exclude), s.max_pages, s.discover_every, s.link_depth,
              Jsonb(list(s.boilerplate)), s.crawler, None if s.cadence is None else Jsonb(dict(s.cadence)),
              Jsonb(pins_rows(s.template_pins)))
             for s in specs],
        )
        if by_location:
            cur.execute("UPDATE sites SET synced_at = now() WHERE name = ANY(%s)"
                        " AND (synced_at IS NULL OR synced_at < now() - interval '1 minute')",
                        ([s.name for s in specs],))


def declared_scopes(conn: psycopg.Connection) -> list[SiteScope]:
    """Every declared site's scope, for placing a page first seen outside discovery."""
    return [SiteScope(name, tuple(scope), tuple(exclude), shards) for name, scope, exclude, shards in
            conn.execute("SELECT name, scope, exclude, shards FROM sites ORDER BY name").fetchall()]


def boilerplate(conn: psycopg.Connection) -> dict[str, list]:
    """Each declared site's own boilerplate rules (only sites that have some)."""
    return {name: rules for name, rules in
            conn.execute("SELECT name, boilerplate FROM sites WHERE boilerplate <> '[]'::jsonb").fetchall()}


def place(conn: psycopg.Connection, page_url: str) -> tuple[str | None, int | None]:
    """(site, shard) of a page: where it is if registered, else where it would be registered."""
    row = conn.execute("SELECT site, shard FROM pages WHERE url = %s", (page_url,)).fetchone()
    return (row[0], row[1]) if row else locate(page_url, declared_scopes(conn))


def cadence_blocks(conn: psycopg.Connection) -> dict[str, dict]:
    """Each declared site's own recrawl rules (only sites that declare some), as declared."""
    return dict(conn.execute("SELECT name, cadence FROM sites WHERE cadence IS NOT NULL").fetchall())


def crawlers(conn: psycopg.Connection, page_urls: list[str]) -> dict[str, str | None]:
    """The crawler each page's site asks for (None: the deployment's CRAWLER), one query."""
    found = dict(conn.execute(
        "SELECT p.url, s.crawler FROM pages p JOIN sites s ON s.name = p.site WHERE p.url = ANY(%s)",
        (page_urls,)).fetchall())
    return {url: found.get(url) for url in page_urls}


# A sensor ticks a little before or after the minute: a reading due within this is read now, not
# at the next tick (a 2-minute site would be read every 3).
DUE_SLACK = timedelta(seconds=10)


def due(conn: psycopg.Connection, names: list[str]) -> list[str]:
    """The sites among `names` whose next reading is due (never read: due at once)."""
    rows = conn.execute(
        "SELECT name FROM sites WHERE name = ANY(%s)"
        " AND (next_discovery_at IS NULL OR next_discovery_at <= now() + %s) ORDER BY name",
        (names, DUE_SLACK)).fetchall()
    return [r[0] for r in rows]


# A reading that dies before it finishes is tried again this much later, not at the next tick.
RETRY_READING = timedelta(minutes=15)


def begin_reading(conn: psycopg.Connection, site: str, run_id: str | None) -> Reading:
    with conn.transaction():
        conn.execute("UPDATE sites SET next_discovery_at = now() + %s WHERE name = %s", (RETRY_READING, site))
        row = conn.execute(
            "INSERT INTO site_readings (site, run_id) VALUES (%s, %s) RETURNING reading_id, started_at",
            (site, run_id)).fetchone()
        return Reading(row[0], site, row[1], None, None, {}, [])


def stage(conn: psycopg.Connection, reading_id: int, rows: list[Listed]) -> None:
    """Append a batch of a reading's listing, by COPY (a reading may list millions)."""
    if not rows:
        return
    with conn.cursor().copy(
        "COPY site_listing (reading_id, page_id, url, crawl_url, lastmod, shard, every) FROM STDIN"
    ) as copy:
        for r in rows:
            copy.write_row((reading_id, r.page_id, r.url, r.crawl_url, r.lastmod, r.shard, r.every))


# URLs a reading names of each change (new, gone), for the UI: the counts say how many in all.
SHOWN_URLS = 20


def apply_reading(conn: psycopg.Connection, reading: Reading, *, max_pages: int,
                  complete: bool) -> tuple[dict[str, int], dict[str, list[str]]]:
    """Turn a staged reading into page changes, in one transaction:

    - new in-scope URLs become pages of the site, due now (pushed by recrawl_sensor at the
      crawler's rate), up to the site's page cap;
    - a catch-all page the site lists is adopted by it; a page of another site stays there;
    - a page whose `<lastmod>` moved past its last crawl is due now;
    - every listed page is stamped `listed_at` (and re-listed if it had gone);
    - when the reading is complete, a page it no longer lists is `unlisted` and due now: its next
      crawl decides (404/410 tombstones it; 200 keeps it, unlisted); one robots.txt disallows is
      not (the sitemaps' listing leaves it out for that: `store.disallowed` holds it).
    """
    site, rid = reading.site, reading.reading_id
    counts: dict[str, int] = {}
    examples: dict[str, list[str]] = {}
    with conn.transaction():
        conn.execute(
            "CREATE TEMP TABLE listed ON COMMIT DROP AS"
            " SELECT DISTINCT ON (page_id) page_id, url, crawl_url, lastmod, shard, every FROM site_listing"
            " WHERE reading_id = %s ORDER BY page_id, lastmod DESC NULLS LAST", (rid,))
        conn.execute("ANALYZE listed")
        counts["in_scope"] = conn.execute("SELECT count(*) FROM listed").fetchone()[0]
        counts["claimed_by_other_site"] = conn.execute(
            "SELECT count(*) FROM listed l JOIN pages p USING (page_id) WHERE p.site IS DISTINCT FROM %s"
            " AND p.site IS NOT NULL", (site,)).fetchone()[0]
        counts["adopted"] = conn.execute(
            "UPDATE pages p SET site = %s, shard = l.shard FROM listed l"
            " WHERE p.page_id = l.page_id AND p.site IS NULL", (site,)).rowcount
        counts["lastmod_moved"] = conn.execute(
            "UPDATE pages p SET next_crawl_at = now() FROM listed l"
            " WHERE p.page_id = l.page_id AND p.site = %s AND p.alias_of IS NULL"
            "   AND l.lastmod > p.last_crawled_at"
            "   AND (p.sitemap_lastmod IS NULL OR l.lastmod > p.sitemap_lastmod)", (site,)).rowcount
        # Gone: listed before, not in this (complete) reading. Before the stamp below, which
        # would otherwise re-list what it touches.
        gone = conn.execute(
            "UPDATE pages p SET unlisted_at = now(), next_crawl_at = least(p.next_crawl_at, now())"
            " WHERE p.site = %s AND p.listed_at IS NOT NULL AND p.unlisted_at IS NULL AND p.deleted_at IS NULL"
            "   AND p.alias_of IS NULL AND p.disallowed_at IS NULL"
            "   AND NOT EXISTS (SELECT 1 FROM listed l WHERE l.page_id = p.page_id)"
            " RETURNING p.url", (site,)).fetchall() if complete else []
        counts["gone"] = len(gone)
        examples["gone"] = sorted(url for url, in gone)[:SHOWN_URLS]
        # Only rows whose listing changed are written: a reading of an unchanged site rewrites none.
        counts["listing_updated"] = conn.execute(
            "UPDATE pages p SET listed_at = CASE WHEN p.listed_at IS NULL OR p.unlisted_at IS NOT NULL"
            "     THEN now() ELSE p.listed_at END,"
            "   sitemap_lastmod = coalesce(l.lastmod, p.sitemap_lastmod), unlisted_at = NULL FROM listed l"
            " WHERE p.page_id = l.page_id AND p.site = %s AND (p.listed_at IS NULL OR p.unlisted_at IS NOT NULL"
            "   OR l.lastmod IS DISTINCT FROM p.sitemap_lastmod AND l.lastmod IS NOT NULL)", (site,)).rowcount
        held = conn.execute("SELECT count(*) FROM pages WHERE site = %s AND deleted_at IS NULL",
                            (site,)).fetchone()[0]
        unknown = conn.execute(
            "SELECT count(*) FROM listed l WHERE NOT EXISTS (SELECT 1 FROM pages p WHERE p.page_id = l.page_id)"
        ).fetchone()[0]
        room = max(0, max_pages - held)
        new = conn.execute(
            "INSERT INTO pages (page_id, url, crawl_url, site, shard, recrawl_every, cadence_source,"
            "   next_crawl_at, discovered_by, listed_at, sitemap_lastmod)"
            " SELECT l.page_id, l.url, l.crawl_url, %s, l.shard, l.every, 'default', now(), 'sitemap', now(), l.lastmod"
            " FROM listed l WHERE NOT EXISTS (SELECT 1 FROM pages p WHERE p.page_id = l.page_id)"
            " ORDER BY l.url LIMIT %s ON CONFLICT DO NOTHING RETURNING url", (site, room)).fetchall()
        counts["new"] = len(new)
        examples["new"] = [url for url, in new[:SHOWN_URLS]]
        counts["over_cap"] = unknown - counts["new"]
        counts["unlisted_total"] = conn.execute(
            "SELECT count(*) FROM pages WHERE site = %s AND unlisted_at IS NOT NULL AND deleted_at IS NULL",
            (site,)).fetchone()[0]
        conn.execute("DELETE FROM site_listing WHERE reading_id = %s", (rid,))
    return counts, examples


def finish_reading(conn: psycopg.Connection, reading: Reading, *, complete: bool, counts: dict,
                   errors: list[str], next_in: timedelta) -> None:
    with conn.transaction():
        conn.execute(
            "UPDATE site_readings SET finished_at = now(), complete = %s, counts = %s, errors = %s"
            " WHERE reading_id = %s", (complete, Jsonb(counts), errors, reading.reading_id))
        # From the reading's start: a site read every 2 minutes is read every 2 minutes.
        conn.execute("UPDATE sites SET next_discovery_at = %s + %s WHERE name = %s",
                     (reading.started_at, next_in, reading.site))
        # A staged listing left by a reading that died before its apply.
        conn.execute("DELETE FROM site_listing WHERE reading_id IN (SELECT reading_id FROM site_readings"
                     " WHERE site = %s AND finished_at IS NULL AND reading_id < %s)",
                     (reading.site, reading.reading_id))


def register_seeds(conn: psycopg.Connection, site: SiteSpec, rows: list[Listed]) -> int:
    """A site's seed URLs as its pages, due now (those it already has are left as they are)."""
    if not rows:
        return 0
    return conn.execute(
        "INSERT INTO pages (page_id, url, crawl_url, site, shard, recrawl_every, cadence_source, next_crawl_at,"
        "   discovered_by)"
        " SELECT u.*, 'default', now(), 'seed' FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::text[],"
        "   %s::smallint[], %s::interval[]) AS u"
        " ON CONFLICT (page_id) DO UPDATE SET site = excluded.site, shard = excluded.shard"
        "   WHERE pages.site IS NULL",
        ([r.page_id for r in rows], [r.url for r in rows], [r.crawl_url for r in rows], [site.name] * len(rows),
         [r.shard for r in rows], [r.every for r in rows])).rowcount


def link_sources(conn: psycopg.Connection, site: str, *, max_depth: int, since: datetime | None,
                 batch: int = 500):
    """(page URL as crawled, its stored text, its depth) of the site's live pages whose links are
    still to follow: fewer than `max_depth` hops from a sitemap or seed page, changed since
    `since` (the previous reading; None: every one). Read through a server-side cursor."""
    with conn.transaction(), conn.cursor(name=f"link_sources_{site}") as cur:
        cur.itersize = batch
        cur.execute(
            "SELECT coalesce(crawl_url, url), source_text, coalesce(link_depth, 0) FROM pages"
            " WHERE site = %s AND source_text IS NOT NULL AND deleted_at IS NULL AND alias_of IS NULL"
            "   AND coalesce(link_depth, 0) < %s AND (%s::timestamptz IS NULL OR last_changed_at >= %s)",
            (site, max_depth, since, since))
        yield from cur


def links_pending(conn: psycopg.Connection, site: str, max_depth: int) -> bool:
    """Whether a page that may lead further changed since the newest reading began: link
    discovery then reads again without waiting for the site's cadence."""
    return conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pages WHERE site = %s AND coalesce(link_depth, 0) < %s"
        "   AND deleted_at IS NULL AND last_changed_at >= (SELECT started_at FROM site_readings"
        "     WHERE site = %s AND finished_at IS NOT NULL ORDER BY reading_id DESC LIMIT 1))",
        (site, max_depth, site)).fetchone()[0]


def register_links(conn: psycopg.Connection, site: str, rows: list[Listed], *, max_pages: int) -> tuple[int, int]:
    """Pages found by following links, due now, within the site's page cap (nearest hops first):
    (registered, left over the cap). URLs already known are left as they are."""
    if not rows:
        return 0, 0
    with conn.transaction():
        held = conn.execute("SELECT count(*) FROM pages WHERE site = %s AND deleted_at IS NULL",
                            (site,)).fetchone()[0]
        unknown = conn.execute(
            "SELECT count(*) FROM unnest(%s::uuid[]) AS u(id) WHERE NOT EXISTS"
            " (SELECT 1 FROM pages p WHERE p.page_id = u.id)", ([r.page_id for r in rows],)).fetchone()[0]
        added = conn.execute(
            "INSERT INTO pages (page_id, url, crawl_url, site, shard, recrawl_every, link_depth, cadence_source,"
            "   next_crawl_at, discovered_by)"
            " SELECT u.*, 'default', now(), 'link' FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::text[],"
            "   %s::smallint[], %s::interval[], %s::smallint[]) AS u(id, url, crawl_url, site, shard, every, depth)"
            " WHERE NOT EXISTS (SELECT 1 FROM pages p WHERE p.page_id = u.id)"
            " ORDER BY u.depth, u.url LIMIT %s ON CONFLICT DO NOTHING",
            ([r.page_id for r in rows], [r.url for r in rows], [r.crawl_url for r in rows], [site] * len(rows),
             [r.shard for r in rows], [r.every for r in rows], [r.depth for r in rows],
             max(0, max_pages - held))).rowcount
    return added, unknown - added


def incomplete_in_a_row(conn: psycopg.Connection, site: str, limit: int = 12) -> int:
    """How many of the site's newest finished readings, in a row, met a problem (at most `limit`)."""
    rows = conn.execute("SELECT complete FROM site_readings WHERE site = %s AND finished_at IS NOT NULL"
                        " ORDER BY reading_id DESC LIMIT %s", (site, limit)).fetchall()
    return next((n for n, (complete,) in enumerate(rows) if complete), len(rows))


def newest_reading(conn: psycopg.Connection, site: str) -> Reading | None:
    row = conn.execute(
        "SELECT reading_id, site, started_at, finished_at, complete, counts, errors FROM site_readings"
        " WHERE site = %s ORDER BY reading_id DESC LIMIT 1", (site,)).fetchone()
    return Reading(*row) if row else None


def declared_row(conn: psycopg.Connection, name: str) -> dict | None:
    """What the running code location declared of a site (synced by its discovery sensor)."""
    row = conn.execute("SELECT name, shards, scope, exclude, max_pages, discover_every, link_depth, crawler"
                       " FROM sites WHERE name = %s", (name,)).fetchone()
    keys = ("name", "shards", "scope", "exclude", "max_pages", "discover_every", "link_depth", "crawler")
    return dict(zip(keys, row)) if row else None


def overview(conn: psycopg.Connection) -> list[dict]:
    """Each declared site's pages and its newest reading, for `status` and `site list`: one scan of
    the site pages grouped, one look at each site's newest reading."""
    counts = {site: dict(zip(("pages", "listed", "live", "unlisted", "tombstoned", "due", "never_crawled",
                              "aliases", "disallowed", "disallowed_indexed"), rest))
              for site, *rest in conn.execute(
                  "SELECT site, count(*),"
                  " count(*) FILTER (WHERE listed_at IS NOT NULL AND unlisted_at IS NULL),"
                  " count(*) FILTER (WHERE deleted_at IS NULL AND alias_of IS NULL AND indexed_hash IS NOT NULL),"
                  " count(*) FILTER (WHERE unlisted_at IS NOT NULL AND deleted_at IS NULL),"
                  " count(*) FILTER (WHERE deleted_at IS NOT NULL),"
                  " count(*) FILTER (WHERE alias_of IS NULL AND next_crawl_at <= now()),"
                  " count(*) FILTER (WHERE last_crawled_at IS NULL AND alias_of IS NULL AND deleted_at IS NULL"
                  "   AND disallowed_at IS NULL),"
                  # A redirect's source: a page of its own, counted apart (its text is its target's).
                  " count(*) FILTER (WHERE alias_of IS NOT NULL),"
                  # robots.txt disallows them (store/disallowed.py): not crawled, counted apart.
                  " count(*) FILTER (WHERE disallowed_at IS NOT NULL AND alias_of IS NULL AND deleted_at IS NULL),"
                  " count(*) FILTER (WHERE disallowed_at IS NOT NULL AND alias_of IS NULL AND deleted_at IS NULL"
                  "   AND indexed_hash IS NOT NULL)"
                  " FROM pages WHERE site IS NOT NULL GROUP BY site")}
    # A reading without a run is one `rag-pipeline site discover` made: an incomplete one says so,
    # and when the last complete reading was, rather than hide the sensor's good one.
    rows = conn.execute(
        "SELECT s.name, s.synced_at, s.next_discovery_at, r.started_at, r.finished_at, r.complete, r.counts,"
        "   r.errors, r.run_id IS NULL, (SELECT max(finished_at) FROM site_readings c WHERE c.site = s.name AND c.complete),"
        "   now()"
        " FROM sites s LEFT JOIN LATERAL (SELECT * FROM site_readings WHERE site = s.name"
        "   ORDER BY reading_id DESC LIMIT 1) r ON true ORDER BY s.name").fetchall()
    empty = {"pages": 0, "listed": 0, "live": 0, "unlisted": 0, "tombstoned": 0, "due": 0, "never_crawled": 0,
             "aliases": 0, "disallowed": 0, "disallowed_indexed": 0}
    return [{"site": name, **counts.get(name, empty), "synced_at": synced_at, "next_reading_at": next_at,
             "last_reading": None if started is None else {
                 "started_at": started, "finished_at": finished, "complete": complete,
                 "counts": reading_counts, "problems": list(errors), "from_cli": from_cli,
                 "last_complete_at": last_complete},
             "now": now}
            for (name, synced_at, next_at, started, finished, complete, reading_counts, errors, from_cli,
                 last_complete, now) in rows]
