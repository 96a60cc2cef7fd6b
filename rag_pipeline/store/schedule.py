"""Each page's recrawl cadence and its place in the recrawl queue (`pages.next_crawl_at`).

Aliases (redirected URLs) have no `next_crawl_at`: they are never pushed again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

import psycopg

from rag_pipeline.core.urls import page_id


@dataclass(frozen=True)
class Target:
    """A page to push: its identity and the URL to crawl (as it was seeded). `due_at`: when the
    schedule wanted it (claimed pages only), which its next crawl counts from."""
    page_url: str
    crawl_url: str
    due_at: datetime | None = None


@dataclass(frozen=True)
class Registered:
    page_url: str
    crawl_url: str
    recrawl_every: timedelta
    alias_of: str | None
    created: bool = False          # the row did not exist before


@dataclass(frozen=True)
class Cadence:
    """What `cadence show` prints; `now` is the database's clock, so "5m ago" ignores local skew."""
    recrawl_every: timedelta | None
    source: str | None
    next_crawl_at: datetime | None
    last_crawled_at: datetime | None
    alias_of: str | None
    deleted_at: datetime | None
    now: datetime
    change_rate: float | None = None     # estimated changes per second (adaptive cadence)
    why: str | None = None               # how the adaptive cadence derived recrawl_every
    derived_at: datetime | None = None   # the refresh that last wrote them
    site: str | None = None              # whose rules it follows (None: the deployment's)


def register(conn: psycopg.Connection, url: str, page_url: str, every: timedelta, *,
             explicit: bool, site: str | None = None, shard: int | None = None) -> Registered:
    """Add or update a seeded page, due now. An explicit cadence (seed `every=`) wins; a pattern
    default never overrides a cadence someone set by hand. `site`/`shard`: where a new page
    belongs (a page keeps the site it has)."""
    row = conn.execute(
        "INSERT INTO pages (page_id, url, crawl_url, recrawl_every, cadence_source, next_crawl_at, site, shard,"
        "   discovered_by)"
        " VALUES (%(id)s, %(page_url)s, %(url)s, %(every)s, %(source)s, now(), %(site)s, %(shard)s, 'seed')"
        " ON CONFLICT (page_id) DO UPDATE SET crawl_url = excluded.crawl_url,"
        "   recrawl_every = CASE WHEN %(explicit)s OR pages.cadence_source IS NULL"
        "     OR pages.cadence_source = 'default' THEN excluded.recrawl_every ELSE pages.recrawl_every END,"
        "   cadence_source = CASE WHEN %(explicit)s OR pages.cadence_source IS NULL"
        "     OR pages.cadence_source = 'default' THEN excluded.cadence_source ELSE pages.cadence_source END,"
        "   next_crawl_at = CASE WHEN pages.alias_of IS NULL THEN now() END"
        " RETURNING url, crawl_url, recrawl_every, alias_of",
        {"id": page_id(page_url), "page_url": page_url, "url": url, "every": every,
         "source": "seed" if explicit else "default", "explicit": explicit, "site": site, "shard": shard},
    ).fetchone()
    return Registered(*row)


