"""Batches: the lease a sensor took on pages, the run applying them, and its worker's heartbeat."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg


@dataclass(frozen=True)
class OpenBatch:
    batch_key: str
    run_id: str | None
    requested_age_s: float
    heartbeat_age_s: float | None
    pages_held: int


def open_batch(conn: psycopg.Connection, batch_key: str) -> None:
    conn.execute("INSERT INTO batches (batch_key) VALUES (%s) ON CONFLICT DO NOTHING", (batch_key,))


def start(conn: psycopg.Connection, batch_key: str, run_id: str) -> bool:
    """The run's op has started on the batch; False when the batch was already ended (its pages
    were freed because its run looked lost: they may be another batch's now)."""
    row = conn.execute(
        "UPDATE batches SET run_id = %s, heartbeat_at = now(), started_at = now()"
        " WHERE batch_key = %s AND ended_at IS NULL RETURNING 1", (run_id, batch_key)).fetchone()
    return row is not None


def beat(conn: psycopg.Connection, batch_key: str) -> None:
    """The worker is alive (a batch already ended from outside is left as it is)."""
    conn.execute("UPDATE batches SET heartbeat_at = now() WHERE batch_key = %s AND ended_at IS NULL", (batch_key,))


def claim_open(conn: psycopg.Connection, batch_key: str) -> bool:
    """Lock an open batch for this transaction; False when it has ended, or another reconciler
    (another code location's delivery_sensor) holds it now."""
    return conn.execute("SELECT 1 FROM batches WHERE batch_key = %s AND ended_at IS NULL FOR UPDATE SKIP LOCKED",
                        (batch_key,)).fetchone() is not None


def end(conn: psycopg.Connection, batch_key: str, reason: str) -> None:
    conn.execute("UPDATE batches SET ended_at = now(), end_reason = %s WHERE batch_key = %s AND ended_at IS NULL",
                 (reason[:1000], batch_key))


def open_batches(conn: psycopg.Connection) -> list[OpenBatch]:
    """Batches not ended yet, with how many pages each still holds."""
    rows = conn.execute(
        "SELECT b.batch_key, b.run_id, extract(epoch FROM now() - b.requested_at),"
        "       extract(epoch FROM now() - b.heartbeat_at),"
        "       (SELECT count(*) FROM pages p WHERE p.batch_key = b.batch_key AND p.leased_until > now())"
        " FROM batches b WHERE b.ended_at IS NULL ORDER BY b.requested_at"
    ).fetchall()
    return [OpenBatch(r[0], r[1], float(r[2]), None if r[3] is None else float(r[3]), r[4]) for r in rows]


def recent_applied(conn: psycopg.Connection, limit: int = 20) -> list[tuple[float, float, int, int]]:
    """The newest batches applied in full: (started, ended as epoch seconds, pages switched,
    tokens embedded), from the ledger rows of their runs: the measured rates of a plan's time."""
    rows = conn.execute(
        "SELECT extract(epoch FROM b.started_at), extract(epoch FROM b.ended_at), count(l.id),"
        "       coalesce(sum(l.tokens_embedded), 0)"
        " FROM (SELECT * FROM batches WHERE end_reason = 'applied' AND started_at IS NOT NULL"
        "       ORDER BY ended_at DESC LIMIT %s) b"
        " JOIN embedding_ledger l ON l.run_id = b.run_id GROUP BY b.batch_key, b.started_at, b.ended_at",
        (limit,)).fetchall()
    return [(float(s), float(e), int(n), int(t)) for s, e, n, t in rows]
