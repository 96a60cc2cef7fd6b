"""The index as a whole at one moment, and what happened to it over a period: the figures the
`index` asset records (plotted by Dagster over time)."""

from __future__ import annotations

from datetime import datetime

import psycopg

from rag_pipeline.store.status import chunk_count

OUTCOMES = ("embedded", "unchanged", "deleted", "skipped", "superseded", "failed", "refused", "unsolicited")


def snapshot(conn: psycopg.Connection, since: datetime, until: datetime) -> dict[str, float | int]:
    """State now, and the period [since, until): deliveries by outcome, tokens embedded, tokens
    avoided by the hash gate (an unchanged page's chunks, not embedded again) and by vector reuse.
    Periods that follow one another count every event once."""
    live, tombstoned, aliases, p50, p95 = conn.execute(
        "SELECT count(*) FILTER (WHERE deleted_at IS NULL AND alias_of IS NULL AND indexed_hash IS NOT NULL),"
        " count(*) FILTER (WHERE deleted_at IS NOT NULL),"
        " count(*) FILTER (WHERE alias_of IS NOT NULL),"
        " percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM now() - last_verified_at))"
        "   FILTER (WHERE deleted_at IS NULL AND alias_of IS NULL AND last_verified_at IS NOT NULL),"
        " percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM now() - last_verified_at))"
        "   FILTER (WHERE deleted_at IS NULL AND alias_of IS NULL AND last_verified_at IS NOT NULL)"
        " FROM pages"
    ).fetchone()
    chunks = chunk_count(conn)
    vectors = conn.execute("SELECT count(*) FROM vectors").fetchone()[0]
    outcomes = dict(conn.execute(
        "SELECT outcome, count(*) FROM deliveries WHERE outcome = ANY(%s)"
        " AND coalesce(applied_at, processed_at) >= %s AND coalesce(applied_at, processed_at) < %s GROUP BY outcome",
        (list(OUTCOMES), since, until),
    ).fetchall())
    embedded, reused = conn.execute(
        "SELECT coalesce(sum(tokens_embedded), 0), coalesce(sum(tokens_reused), 0) FROM embedding_ledger"
        " WHERE recorded_at >= %s AND recorded_at < %s", (since, until),
    ).fetchone()
    gated = conn.execute(
        "SELECT coalesce(sum(t.tokens), 0) FROM deliveries d"
        " JOIN pages p ON p.url = d.page_url"
        " CROSS JOIN LATERAL (SELECT sum(token_count) AS tokens FROM chunks c WHERE c.page_id = p.page_id) t"
        " WHERE d.outcome = 'unchanged' AND d.applied_at >= %s AND d.applied_at < %s", (since, until),
    ).fetchone()[0]
    figures: dict[str, float | int] = {
        "pages_live": live, "pages_tombstoned": tombstoned, "aliases": aliases, "chunks": chunks,
        "vectors_cached": vectors,
        **{f"deliveries_{'tombstoned' if o == 'deleted' else o}": outcomes.get(o, 0) for o in OUTCOMES},
        "tokens_embedded": int(embedded), "tokens_avoided_by_hash_gate": int(gated),
        "tokens_avoided_by_reuse": int(reused),
        "verified_age_p50_minutes": round(float(p50) / 60, 1) if p50 is not None else 0.0,
        "verified_age_p95_minutes": round(float(p95) / 60, 1) if p95 is not None else 0.0,
    }
    return figures


def first_delivery_at(conn: psycopg.Connection) -> datetime | None:
    """When the oldest delivery kept arrived: where the first snapshot's period starts."""
    row = conn.execute("SELECT received_at FROM deliveries ORDER BY id LIMIT 1").fetchone()
    return row[0] if row else None


def any_switched(conn: psycopg.Connection) -> bool:
    """Whether any page switch happened yet (the ledger records every one)."""
    return conn.execute("SELECT EXISTS (SELECT 1 FROM embedding_ledger)"
                        " OR EXISTS (SELECT 1 FROM embedding_ledger_daily)").fetchone()[0]
