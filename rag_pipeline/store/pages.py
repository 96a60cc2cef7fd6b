"""The pages table: one row per normalized URL, with its source text and freshness stamps."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import psycopg
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from rag_pipeline.core.batch_sizing import WorkItem
from rag_pipeline.core.location_holds import Holds
from rag_pipeline.store import db


@dataclass
class Page:
    page_id: UUID
    url: str
    source_text: str | None
    source_hash: str | None
    source_delivery_id: int | None
    indexed_hash: str | None
    applied_delivery_id: int | None
    original_status: int | None
    first_seen_at: datetime
    last_crawled_at: datetime | None
    last_verified_at: datetime | None
    last_changed_at: datetime | None
    deleted_at: datetime | None
    chunker_version: str | None
    newest_crawl_at: datetime | None = None   # of the newest delivery routed for the page
    site: str | None = None                   # its declared site; None: the catch-all
    content_key: str | None = None            # the source's content key, cached (core/content_gate.py)
    content_key_tag: str | None = None
    volatile_counts: dict | None = None


_COLUMNS = (
    "page_id, url, source_text, source_hash, source_delivery_id, indexed_hash, applied_delivery_id,"
    " original_status, first_seen_at, last_crawled_at, last_verified_at, last_changed_at,"
    " deleted_at, chunker_version, newest_crawl_at, site, content_key, content_key_tag, volatile_counts"
)


def get(conn: psycopg.Connection, url: str, *, for_update: bool = False) -> Page | None:
    """The page row; `for_update` takes the row lock that serializes every change to one page."""
    lock = " FOR UPDATE" if for_update else ""
    if for_update:
        db.require_transaction(conn, "pages.get(for_update=True)")
    with conn.cursor(row_factory=class_row(Page)) as cur:
        cur.execute(f"SELECT {_COLUMNS} FROM pages WHERE url = %s{lock}", (url,))
        return cur.fetchone()


def get_many(conn: psycopg.Connection, urls, *, for_update: bool = False) -> dict[str, Page]:
    """The rows of these pages, by URL; `for_update` locks them in URL order (two batches that
    share pages take their locks in the same order: no deadlock)."""
    lock = " ORDER BY url FOR UPDATE" if for_update else ""
    if for_update:
        db.require_transaction(conn, "pages.get_many(for_update=True)")
    with conn.cursor(row_factory=class_row(Page)) as cur:
        cur.execute(f"SELECT {_COLUMNS} FROM pages WHERE url = ANY(%s){lock}", (list(urls),))
        return {page.url: page for page in cur.fetchall()}


def ensure(conn: psycopg.Connection, page_id: UUID, url: str, crawl_url: str | None = None, *,
           site: str | None = None, shard: int | None = None, discovered_by: str = "delivery") -> None:
    """A page row for `url`; `crawl_url` is the URL as the crawler fetched it (http stays http),
    which recrawls push and citations show. `site`/`shard`: where a new row belongs."""
    ensure_many(conn, [(page_id, url, crawl_url, site, shard, discovered_by)])


def ensure_many(conn: psycopg.Connection, rows: list[tuple]) -> None:
    """`ensure` for many pages in one statement: (page_id, url, crawl_url, site, shard,
    discovered_by) each, no page twice. A page that exists keeps its row (and site)."""
    if not rows:
        return
    ids, urls, crawl_urls, site_names, shards, found_by = (list(c) for c in zip(*rows))
    conn.execute(
        "INSERT INTO pages (page_id, url, crawl_url, site, shard, discovered_by)"
        " SELECT * FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::text[], %s::smallint[], %s::text[])"
        " ON CONFLICT (page_id) DO UPDATE SET crawl_url = coalesce(pages.crawl_url, excluded.crawl_url)",
        (ids, urls, crawl_urls, site_names, shards, found_by),
    )


def locations(conn: psycopg.Connection, urls) -> dict[str, tuple[str | None, int | None]]:
    """Each page's (site, shard), which names its partition set and asset keys; a URL with no page
    row is the catch-all's."""
    urls = list(urls)
    found = {url: (site, shard) for url, site, shard in conn.execute(
        "SELECT url, site, shard FROM pages WHERE url = ANY(%s)", (urls,)).fetchall()}
    return {url: found.get(url, (None, None)) for url in urls}


