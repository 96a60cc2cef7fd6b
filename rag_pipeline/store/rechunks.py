"""Re-chunks under way: the plan each was started with, and when a sensor tick or a run last
worked on it (sql/024_rechunks.sql)."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg.types.json import Jsonb

from rag_pipeline.store import pages


@dataclass(frozen=True)
class Rechunk:
    signature: str
    planned_pages: int
    rows_written: int
    outdated_pages: int      # pages still cut otherwise now


def record(conn: psycopg.Connection, signature: str, page_count: int, rows_written: int, plan: dict,
           stale_after_s: float) -> bool:
    """The plan of a re-chunk to `signature`. False when a plan for it is recorded already and was
    worked on within `stale_after_s` (by another tick or run: it is kept). A plan left longer (a
    re-chunk to the same signature long ago) is replaced."""
    row = conn.execute(
        "INSERT INTO rechunks (signature, pages, rows_written, plan) VALUES (%s, %s, %s, %s)"
        " ON CONFLICT (signature) DO UPDATE SET planned_at = now(), seen_at = now(), pages = excluded.pages,"
        "   rows_written = excluded.rows_written, plan = excluded.plan"
        " WHERE rechunks.seen_at <= now() - make_interval(secs => %s) RETURNING 1",
        (signature, page_count, rows_written, Jsonb(plan), stale_after_s)).fetchone()
    return row is not None


def recorded(conn: psycopg.Connection, signature: str, within_s: float) -> dict | None:
    """The plan of the re-chunk to `signature` under way (worked on within `within_s`)."""
    row = conn.execute("SELECT plan FROM rechunks WHERE signature = %s"
                       " AND seen_at > now() - make_interval(secs => %s)", (signature, within_s)).fetchone()
    return None if row is None else row[0]


def seen(conn: psycopg.Connection, signature: str) -> None:
    """A re-chunk to `signature` is being worked on now."""
    conn.execute("UPDATE rechunks SET seen_at = now() WHERE signature = %s", (signature,))


def under_way(conn: psycopg.Connection, within_s: float) -> list[Rechunk]:
    """The re-chunks something worked on within `within_s`, with the pages each has left (one
    count over the live pages per re-chunk; the sensor's tick reads it)."""
    rows = conn.execute(
        "SELECT r.signature, r.pages, r.rows_written,"
        f" (SELECT count(*) FROM pages p WHERE {pages.chunked_otherwise('r.signature', 'p')})"
        " FROM rechunks r WHERE r.seen_at > now() - make_interval(secs => %s) ORDER BY r.planned_at",
        (within_s,)).fetchall()
    return [Rechunk(*row) for row in rows]
