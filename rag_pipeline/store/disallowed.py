"""Pages robots.txt disallows (`pages.disallowed_at`, `disallowed_rule`, `disallowed_url`).

Found so by the local crawler, which then did not fetch the page, or by a reading of the page's
site, whatever crawls it (Crawlbase reads no robots.txt). Either way the page leaves the recrawl
queue until robots.txt is read again, instead of being pushed and refused every few minutes: its
next crawl moves past the crawler's robots.txt TTL, or past the site's next reading, and never
sooner than its own interval. A reading that finds robots.txt allows it again makes it due now.
Every statement here is set-based: one per batch of pages, never one per page.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

import psycopg


@dataclass(frozen=True)
class Disallowed:
    """One page `site show` names: what robots.txt says, since when, and when it is looked at again."""

    crawl_url: str
    rule: str
    found_at: datetime
    next_look_at: datetime | None


@dataclass(frozen=True)
class Refusal:
    """The crawler's word on one page: the rule, the URL it disallows (the page's own or a hop of
    its redirect), and how long the verdict holds (the crawler's robots.txt TTL)."""

    rule: str
    url: str
    holds: timedelta


def refused(conn: psycopg.Connection, pages: Mapping[str, Refusal]) -> None:
    """Pages (page URL → refusal) the crawler did not fetch because robots.txt disallows them:
    marked, and not due again before the verdict can change, nor sooner than their interval."""
    if not pages:
        return
    urls = list(pages)
    conn.execute(
        "UPDATE pages p SET disallowed_at = now(), disallowed_rule = d.rule, disallowed_url = d.hop,"
        "   next_crawl_at = now() + greatest(p.recrawl_every, d.holds)"
        " FROM unnest(%s::text[], %s::text[], %s::text[], %s::interval[]) AS d(url, rule, hop, holds)"
        " WHERE p.url = d.url AND p.alias_of IS NULL",
        (urls, [pages[u].rule for u in urls], [pages[u].url for u in urls], [pages[u].holds for u in urls]))


def site_pages(conn: psycopg.Connection, site: str, after: UUID | None, limit: int
               ) -> list[tuple[UUID, str, str, str | None]]:
    """(page id, page URL, URL as crawled, the URL robots.txt was found to disallow if it is
    marked) of the site's live pages, the next `limit` in page id order after `after` (None: from
    the first). A keyset read, one statement on the caller's autocommit connection: a pass over a
    large site holds no snapshot, and no row locks, from one batch to the next."""
    after_clause, params = ("", (site, limit)) if after is None else (" AND page_id > %s", (site, after, limit))
    return conn.execute(
        "SELECT page_id, url, coalesce(crawl_url, url),"
        "   CASE WHEN disallowed_at IS NOT NULL THEN coalesce(disallowed_url, crawl_url, url) END"
        " FROM pages WHERE site = %s AND alias_of IS NULL AND deleted_at IS NULL" + after_clause +
        " ORDER BY page_id LIMIT %s", params).fetchall()


def has_pages_on(conn: psycopg.Connection, site: str, origin: str) -> bool:
    """Whether the site has a live page crawled on `origin` (`scheme://host[:port]`, lower case):
    a reading reads that origin's robots.txt to judge them."""
    return conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pages WHERE site = %s AND alias_of IS NULL AND deleted_at IS NULL"
        "   AND starts_with(lower(coalesce(crawl_url, url)), %s))", (site, origin.lower() + "/")).fetchone()[0]


def judged(conn: psycopg.Connection, site: str, disallowed: Mapping[str, str], allowed: list[str], *,
           holds: timedelta) -> tuple[int, int]:
    """A reading's verdicts on pages of `site` by their own URL: those robots.txt disallows (page
    URL → rule) are marked, or stamped again, and held out of the queue for `holds` (past the next
    reading) unless their slot is later anyway; those marked before that it allows now are due
    now. Returns (disallowed, allowed again). One short transaction: its rows are locked no longer
    than its two statements take."""
    if not disallowed and not allowed:
        return 0, 0
    with conn.transaction():
        marked = conn.execute(
            "UPDATE pages p SET disallowed_at = now(), disallowed_rule = d.rule,"
            "   disallowed_url = coalesce(p.crawl_url, p.url),"
            "   next_crawl_at = greatest(p.next_crawl_at, now() + greatest(p.recrawl_every, %s))"
            " FROM unnest(%s::text[], %s::text[]) AS d(url, rule)"
            " WHERE p.url = d.url AND p.site = %s AND p.alias_of IS NULL",
            (holds, list(disallowed), list(disallowed.values()), site)).rowcount if disallowed else 0
        released = conn.execute(
            "UPDATE pages SET disallowed_at = NULL, disallowed_rule = NULL, disallowed_url = NULL,"
            "   next_crawl_at = now()"
            " WHERE url = ANY(%s) AND site = %s AND disallowed_at IS NOT NULL AND alias_of IS NULL",
            (allowed, site)).rowcount if allowed else 0
    return marked, released


def examples(conn: psycopg.Connection, site: str, limit: int = 5) -> list[Disallowed]:
    """A few of the site's disallowed pages, the most recently found first."""
    rows = conn.execute(
        "SELECT coalesce(crawl_url, url), disallowed_rule, disallowed_at, next_crawl_at FROM pages"
        " WHERE site = %s AND disallowed_at IS NOT NULL AND deleted_at IS NULL AND alias_of IS NULL"
        " ORDER BY disallowed_at DESC, url LIMIT %s", (site, limit)).fetchall()
    return [Disallowed(*row) for row in rows]