def site_of(conn: psycopg.Connection, url: str) -> str | None:
    """The site a page belongs to; None for a page of no declared site, or no page at all."""
    row = conn.execute("SELECT site FROM pages WHERE url = %s", (url,)).fetchone()
    return row[0] if row else None


#: The content hash a tombstoned crawl is observed with: gone differs from any text.
GONE = "gone"


def note_crawls(conn: psycopg.Connection, rows: list[tuple[UUID, datetime, str]]) -> None:
    """The newest crawl routed for each page (deliveries of older crawls are history from now on),
    and what it observed for the change-rate estimate: whether the content differs from the
    previous crawl's, over the interval since it. (page_id, crawled_at, content_hash) each, no page
    twice; the caller has ruled out older crawls."""
    if not rows:
        return
    ids, at, hashes = (list(c) for c in zip(*rows))
    conn.execute(
        "WITH n AS (SELECT * FROM unnest(%s::uuid[], %s::timestamptz[], %s::text[]) AS n (page_id, at, hash)),"
        " observed AS (INSERT INTO crawl_observations (page_id, crawled_at, interval_s, changed)"
        "   SELECT p.page_id, n.at, extract(epoch FROM n.at - p.newest_crawl_at), p.crawl_hash <> n.hash"
        "   FROM pages p JOIN n ON n.page_id = p.page_id"
        "   WHERE p.crawl_hash IS NOT NULL AND p.newest_crawl_at < n.at"
        "   ON CONFLICT DO NOTHING)"
        " UPDATE pages p SET newest_crawl_at = greatest(p.newest_crawl_at, n.at), crawl_hash = n.hash"
        " FROM n WHERE p.page_id = n.page_id",
        (ids, at, hashes))


def stamp_verified_many(conn: psycopg.Connection, rows: list[tuple[UUID, int, int | None]]) -> None:
    """Unchanged crawls: each page is confirmed fresh, and nothing else moves. (page_id,
    delivery_id, original_status) each."""
    if not rows:
        return
    ids, delivery_ids, statuses = (list(c) for c in zip(*rows))
    conn.execute(
        "UPDATE pages p SET last_verified_at = now(), last_crawled_at = now(),"
        " applied_delivery_id = greatest(p.applied_delivery_id, n.delivery_id), original_status = n.status"
        " FROM unnest(%s::uuid[], %s::bigint[], %s::integer[]) AS n (page_id, delivery_id, status)"
        " WHERE p.page_id = n.page_id",
        (ids, delivery_ids, statuses),
    )


def tombstone(conn: psycopg.Connection, page_id: UUID, url: str, delivery_id: int,
              original_status: int | None) -> int:
    """Take the page out of search at once; the row stays with `deleted_at`. Returns chunks removed."""
    db.require_transaction(conn, "pages.tombstone")
    conn.execute(
        "INSERT INTO pages (page_id, url) VALUES (%s, %s) ON CONFLICT (page_id) DO NOTHING",
        (page_id, url),
    )
    removed = conn.execute("DELETE FROM chunks WHERE page_id = %s", (page_id,)).rowcount
    conn.execute("DELETE FROM staged_chunks WHERE page_id = %s", (page_id,))
    conn.execute(
        "UPDATE pages SET deleted_at = coalesce(deleted_at, now()), indexed_hash = NULL,"
        " source_hash = NULL, last_crawled_at = now(), last_verified_at = now(),"
        " applied_delivery_id = greatest(applied_delivery_id, %s), original_status = %s"
        " WHERE page_id = %s",
        (delivery_id, original_status, page_id),
    )
    return removed


