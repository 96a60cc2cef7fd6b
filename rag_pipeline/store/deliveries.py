"""The deliveries table: the durable inbox between the receiver and the delivery sensor."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg.rows import class_row

from rag_pipeline.core.batch_sizing import WorkItem
from rag_pipeline.core.location_holds import Holds
from rag_pipeline.core.text import storable
from rag_pipeline.store import db, pages

# One statement, shared by the async receiver and the sync helpers, so both store the same row.
INSERT_DELIVERY = """
INSERT INTO deliveries (rid, url, pushed_url, crawler_status, original_status,
                        content_type, body, body_encoding)
VALUES (%(rid)s, %(url)s, %(pushed_url)s, %(crawler_status)s, %(original_status)s,
        %(content_type)s, %(body)s, %(body_encoding)s)
ON CONFLICT (rid) DO NOTHING
RETURNING id
"""


@dataclass
class Delivery:
    id: int
    rid: str
    url: str
    pushed_url: str | None
    crawler_status: int | None
    original_status: int | None
    body: bytes
    body_encoding: str
    received_at: datetime
    normalized_text: str | None = None
    normalized_hash: str | None = None     # its content hash, taken by routing
    page_url: str | None = None             # the page routing filed it under


_COLUMNS = "id, rid, url, pushed_url, crawler_status, original_status, body, body_encoding, received_at"


def insert(conn: psycopg.Connection, **row) -> int | None:
    """Store a delivery; None when its rid was already stored."""
    found = conn.execute(INSERT_DELIVERY, row).fetchone()
    return found[0] if found else None


# Any constant works; it only has to differ from other advisory locks of this database.
ROUTING_LOCK_KEY = 0x5241_4752


def claim_unrouted(conn: psycopg.Connection, limit: int) -> list[Delivery]:
    """The oldest deliveries nobody routed yet, locked so two sensor ticks never route one twice.

    One router at a time: with several code locations each delivery_sensor routes, and two chunks
    routed side by side could each read a page before the other's writes (newest crawl wins needs
    them in turn). A router that finds another at work claims nothing and leaves routing to it,
    never waiting: a router whose host died holds the lock until PostgreSQL notices, and every
    other location must go on leasing and reconciling meanwhile."""
    db.require_transaction(conn, "deliveries.claim_unrouted")
    if not conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (ROUTING_LOCK_KEY,)).fetchone()[0]:
        return []
    with conn.cursor(row_factory=class_row(Delivery)) as cur:
        cur.execute(
            f"SELECT {_COLUMNS} FROM deliveries WHERE processed_at IS NULL"
            " ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED",
            (limit,),
        )
        return cur.fetchall()


def mark(conn: psycopg.Connection, delivery_id: int, outcome: str, *,
         page_url: str | None = None, error: str | None = None, text: str | None = None,
         text_hash: str | None = None, crawled_at: datetime | None = None) -> None:
    """Settle (or queue) a delivery. A queued one keeps its normalized `text` and its hash for the
    run that applies it; any other outcome drops them (the page row holds the text it applies)."""
    # A reason quoting what was refused (a NUL, a lone surrogate) must not be refused in turn.
    error = storable(error) if error is not None else None
    conn.execute(
        "UPDATE deliveries SET processed_at = coalesce(processed_at, now()), outcome = %s,"
        " page_url = coalesce(%s, page_url), error = coalesce(%s, error),"
        " text_chars = coalesce(%s, text_chars), crawled_at = coalesce(%s, crawled_at),"
        " normalized_text = CASE WHEN %s = 'queued' THEN %s END,"
        " normalized_hash = CASE WHEN %s = 'queued' THEN %s END,"
        " applied_at = CASE WHEN %s IN ('embedded', 'unchanged', 'deleted') THEN now() END"
        " WHERE id = %s",
        (outcome, page_url, error, len(text) if text is not None else None, crawled_at, outcome, text,
         outcome, text_hash, outcome, delivery_id),
    )


def mark_many(conn: psycopg.Connection, rows: list[tuple]) -> None:
    """`mark` for many deliveries in one statement: (delivery_id, outcome, page_url, error, text,
    text_hash, crawled_at) each, with `mark`'s meaning (None leaves a column as it is)."""
    if not rows:
        return
    ids, outcomes, urls, errors, texts, hashes, crawled = (list(c) for c in zip(*rows))
    conn.execute(
        "UPDATE deliveries d SET processed_at = coalesce(d.processed_at, now()), outcome = n.outcome,"
        " page_url = coalesce(n.page_url, d.page_url), error = coalesce(n.error, d.error),"
        " text_chars = coalesce(length(n.text), d.text_chars), crawled_at = coalesce(n.crawled_at, d.crawled_at),"
        " normalized_text = CASE WHEN n.outcome = 'queued' THEN n.text END,"
        " normalized_hash = CASE WHEN n.outcome = 'queued' THEN n.text_hash END,"
        " applied_at = CASE WHEN n.outcome IN ('embedded', 'unchanged', 'deleted') THEN now() END"
        " FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::timestamptz[])"
        "   AS n (id, outcome, page_url, error, text, text_hash, crawled_at)"
        " WHERE d.id = n.id",
        (ids, outcomes, urls, [storable(e) if e is not None else None for e in errors], texts, hashes, crawled),
    )