def set_cadence(conn: psycopg.Connection, url: str, page_url: str, every: timedelta, *,
                register: bool = False, source: str = "manual", site: str | None = None,
                shard: int | None = None) -> Registered | None:
    """`rag-pipeline cadence set`: the next crawl moves to last crawl + the new interval (a page
    never crawled keeps its earlier slot: due now, or leased while its first push is in flight).
    An alias is returned untouched (its target is what gets crawled); an unknown page is None
    unless `register`, which adds it due now, in `site`/`shard`: a cadence nobody crawled yet must
    not wait one interval."""
    with conn.transaction():
        current = conn.execute(
            "SELECT url, coalesce(crawl_url, url), recrawl_every, alias_of FROM pages WHERE page_id = %s"
            " FOR UPDATE", (page_id(page_url),),
        ).fetchone()
        if current is None and not register:
            return None
        if current is not None and current[3] is not None:
            return Registered(*current)
        row = conn.execute(
            "INSERT INTO pages (page_id, url, crawl_url, recrawl_every, cadence_source, next_crawl_at, site, shard)"
            " VALUES (%(id)s, %(page_url)s, %(url)s, %(every)s, %(source)s, now(), %(site)s, %(shard)s)"
            " ON CONFLICT (page_id) DO UPDATE SET recrawl_every = excluded.recrawl_every,"
            "   cadence_source = excluded.cadence_source,"
            "   next_crawl_at = coalesce(pages.last_crawled_at + excluded.recrawl_every,"
            "     least(pages.next_crawl_at, now() + excluded.recrawl_every))"
            " RETURNING url, coalesce(crawl_url, url), recrawl_every, alias_of",
            {"id": page_id(page_url), "page_url": page_url, "url": url, "every": every, "source": source,
             "site": site, "shard": shard},
        ).fetchone()
        return Registered(*row, created=current is None)


def cadence_of(conn: psycopg.Connection, page_url: str) -> Cadence | None:
    row = conn.execute(
        "SELECT recrawl_every, cadence_source, next_crawl_at, last_crawled_at, alias_of, deleted_at, now(),"
        " change_rate, cadence_why, cadence_updated_at, site FROM pages WHERE url = %s", (page_url,),
    ).fetchone()
    return Cadence(*row) if row else None


def assign_defaults(conn: psycopg.Connection, every_for, limit: int) -> int:
    """Pages first seen through a delivery get their pattern's cadence (bounded per call);
    `every_for(url, site)` gives it, by the site's rules where it has some."""
    with conn.transaction():
        rows = conn.execute(
            "SELECT page_id, url, site FROM pages WHERE cadence_source IS NULL ORDER BY first_seen_at"
            " LIMIT %s FOR UPDATE SKIP LOCKED",
            (limit,),
        ).fetchall()
        if not rows:
            return 0
        conn.execute(
            "UPDATE pages p SET recrawl_every = u.every, cadence_source = 'default',"
            " next_crawl_at = CASE WHEN p.alias_of IS NULL"
            "   THEN coalesce(p.last_crawled_at, p.first_seen_at) + u.every END"
            " FROM unnest(%s::uuid[], %s::interval[]) AS u(page_id, every) WHERE p.page_id = u.page_id",
            ([pid for pid, _, _ in rows], [every_for(url, site) for _, url, site in rows]),
        )
        return len(rows)


def claim_due(conn: psycopg.Connection, limit: int, lease: timedelta,
              tombstone_recheck: timedelta = timedelta(days=30)) -> list[Target]:
    """The pages whose next crawl has come, oldest first; each is leased for `lease` so the next
    tick does not push it again before its push is recorded (a lost run frees it then).
    A page tombstoned since it was scheduled is not pushed yet: it moves to its slow re-check."""
    rows = conn.execute(
        "WITH due AS (SELECT page_id, next_crawl_at AS due_at,"
        "   deleted_at + greatest(recrawl_every, %(slow)s) AS recheck"
        "  FROM pages WHERE alias_of IS NULL AND next_crawl_at <= now()"
        "  ORDER BY next_crawl_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)"
        " UPDATE pages p SET next_crawl_at = CASE WHEN due.recheck > now() THEN due.recheck"
        "   ELSE now() + %(lease)s END"
        " FROM due WHERE p.page_id = due.page_id"
        " RETURNING p.url, coalesce(p.crawl_url, p.url), due.due_at, due.recheck > now()",
        {"slow": tombstone_recheck, "limit": limit, "lease": lease},
    ).fetchall()
    return [Target(url, crawl_url, due_at) for url, crawl_url, due_at, postponed in rows if not postponed]


