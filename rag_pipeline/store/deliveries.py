"""The deliveries table: the durable inbox between the receiver and the delivery sensor."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg.rows import class_row

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


_COLUMNS = "id, rid, url, pushed_url, crawler_status, original_status, body, body_encoding, received_at"


def insert(conn: psycopg.Connection, **row) -> int | None:
    """Store a delivery; None when its rid was already stored."""
    found = conn.execute(INSERT_DELIVERY, row).fetchone()
    return found[0] if found else None


def claim_unrouted(conn: psycopg.Connection, limit: int) -> list[Delivery]:
    """The oldest deliveries nobody routed yet, locked so two sensor ticks never route one twice."""
    with conn.cursor(row_factory=class_row(Delivery)) as cur:
        cur.execute(
            f"SELECT {_COLUMNS} FROM deliveries WHERE processed_at IS NULL"
            " ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED",
            (limit,),
        )
        return cur.fetchall()


def mark(conn: psycopg.Connection, delivery_id: int, outcome: str, *,
         page_url: str | None = None, error: str | None = None) -> None:
    conn.execute(
        "UPDATE deliveries SET processed_at = coalesce(processed_at, now()), outcome = %s,"
        " page_url = coalesce(%s, page_url), error = coalesce(%s, error),"
        " applied_at = CASE WHEN %s IN ('embedded', 'unchanged', 'deleted') THEN now() END"
        " WHERE id = %s",
        (outcome, page_url, error, outcome, delivery_id),
    )


def newest_queued(conn: psycopg.Connection, page_url: str) -> Delivery | None:
    with conn.cursor(row_factory=class_row(Delivery)) as cur:
        cur.execute(
            f"SELECT {_COLUMNS} FROM deliveries WHERE page_url = %s AND outcome = 'queued'"
            " ORDER BY id DESC LIMIT 1",
            (page_url,),
        )
        return cur.fetchone()


def has_queued(conn: psycopg.Connection, page_url: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM deliveries WHERE page_url = %s AND outcome = 'queued' LIMIT 1", (page_url,)
    ).fetchone()
    return row is not None


def supersede_older(conn: psycopg.Connection, page_url: str, newer_than_id: int) -> int:
    """Queued deliveries older than the one applied will never be applied themselves."""
    cur = conn.execute(
        "UPDATE deliveries SET outcome = 'superseded'"
        " WHERE page_url = %s AND outcome = 'queued' AND id < %s",
        (page_url, newer_than_id),
    )
    return cur.rowcount


def stale_queued(conn: psycopg.Connection, older_than_minutes: int, limit: int) -> list[tuple[str, int]]:
    """(page_url, newest queued delivery id) of pages whose queued delivery waits too long:
    the run request may have been lost between the routing commit and the run launch."""
    return conn.execute(
        "SELECT page_url, max(id) FROM deliveries WHERE outcome = 'queued'"
        " AND processed_at < now() - make_interval(mins => %s)"
        " GROUP BY page_url ORDER BY min(id) LIMIT %s",
        (older_than_minutes, limit),
    ).fetchall()


def outcome_counts(conn: psycopg.Connection) -> dict[str, int]:
    rows = conn.execute(
        "SELECT coalesce(outcome, 'unrouted'), count(*) FROM deliveries GROUP BY 1"
    ).fetchall()
    return {outcome: n for outcome, n in rows}