def note_failed(conn: psycopg.Connection, delivery_id: int, error: str) -> None:
    """A queued delivery whose content could not be made searchable: failed, with why (the page
    keeps its old version; a retry is the run's business, `record_run_failure`)."""
    conn.execute(
        "UPDATE deliveries SET outcome = 'failed', error = left(%s, 2000) WHERE id = %s AND outcome = 'queued'",
        (storable(error), delivery_id),
    )


def newest_queued(conn: psycopg.Connection, page_url: str) -> Delivery | None:
    """With the text routing normalized, when it kept it (then the body is not read again)."""
    with conn.cursor(row_factory=class_row(Delivery)) as cur:
        cur.execute(
            "SELECT id, rid, url, pushed_url, crawler_status, original_status,"
            " CASE WHEN normalized_text IS NULL THEN body ELSE ''::bytea END AS body, body_encoding,"
            " received_at, normalized_text, normalized_hash FROM deliveries WHERE page_url = %s AND outcome = 'queued'"
            " ORDER BY id DESC LIMIT 1",
            (page_url,),
        )
        return cur.fetchone()


def newest_queued_many(conn: psycopg.Connection, page_urls: list[str]) -> dict[str, Delivery]:
    """`newest_queued` of each of these pages, in one statement."""
    with conn.cursor(row_factory=class_row(Delivery)) as cur:
        cur.execute(
            "SELECT DISTINCT ON (page_url) id, rid, url, pushed_url, crawler_status, original_status,"
            " CASE WHEN normalized_text IS NULL THEN body ELSE ''::bytea END AS body, body_encoding,"
            " received_at, normalized_text, normalized_hash, page_url FROM deliveries"
            " WHERE page_url = ANY(%s) AND outcome = 'queued' ORDER BY page_url, id DESC",
            (page_urls,),
        )
        return {d.page_url: d for d in cur.fetchall()}


def has_queued(conn: psycopg.Connection, page_url: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM deliveries WHERE page_url = %s AND outcome = 'queued' LIMIT 1", (page_url,)
    ).fetchone()
    return row is not None


def queued_among(conn: psycopg.Connection, page_urls: list[str]) -> set[str]:
    """Which of these pages have a queued delivery (`has_queued` for many, in one statement)."""
    rows = conn.execute(
        "SELECT DISTINCT page_url FROM deliveries WHERE page_url = ANY(%s) AND outcome = 'queued'",
        (page_urls,)).fetchall()
    return {r[0] for r in rows}


def supersede_older_many(conn: psycopg.Connection, applied: list[tuple[str, int]]) -> dict[str, int]:
    """Queued or failed deliveries older than the one applied will never be applied themselves (a
    failed one's pending retry is cancelled with it), for many (page_url, delivery id) pairs in one
    statement; returns how many deliveries each page had superseded."""
    if not applied:
        return {}
    urls, ids = (list(c) for c in zip(*applied))
    rows = conn.execute(
        "WITH done AS (UPDATE deliveries d SET outcome = 'superseded', retry_at = NULL, normalized_text = NULL,"
        "   normalized_hash = NULL FROM unnest(%s::text[], %s::bigint[]) AS n (url, id)"
        "   WHERE d.page_url = n.url AND d.outcome IN ('queued', 'failed') AND d.id < n.id RETURNING d.page_url)"
        " SELECT page_url, count(*) FROM done GROUP BY page_url",
        (urls, ids),
    ).fetchall()
    return {url: n for url, n in rows}


