"""What `rag-pipeline status` reports: the index's state, its queue, and what embedding cost."""

from __future__ import annotations

import psycopg

LEDGER_FIELDS = ("chunks_switched", "chunks_embedded", "tokens_embedded", "tokens_reused", "requests")


def ledger_totals(conn: psycopg.Connection, since_minutes: int | None = None) -> dict[str, int]:
    """Page switches' ledger summed, over all time or the last ``since_minutes``."""
    # Over all time, the rows rolled up into daily totals (store/growth.py) count too.
    row = conn.execute(
        "SELECT coalesce(sum(chunks_total), 0), coalesce(sum(chunks_embedded), 0), coalesce(sum(tokens_embedded), 0),"
        " coalesce(sum(tokens_reused), 0), coalesce(sum(requests), 0) FROM ("
        "  SELECT chunks_total, chunks_embedded, tokens_embedded, tokens_reused, requests FROM embedding_ledger"
        "  WHERE %(since)s::integer IS NULL OR recorded_at >= now() - make_interval(mins => %(since)s::integer)"
        "  UNION ALL SELECT chunks_total, chunks_embedded, tokens_embedded, tokens_reused, requests"
        "  FROM embedding_ledger_daily WHERE %(since)s::integer IS NULL) rows",
        {"since": since_minutes},
    ).fetchone()
    return dict(zip(LEDGER_FIELDS, (int(v) for v in row)))


def outcomes_since(conn: psycopg.Connection, minutes: int) -> dict[str, int]:
    """Deliveries settled or queued in the last ``minutes``, by outcome (the time it was routed,
    or applied)."""
    rows = conn.execute(
        "SELECT outcome, count(*) FROM deliveries WHERE outcome IS NOT NULL"
        " AND coalesce(applied_at, processed_at) >= now() - make_interval(mins => %s) GROUP BY outcome",
        (minutes,),
    ).fetchall()
    return {outcome: n for outcome, n in sorted(rows)}


def queue(conn: psycopg.Connection) -> dict[str, float | int | None]:
    """Deliveries not applied yet: unrouted, queued for a run, failed and waiting for a retry."""
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE processed_at IS NULL),"
        " count(*) FILTER (WHERE outcome = 'queued'),"
        " count(*) FILTER (WHERE outcome = 'failed' AND retry_at IS NOT NULL),"
        " count(*) FILTER (WHERE outcome = 'failed' AND retry_at IS NULL),"
        " extract(epoch FROM now() - min(received_at)) / 60"
        " FROM deliveries WHERE processed_at IS NULL OR outcome IN ('queued', 'failed')"
    ).fetchone()
    return {"unrouted": row[0], "queued": row[1], "failed_retrying": row[2], "failed_for_good": row[3],
            "oldest_waiting_minutes": round(float(row[4]), 1) if row[4] is not None else None}


def chunk_count(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
