"""The pushes table: every request we made of the crawler, written before the push and finished
with its result, so a push that never got its delivery is visible."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg


@dataclass(frozen=True)
class Outcome:
    push_id: int
    rid: str | None            # None: the push failed
    attempts: int
    error: str | None = None


def begin(conn: psycopg.Connection, items: list[tuple[str, str]], *, reason: str, crawler: str,
          run_id: str | None) -> list[int]:
    """Record (crawl URL, page URL) pushes as pending; returns their ids in the same order."""
    with conn.transaction():
        if not items:
            return []
        ids = [r[0] for r in conn.execute(
            "SELECT nextval('pushes_push_id_seq') FROM generate_series(1, %s)", (len(items),)
        ).fetchall()]
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO pushes (push_id, url, page_url, reason, crawler, run_id)"
                " VALUES (%s, %s, %s, %s, %s, %s)",
                [(pid, url, page_url, reason, crawler, run_id) for pid, (url, page_url) in zip(ids, items)],
            )
        return ids


def finish(conn: psycopg.Connection, outcomes: list[Outcome]) -> None:
    with conn.cursor() as cur:
        cur.executemany(
            "UPDATE pushes SET rid = %s, result = %s, attempts = %s, error = %s, finished_at = now()"
            " WHERE push_id = %s",
            [(o.rid, "pushed" if o.rid else "failed", o.attempts, (o.error or "")[:2000] or None, o.push_id)
             for o in outcomes],
        )


def fail_delivery(conn: psycopg.Connection, failures: dict[str, str]) -> set[str]:
    """Pushed pushes (by rid) whose delivery the crawler gave up on: failed, with the reason.
    One whose delivery was stored anyway (the answer lost after the commit) stays `pushed`.
    Returns the rids marked failed."""
    rows = conn.execute(
        "UPDATE pushes p SET result = 'failed', error = f.reason, finished_at = now()"
        " FROM unnest(%s::text[], %s::text[]) AS f(rid, reason)"
        " WHERE p.rid = f.rid AND p.result = 'pushed'"
        " AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.rid = p.rid)"
        " RETURNING p.rid",
        (list(failures), [reason[:2000] for reason in failures.values()]),
    ).fetchall()
    return {r[0] for r in rows}


def disallow(conn: psycopg.Connection, rules: dict[str, str]) -> set[str]:
    """Pushed pushes (by rid) the crawler did not fetch because robots.txt disallows them:
    `disallowed`, the rule as their error (no crawler failure: the crawler checks leave them out).
    Returns the rids so marked."""
    rows = conn.execute(
        "UPDATE pushes p SET result = 'disallowed', error = f.rule, finished_at = now()"
        " FROM unnest(%s::text[], %s::text[]) AS f(rid, rule)"
        " WHERE p.rid = f.rid AND p.result = 'pushed'"
        " AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.rid = p.rid)"
        " RETURNING p.rid",
        (list(rules), [rule[:2000] for rule in rules.values()]),
    ).fetchall()
    return {r[0] for r in rows}


# A push run records its pushes as pending, then finishes each within seconds (minutes with a low
# CRAWLER_PUSH_RATE and retries): one still pending after this long belongs to a run that died.
PENDING_EXPIRY_S = 3600


def expire_pending(conn: psycopg.Connection, older_than_s: float = PENDING_EXPIRY_S) -> int:
    """Mark pushes left pending by a run that died as failed, so they show in the crawler checks
    and retention may prune them in time. Whether the crawler got them is unknown: their pages
    are due again anyway once the recrawl lease ends."""
    cur = conn.execute(
        "UPDATE pushes SET result = 'failed', finished_at = now(),"
        " error = 'no result recorded: the push run ended before finishing this push'"
        " WHERE result = 'pending' AND pushed_at < now() - make_interval(secs => %s)",
        (older_than_s,),
    )
    return cur.rowcount


def pushed(conn: psycopg.Connection, rid: str) -> tuple[str | None, datetime | None]:
    """(the URL pushed, when) of the push the crawler answered with this rid; (None, None) for a
    delivery we did not push (a manual crawl, a push older than the pushes kept)."""
    row = conn.execute("SELECT url, pushed_at FROM pushes WHERE rid = %s", (rid,)).fetchone()
    return (row[0], row[1]) if row else (None, None)


def in_flight(conn: psycopg.Connection, page_urls: list[str]) -> tuple[str | None, datetime | None]:
    """(URL, when) of the newest push of one of these pages still waiting for its result: a
    crawler may deliver before the push run records the rid it answered (a push run records its
    rids when all its pushes are made)."""
    row = conn.execute(
        "SELECT url, pushed_at FROM pushes WHERE result = 'pending' AND page_url = ANY(%s)"
        " ORDER BY pushed_at DESC LIMIT 1", (page_urls,)).fetchone()
    return (row[0], row[1]) if row else (None, None)


def pushed_many(conn: psycopg.Connection, rids: list[str]) -> dict[str, tuple[str, datetime]]:
    """`pushed` for many rids in one statement: rid → (the URL pushed, when), for rids we pushed."""
    rows = conn.execute("SELECT rid, url, pushed_at FROM pushes WHERE rid = ANY(%s)", (rids,)).fetchall()
    return {rid: (url, at) for rid, url, at in rows}


def in_flight_many(conn: psycopg.Connection, page_urls: list[str]) -> dict[str, tuple[str, datetime]]:
    """`in_flight` of each of these pages on its own, in one statement: page → (URL, when)."""
    rows = conn.execute(
        "SELECT DISTINCT ON (page_url) page_url, url, pushed_at FROM pushes"
        " WHERE result = 'pending' AND page_url = ANY(%s) ORDER BY page_url, pushed_at DESC",
        (page_urls,)).fetchall()
    return {page: (url, at) for page, url, at in rows}


# How far back `undelivered` (the pushes_delivered check) looks for a push's delivery; retention
# never deletes a push, or a delivery of a push, younger than this.
UNDELIVERED_WINDOW_S = 7 * 86400


@dataclass(frozen=True)
class Undelivered:
    count: int
    examples: list[tuple[int, str, str]]       # (push_id, url, rid)


def undelivered(conn: psycopg.Connection, older_than_s: float,
                window_s: float = UNDELIVERED_WINDOW_S) -> Undelivered:
    """Pushes accepted more than `older_than_s` ago (within the window) with no delivery yet."""
    where = (
        " FROM pushes p WHERE p.result = 'pushed'"
        " AND p.pushed_at < now() - make_interval(secs => %(older)s)"
        " AND p.pushed_at > now() - make_interval(secs => %(window)s)"
        " AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.rid = p.rid)"
    )
    params = {"older": older_than_s, "window": window_s}
    count = conn.execute("SELECT count(*)" + where, params).fetchone()[0]
    rows = conn.execute("SELECT p.push_id, p.url, p.rid" + where + " ORDER BY p.pushed_at LIMIT 5",
                        params).fetchall()
    return Undelivered(count, [tuple(r) for r in rows])


def failed_recently(conn: psycopg.Connection, window_s: float) -> list[tuple[int, str, str]]:
    rows = conn.execute(
        "SELECT push_id, url, coalesce(error, '') FROM pushes WHERE result = 'failed'"
        " AND pushed_at > now() - make_interval(secs => %s) ORDER BY push_id DESC LIMIT 5",
        (window_s,),
    ).fetchall()
    return [tuple(r) for r in rows]


def counts(conn: psycopg.Connection) -> dict[str, int]:
    rows = conn.execute("SELECT result, count(*) FROM pushes GROUP BY result").fetchall()
    return {r[0]: r[1] for r in rows}