def mark_embedded_many(conn: psycopg.Connection, applied: list[tuple[str, int]]) -> None:
    """`mark(.., "embedded")` for many (page_url, delivery id) pairs: their content is searchable."""
    if not applied:
        return
    urls, ids = (list(c) for c in zip(*applied))
    conn.execute(
        "UPDATE deliveries d SET processed_at = coalesce(d.processed_at, now()), outcome = 'embedded',"
        " page_url = n.url, normalized_text = NULL, normalized_hash = NULL, applied_at = now()"
        " FROM unnest(%s::text[], %s::bigint[]) AS n (url, id) WHERE d.id = n.id",
        (urls, ids),
    )


def record_run_failure(conn: psycopg.Connection, delivery_id: int, attempt: int, error: str, *,
                       retryable: bool, max_attempts: int, backoff_s: float,
                       max_backoff_s: float) -> datetime | None:
    """Count a failed run of this delivery and schedule the next try (backoff x4 per failure, at
    most ``max_backoff_s``).

    Compare-and-set on `attempts`: the failure of one try is counted once, however often it is
    reported. Returns when the retry is due; None when there is none (not retryable, attempts
    spent, or the delivery was applied or superseded meanwhile).
    """
    error = storable(error)   # an error quoting the refused data would be refused in turn
    row = conn.execute(
        "UPDATE deliveries SET outcome = 'failed', error = left(%(error)s, 2000),"
        " attempts = attempts + 1,"
        " retry_at = CASE WHEN %(retryable)s AND attempts + 1 < %(max)s"
        "            THEN now() + make_interval(secs => least(%(backoff)s * power(4, attempts), %(cap)s)) END"
        " WHERE id = %(id)s AND attempts = %(attempt)s AND outcome IN ('queued', 'failed')"
        " RETURNING retry_at",
        {"error": error, "retryable": retryable, "max": max_attempts, "backoff": backoff_s, "cap": max_backoff_s,
         "id": delivery_id, "attempt": attempt},
    ).fetchone()
    return row[0] if row else None


def claim_due_retries(conn: psycopg.Connection, limit: int) -> int:
    """Failed deliveries whose retry is due, queued again. One already overtaken by what its page
    shows (a newer crawl applied meanwhile) is superseded instead: retrying it would apply history."""
    with conn.transaction():
        conn.execute(
            "UPDATE deliveries d SET outcome = 'superseded', retry_at = NULL FROM pages p"
            " WHERE d.retry_at <= now() AND d.outcome = 'failed' AND p.url = d.page_url"
            " AND p.applied_delivery_id > d.id"
        )
        rows = conn.execute(
            "UPDATE deliveries SET outcome = 'queued', retry_at = NULL"
            " WHERE id IN (SELECT id FROM deliveries WHERE retry_at <= now() AND outcome = 'failed'"
            "              ORDER BY retry_at LIMIT %s FOR UPDATE SKIP LOCKED)"
            " RETURNING page_url, id, attempts",
            (limit,),
        ).fetchall()
    return len(rows)


def queued_work(conn: psycopg.Connection, limit: int, holds: Holds | None = None) -> list[WorkItem]:
    """The newest queued delivery of each page no live batch holds, oldest first: what the next
    batches apply (a batch applies a page's newest queued delivery anyway). `holds`: only the
    pages of this code location's sites (LOCATION_HOLDS); unset, every page."""
    held, params = pages.held_clause(holds)
    rows = conn.execute(
        "SELECT q.page_url, q.id, q.attempts, coalesce(q.text_chars, 0) FROM"
        " (SELECT DISTINCT ON (page_url) page_url, id, attempts, text_chars FROM deliveries"
        "  WHERE outcome = 'queued' ORDER BY page_url, id DESC) q"
        " JOIN pages p ON p.url = q.page_url"
        f" WHERE (p.leased_until IS NULL OR p.leased_until <= now()) AND {held}"
        " ORDER BY q.id LIMIT %(limit)s",
        {**params, "limit": limit},
    ).fetchall()
    return [WorkItem(*row) for row in rows]


def queued_chars(conn: psycopg.Connection) -> int:
    """The size of the text waiting to be indexed (an index-only scan of deliveries_queued_work)."""
    return int(conn.execute("SELECT coalesce(sum(text_chars), 0) FROM deliveries WHERE outcome = 'queued'")
               .fetchone()[0])


def attempts_of(conn: psycopg.Connection, delivery_id: int) -> int:
    row = conn.execute("SELECT attempts FROM deliveries WHERE id = %s", (delivery_id,)).fetchone()
    return row[0] if row else 0


def outcome_counts(conn: psycopg.Connection) -> dict[str, int]:
    rows = conn.execute(
        "SELECT coalesce(outcome, 'unrouted'), count(*) FROM deliveries GROUP BY 1"
    ).fetchall()
    return {outcome: n for outcome, n in rows}