def targets(conn: psycopg.Connection, page_urls: list[str],
            due_at: Mapping[str, datetime] | None = None) -> list[Target]:
    """The pages among ``page_urls`` that are still pushed (aliases are not), with the URL to crawl."""
    rows = conn.execute(
        "SELECT url, coalesce(crawl_url, url) FROM pages WHERE url = ANY(%s) AND alias_of IS NULL ORDER BY url",
        (list(page_urls),),
    ).fetchall()
    due_at = due_at or {}
    return [Target(url, crawl_url, due_at.get(url)) for url, crawl_url in rows]


def matching(conn: psycopg.Connection, like: str, limit: int) -> list[Target]:
    """Live or tombstoned pages (not aliases) whose URL matches a LIKE pattern."""
    rows = conn.execute(
        "SELECT url, coalesce(crawl_url, url) FROM pages WHERE alias_of IS NULL"
        " AND (url LIKE %s OR crawl_url LIKE %s) ORDER BY url LIMIT %s",
        (like, like, limit),
    ).fetchall()
    return [Target(*r) for r in rows]


def after_push(conn: psycopg.Connection, pushed: list[str], failed: list[str], *,
               tombstone_recheck: timedelta, retry_after: timedelta,
               due_at: Mapping[str, datetime] | None = None) -> None:
    """The next crawl moves when a push is recorded: one interval on, slower for a tombstone;
    a failed push is tried again after `retry_after` (or its own interval, if shorter).
    A scheduled page's interval counts from when it was due (`due_at`), not from its push, so
    the sensor's tick and the run's start-up do not add to every cadence; a slot already past
    (a backlog, an outage) counts from the push instead, so a late page is not pushed twice.
    A pushed page is no longer marked disallowed by robots.txt: a crawler that reads robots.txt
    marks it again when it refuses it (`store.disallowed`)."""
    with conn.transaction():
        if pushed:
            due_at = due_at or {}
            conn.execute(
                "UPDATE pages p SET next_crawl_at = CASE"
                "   WHEN p.deleted_at IS NOT NULL THEN now() + greatest(p.recrawl_every, %s)"
                "   WHEN d.due_at + p.recrawl_every > now() THEN d.due_at + p.recrawl_every"
                "   ELSE now() + p.recrawl_every END, disallowed_at = NULL, disallowed_rule = NULL,"
                "   disallowed_url = NULL"
                " FROM unnest(%s::text[], %s::timestamptz[]) AS d(url, due_at)"
                " WHERE p.url = d.url AND p.alias_of IS NULL",
                (tombstone_recheck, pushed, [due_at.get(url) for url in pushed]),
            )
        if failed:
            conn.execute(
                "UPDATE pages SET next_crawl_at = now() + least(recrawl_every, %s)"
                " WHERE url = ANY(%s) AND alias_of IS NULL",
                (retry_after, failed),
            )


def due_count(conn: psycopg.Connection) -> int:
    return conn.execute(
        "SELECT count(*) FROM pages WHERE alias_of IS NULL AND next_crawl_at <= now()"
    ).fetchone()[0]


def overdue(conn: psycopg.Connection, grace: timedelta = timedelta(minutes=10)) -> tuple[int, list[str]]:
    """Live pages (not aliases) not crawled for twice their interval, plus a grace for the sensor
    interval and the crawl itself; not those robots.txt disallows (held on purpose: a verdict, no
    lag, `store.disallowed`). One scan of `pages`: ~tens of ms at 100k pages."""
    rows = conn.execute(
        "SELECT url, count(*) OVER () FROM pages WHERE alias_of IS NULL AND deleted_at IS NULL"
        " AND disallowed_at IS NULL"
        " AND coalesce(last_crawled_at, first_seen_at) < now() - 2 * recrawl_every - %s"
        " ORDER BY coalesce(last_crawled_at, first_seen_at) LIMIT 5",
        (grace,),
    ).fetchall()
    return (rows[0][1] if rows else 0), [r[0] for r in rows]