def set_sources(conn: psycopg.Connection,
                rows: list[tuple[UUID, str, str, int, int | None]]) -> None:
    """The text each page is to be indexed from (routing's newest crawl), for many pages in one
    statement: (page_id, text, source_hash, delivery_id, original_status) each."""
    if not rows:
        return
    ids, texts, hashes, delivery_ids, statuses = (list(c) for c in zip(*rows))
    conn.execute(
        "UPDATE pages p SET source_text = n.text, source_hash = n.hash, source_delivery_id = n.delivery_id,"
        " original_status = n.status, last_crawled_at = now(), content_key = NULL, content_key_tag = NULL"
        " FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::bigint[], %s::integer[])"
        "   AS n (page_id, text, hash, delivery_id, status)"
        " WHERE p.page_id = n.page_id",
        (ids, texts, hashes, delivery_ids, statuses),
    )


def refresh_sources(conn: psycopg.Connection, rows: list[tuple]) -> None:
    """Crawls whose content equals what is indexed while their text moved (their template, a
    volatile line): the newest text becomes the stored source and is what the chunks reflect, with
    its content key and volatile history, in one statement. (page_id, text, hash, delivery_id,
    original_status, content key, key tag, volatile counts) each. ``last_changed_at`` does not
    move: the content did not."""
    if not rows:
        return
    ids, texts, hashes, delivery_ids, statuses, keys, tags, counts = (list(c) for c in zip(*rows))
    conn.execute(
        "UPDATE pages p SET source_text = n.text, source_hash = n.hash, indexed_hash = n.hash,"
        " source_delivery_id = n.delivery_id, original_status = n.status, content_key = n.key,"
        " content_key_tag = n.tag, volatile_counts = n.counts"
        " FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::bigint[], %s::integer[], %s::text[], %s::text[],"
        "   %s::jsonb[]) AS n (page_id, text, hash, delivery_id, status, key, tag, counts)"
        " WHERE p.page_id = n.page_id",
        (ids, texts, hashes, delivery_ids, statuses, keys, tags, [Jsonb(c) for c in counts]),
    )


def set_content_keys(conn: psycopg.Connection, rows: list[tuple[UUID, str | None, str | None, dict]]) -> None:
    """What the hash gate learned of each page compared (core/content_gate.py), in one statement:
    (page_id, its source's content key and tag, or None to leave them, its volatile counts)."""
    if not rows:
        return
    ids, keys, tags, counts = (list(c) for c in zip(*rows))
    conn.execute(
        "UPDATE pages p SET content_key = coalesce(n.key, p.content_key),"
        " content_key_tag = coalesce(n.tag, p.content_key_tag), volatile_counts = n.counts"
        " FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::jsonb[]) AS n (page_id, key, tag, counts)"
        " WHERE p.page_id = n.page_id",
        (ids, keys, tags, [Jsonb(c) for c in counts]),
    )


def counts(conn: psycopg.Connection) -> dict[str, int]:
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE deleted_at IS NULL AND indexed_hash IS NOT NULL),"
        " count(*) FILTER (WHERE deleted_at IS NOT NULL),"
        " count(*) FILTER (WHERE deleted_at IS NULL AND indexed_hash IS DISTINCT FROM source_hash)"
        " FROM pages"
    ).fetchone()
    return {"indexed": row[0], "tombstoned": row[1], "pending": row[2]}


# Live, up to date, and cut by another chunker than the given signature: what a re-chunk has to do.
def chunked_otherwise(signature_sql: str = "%s", alias: str = "pages") -> str:
    """The condition, on `pages` as `alias`, against a signature given as SQL (a placeholder)."""
    return (f"{alias}.deleted_at IS NULL AND {alias}.indexed_hash IS NOT NULL"
            f" AND {alias}.indexed_hash = {alias}.source_hash AND {alias}.chunker_version IS DISTINCT FROM {signature_sql}")


_CHUNKED_OTHERWISE = chunked_otherwise()


