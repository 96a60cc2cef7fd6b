"""Invariants of the index, as queries: each returns the offending rows (a few, for the message)."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg


@dataclass(frozen=True)
class Finding:
    count: int
    examples: list[str]


def _finding(conn: psycopg.Connection, count_sql: str, examples_sql: str, params: tuple = ()) -> Finding:
    count = conn.execute(count_sql, params).fetchone()[0]
    examples = [str(r[0]) for r in conn.execute(examples_sql, params).fetchall()] if count else []
    return Finding(count, examples)


def stuck_deliveries(conn: psycopg.Connection, grace_minutes: int) -> Finding:
    """Deliveries not routed, or routed to a run that never applied them, for too long."""
    where = (" FROM deliveries WHERE (processed_at IS NULL OR outcome IN ('queued', 'failed'))"
             " AND received_at < now() - make_interval(mins => %s)")
    return _finding(conn, "SELECT count(*)" + where,
                    "SELECT rid || ' ' || coalesce(outcome, 'unrouted') || ' ' || url" + where
                    + " ORDER BY id LIMIT 10", (grace_minutes,))


@dataclass(frozen=True)
class Progress:
    """The delivery queue over a window: what waits, since when, and what was settled."""

    waiting: int
    oldest_minutes: float | None
    settled: int          # deliveries applied (embedded, unchanged, tombstoned) or routed away


def queue_progress(conn: psycopg.Connection, window_minutes: int) -> Progress:
    from rag_pipeline.store.status import queue

    waiting = queue(conn)
    settled = conn.execute(
        "SELECT count(*) FROM deliveries WHERE coalesce(applied_at, processed_at) >= now() - make_interval(mins => %s)"
        " AND (applied_at IS NOT NULL OR outcome IN ('skipped', 'superseded', 'refused', 'unsolicited'))",
        (window_minutes,),
    ).fetchone()[0]
    return Progress(waiting["unrouted"] + waiting["queued"] + waiting["failed_retrying"] + waiting["failed_for_good"],
                    waiting["oldest_waiting_minutes"], settled)


def latest_page_error(conn: psycopg.Connection) -> str | None:
    """Why the most recently failed page failed, as its delivery records it."""
    row = conn.execute(
        "SELECT error FROM deliveries WHERE error IS NOT NULL AND outcome IN ('queued', 'failed')"
        " ORDER BY id DESC LIMIT 1"
    ).fetchone()
    return row[0] if row else None


def pages_switched_by(conn: psycopg.Connection, run_ids: list[str]) -> int:
    return conn.execute("SELECT count(*) FROM embedding_ledger WHERE run_id = ANY(%s)", (run_ids,)).fetchone()[0]


#: A partition set: (site, shard) as pages store it; (None, None) is the catch-all's.
PageSet = tuple[str | None, int | None]


def _by_set(conn: psycopg.Connection, sql: str, params: tuple, sets: list[PageSet] | None) -> dict[PageSet, Finding]:
    """A grouped invariant, one row per partition set with offenders. `sql` holds `{sets}` where the
    set filter goes: with `sets`, only those are read and each is in the answer (a count of 0 where
    nothing offends); None reads every set and answers those with offenders."""
    if sets is None:
        rows = conn.execute(sql.format(sets="TRUE"), params).fetchall()
    else:
        rows = conn.execute(sql.format(sets=_IN_SETS), (*params, [s for s, _ in sets], [h for _, h in sets])).fetchall()
    found = {(site, shard): Finding(count, [str(u) for u in examples or []]) for site, shard, count, examples in rows}
    return found if sets is None else {s: found.get(s, Finding(0, [])) for s in sets}


# Only the sets asked for are read: `(site, shard)` matched NULL-safely (the catch-all has neither).
_IN_SETS = ("EXISTS (SELECT 1 FROM unnest(%s::text[], %s::int[]) AS s(site, shard)"
            " WHERE p.site IS NOT DISTINCT FROM s.site AND p.shard IS NOT DISTINCT FROM s.shard)")


def pages_behind_source_by_set(conn: psycopg.Connection, grace_minutes: int,
                               sets: list[PageSet] | None) -> dict[PageSet, Finding]:
    """`pages_behind_source` of each partition set, in one statement."""
    return _by_set(conn, (
        "SELECT p.site, p.shard, count(*), (array_agg(p.url ORDER BY p.last_crawled_at))[1:5]"
        " FROM pages p WHERE p.deleted_at IS NULL AND p.source_hash IS NOT NULL"
        " AND p.indexed_hash IS DISTINCT FROM p.source_hash"
        " AND p.last_crawled_at < now() - make_interval(mins => %s) AND {sets}"
        " GROUP BY p.site, p.shard"), (grace_minutes,), sets)


def chunks_of_tombstoned_pages_by_set(conn: psycopg.Connection, sets: list[PageSet] | None) -> dict[PageSet, Finding]:
    """`chunks_of_tombstoned_pages` of each partition set, in one statement."""
    return _by_set(conn, (
        "SELECT p.site, p.shard, count(*), (array_agg(DISTINCT p.url))[1:5]"
        " FROM chunks c JOIN pages p USING (page_id) WHERE p.deleted_at IS NOT NULL AND {sets}"
        " GROUP BY p.site, p.shard"), (), sets)


def chunks_outside_active_space_by_set(conn: psycopg.Connection,
                                       sets: list[PageSet] | None) -> dict[PageSet, Finding]:
    """`chunks_outside_active_space` of each partition set, in one statement."""
    return _by_set(conn, (
        "SELECT p.site, p.shard, count(*), (array_agg(DISTINCT p.url))[1:5]"
        " FROM chunks c JOIN pages p USING (page_id)"
        " WHERE NOT EXISTS (SELECT 1 FROM space_vectors v JOIN embedding_spaces s"
        "   ON s.space_id = v.space_id AND s.status = 'active'"
        "   WHERE v.chunk_id = c.chunk_id AND v.embed_hash = c.embed_hash) AND {sets}"
        " GROUP BY p.site, p.shard"), (), sets)
