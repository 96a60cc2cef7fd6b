"""Redirects: a pushed URL that answered with another page becomes an alias of that page.

The content is indexed once, under the delivered URL; the alias row keeps saying where it went
(`alias_of`, `redirected_at`), loses any chunks it had, and is never pushed again.
"""

from __future__ import annotations

import psycopg

from rag_pipeline.core.urls import page_id
from rag_pipeline.store import db


def record(conn: psycopg.Connection, alias_url: str, target_url: str, target_crawl_url: str,
           delivery_id: int) -> bool:
    """Make `alias_url` an alias of `target_url` (both normalized); the caller holds the target's
    row lock. Returns False when the alias has seen newer news of its own (a later direct crawl)."""
    db.require_transaction(conn, "aliases.record")
    alias = conn.execute(
        "SELECT applied_delivery_id, recrawl_every, cadence_source FROM pages WHERE url = %s FOR UPDATE",
        (alias_url,),
    ).fetchone()
    if alias is not None and (alias[0] or 0) > delivery_id:
        return False
    # The target inherits the alias's cadence when it has none of its own yet.
    if alias is not None:
        conn.execute(
            "INSERT INTO pages (page_id, url, crawl_url, recrawl_every, cadence_source, next_crawl_at)"
            " VALUES (%s, %s, %s, %s, 'redirect', now() + %s)"
            " ON CONFLICT (page_id) DO UPDATE SET"
            "  crawl_url = coalesce(pages.crawl_url, excluded.crawl_url),"
            "  recrawl_every = CASE WHEN pages.cadence_source IS NULL OR pages.cadence_source = 'default'"
            "    THEN excluded.recrawl_every ELSE pages.recrawl_every END,"
            "  cadence_source = CASE WHEN pages.cadence_source IS NULL OR pages.cadence_source = 'default'"
            "    THEN 'redirect' ELSE pages.cadence_source END,"
            "  next_crawl_at = coalesce(pages.next_crawl_at, excluded.next_crawl_at)",
            (page_id(target_url), target_url, target_crawl_url, alias[1], alias[1]),
        )
    else:
        conn.execute(
            "INSERT INTO pages (page_id, url, crawl_url) VALUES (%s, %s, %s) ON CONFLICT (page_id) DO"
            " UPDATE SET crawl_url = coalesce(pages.crawl_url, excluded.crawl_url)",
            (page_id(target_url), target_url, target_crawl_url),
        )
    alias_id = page_id(alias_url)
    # A new alias row counts with its target's site (it is never indexed, so it needs no shard).
    conn.execute(
        "INSERT INTO pages (page_id, url, cadence_source, site, discovered_by)"
        " SELECT %s, %s, 'redirect', site, 'redirect' FROM pages WHERE page_id = %s"
        " ON CONFLICT (page_id) DO NOTHING",
        (alias_id, alias_url, page_id(target_url)),
    )
    # Nothing indexed twice: whatever the alias had in search leaves it now.
    conn.execute("DELETE FROM chunks WHERE page_id = %s", (alias_id,))
    conn.execute("DELETE FROM staged_chunks WHERE page_id = %s", (alias_id,))
    conn.execute(
        "UPDATE pages SET alias_of = %s, redirected_at = now(), next_crawl_at = NULL,"
        " indexed_hash = NULL, source_hash = NULL, source_text = NULL,"
        " applied_delivery_id = greatest(applied_delivery_id, %s) WHERE page_id = %s",
        (target_url, delivery_id, alias_id),
    )
    return True


def clear(conn: psycopg.Connection, url: str) -> None:
    """A URL delivered as itself again is a page again (the redirect was removed)."""
    conn.execute(
        "UPDATE pages SET alias_of = NULL, redirected_at = NULL,"
        " next_crawl_at = coalesce(next_crawl_at, now() + recrawl_every)"
        " WHERE url = %s AND alias_of IS NOT NULL",
        (url,),
    )


def aliases_among(conn: psycopg.Connection, urls: list[str]) -> set[str]:
    """Which of these URLs are aliases now (what `clear` would change)."""
    rows = conn.execute("SELECT url FROM pages WHERE url = ANY(%s) AND alias_of IS NOT NULL", (urls,)).fetchall()
    return {r[0] for r in rows}


def alias_of(conn: psycopg.Connection, url: str) -> str | None:
    row = conn.execute("SELECT alias_of FROM pages WHERE url = %s", (url,)).fetchone()
    return row[0] if row else None