def count_chunked_otherwise(conn: psycopg.Connection, signature: str) -> int:
    return conn.execute(f"SELECT count(*) FROM pages WHERE {_CHUNKED_OTHERWISE}", (signature,)).fetchone()[0]


def count_chunked_otherwise_among(conn: psycopg.Connection, urls: list[str], signature: str) -> int:
    return conn.execute(f"SELECT count(*) FROM pages WHERE url = ANY(%s) AND {chunked_otherwise()}",
                        (urls, signature)).fetchone()[0]


def sources_chunked_otherwise(conn: psycopg.Connection, signature: str, *, itersize: int = 200,
                              sample: int | None = None):
    """(url, page_id, source_text, site) of those pages, read through a server-side cursor (the
    corpus may not fit in memory), in a read transaction held open while the caller iterates.
    `sample`: that many of them at random (the texts of the others are never read)."""
    which = (f"SELECT url FROM pages WHERE {_CHUNKED_OTHERWISE}" if sample is None else
             f"SELECT url FROM pages WHERE {_CHUNKED_OTHERWISE} ORDER BY random() LIMIT %s")
    with conn.transaction(), conn.cursor(name="chunked_otherwise") as cur:
        cur.itersize = itersize
        cur.execute(f"SELECT url, page_id, source_text, site FROM pages WHERE url IN ({which})",
                    (signature,) if sample is None else (signature, sample))
        yield from cur


# -- batch leases: a page is in at most one live batch run ---------------------------------------


def lease(conn: psycopg.Connection, page_urls: list[str], batch_key: str, seconds: float) -> list[str]:
    """Lease these pages to one batch; a page another batch still holds is left out."""
    rows = conn.execute(
        "UPDATE pages SET batch_key = %s, leased_until = now() + make_interval(secs => %s)"
        " WHERE url = ANY(%s) AND (leased_until IS NULL OR leased_until <= now()) RETURNING url",
        (batch_key, seconds, page_urls),
    ).fetchall()
    return [r[0] for r in rows]


def holders(conn: psycopg.Connection, page_urls: list[str]) -> dict[str, str]:
    """The batch that holds each of these pages now (a page no lease holds is absent)."""
    return dict(conn.execute("SELECT url, batch_key FROM pages WHERE url = ANY(%s) AND leased_until > now()",
                             (page_urls,)).fetchall())


def cut_with(conn: psycopg.Connection, page_urls: list[str], signature: str) -> set[str]:
    """Which of these pages are indexed from their source as it is, cut with `signature`: a
    re-chunk to it has nothing to do for them."""
    rows = conn.execute("SELECT url FROM pages WHERE url = ANY(%s) AND indexed_hash = source_hash"
                        " AND chunker_version = %s", (page_urls, signature)).fetchall()
    return {r[0] for r in rows}


def leased_to(conn: psycopg.Connection, page_urls: list[str], batch_key: str) -> set[str]:
    """Which of these pages this batch still holds (a lease that ran out may be another's now)."""
    rows = conn.execute(
        "SELECT url FROM pages WHERE url = ANY(%s) AND batch_key = %s AND leased_until > now()",
        (page_urls, batch_key),
    ).fetchall()
    return {r[0] for r in rows}


def release_many(conn: psycopg.Connection, page_urls: list[str], batch_key: str) -> None:
    if page_urls:
        conn.execute("UPDATE pages SET leased_until = NULL WHERE url = ANY(%s) AND batch_key = %s",
                     (page_urls, batch_key))


def release_batch(conn: psycopg.Connection, batch_key: str) -> list[str]:
    """Free every page a batch still holds (its run ended without finishing them)."""
    rows = conn.execute(
        "UPDATE pages SET leased_until = NULL WHERE batch_key = %s AND leased_until IS NOT NULL RETURNING url",
        (batch_key,),
    ).fetchall()
    return [r[0] for r in rows]


def outdated_work(conn: psycopg.Connection, signature: str, limit: int,
                  holds: Holds | None = None) -> list[WorkItem]:
    """Live, indexed pages cut by another chunker version or budget that no batch holds, oldest
    change first: the next re-chunk batches (their stored text is all they need). `holds`: only
    this code location's pages."""
    held, params = held_clause(holds)
    rows = conn.execute(
        f"SELECT url, length(source_text) FROM pages p WHERE {chunked_otherwise('%(signature)s', 'p')}"
        f" AND (leased_until IS NULL OR leased_until <= now()) AND {held}"
        " ORDER BY last_changed_at NULLS FIRST, url LIMIT %(limit)s",
        {**params, "signature": signature, "limit": limit},
    ).fetchall()
    return [WorkItem(url, 0, 0, chars or 0) for url, chars in rows]


def held_clause(holds: Holds | None, alias: str = "p") -> tuple[str, dict]:
    """A condition on `pages` (as `alias`) that holds for the pages a code location serves.
    `main` holds the catch-all's pages and, where the declared sites are known, every page no
    declared site's shard holds (a site since removed, a shard past its count)."""
    if holds is None or holds.everything:
        return "true", {}
    shard_sites, shard_numbers = zip(*sorted(holds.shards)) if holds.shards else ((), ())
    names, counts = zip(*holds.declared) if holds.declared else ((), ())
    main = (f"{alias}.site IS NULL" if holds.declared is None else
            "NOT EXISTS (SELECT 1 FROM unnest(%(declared_names)s::text[], %(declared_shards)s::int[]) d (name, shards)"
            f" WHERE d.name = {alias}.site AND coalesce({alias}.shard, 0) < d.shards)")
    return (f"((%(held_main)s AND {main}) OR {alias}.site = ANY(%(held_sites)s)"
            f" OR ({alias}.site, coalesce({alias}.shard, 0)) IN"
            "  (SELECT * FROM unnest(%(held_shard_sites)s::text[], %(held_shard_numbers)s::int[])))",
            {"held_main": holds.main, "held_sites": sorted(holds.sites),
             "held_shard_sites": list(shard_sites), "held_shard_numbers": list(shard_numbers),
             "declared_names": list(names), "declared_shards": list(counts)})


# -- per-page advisory locks: two batch runs never apply one page at once ------------------------

def try_lock_many(conn: psycopg.Connection, lock_class: int, page_urls: list[str]) -> set[str]:
    """`try_lock` for many pages in one statement; returns the pages locked."""
    if not page_urls:
        return set()
    rows = conn.execute(
        "SELECT u FROM unnest(%s::text[]) WITH ORDINALITY AS t (u, n)"
        " WHERE pg_try_advisory_lock(%s, hashtext(u)) ORDER BY n",
        (page_urls, lock_class),
    ).fetchall()
    return {r[0] for r in rows}


def unlock_all(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pg_advisory_unlock_all()")


def mark_switched(conn: psycopg.Connection, rows: list[tuple[UUID, str | None, bool, bool]]) -> None:
    """The switch's page rows: the index now shows their source (caller holds the row locks).
    (page_id, chunker_version, verified, changed) each."""
    if not rows:
        return
    ids, versions, verified, changed = (list(c) for c in zip(*rows))
    conn.execute(
        "UPDATE pages p SET indexed_hash = p.source_hash, chunker_version = n.version, deleted_at = NULL,"
        " last_verified_at = CASE WHEN n.verified THEN now() ELSE p.last_verified_at END,"
        " last_changed_at = CASE WHEN n.changed THEN now() ELSE p.last_changed_at END,"
        " applied_delivery_id = greatest(p.applied_delivery_id, p.source_delivery_id)"
        " FROM unnest(%s::uuid[], %s::text[], %s::boolean[], %s::boolean[]) AS n (page_id, version, verified, changed)"
        " WHERE p.page_id = n.page_id",
        (ids, versions, verified, changed),
    )
