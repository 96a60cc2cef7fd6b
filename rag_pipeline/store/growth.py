"""The two things that would otherwise grow with every switch and every model change: the ledger,
whose rows older than LEDGER_RETENTION_DAYS roll up into one row a day and space (the totals stay
exact, `status` and the `index` asset read both), and a retired space's vector table with its HNSW
index, dropped RETIRED_SPACE_RETENTION_DAYS after the space was retired unless an operator keeps it.

A retired table is never read again: search reads the active space, and a switch back to that
model builds its table anew from the cached vectors (which `vectors` retention keeps apart)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg import sql

from rag_pipeline.store import db


def roll_up_ledger(conn: psycopg.Connection, before: datetime, *, batch_size: int,
                   dry_run: bool) -> tuple[int, int]:
    """Ledger rows recorded before ``before`` summed into `embedding_ledger_daily` and deleted, a
    range of ``batch_size`` rows a transaction (the same rows move and go in one). Returns (rows,
    transactions); a dry run counts them."""
    db.require_autocommit(conn, "a ledger roll-up")
    if dry_run:
        return conn.execute("SELECT count(*) FROM embedding_ledger WHERE recorded_at < %s",
                            (before,)).fetchone()[0], 0
    rows = transactions = 0
    while True:
        with conn.transaction():
            moved = conn.execute(
                "WITH gone AS (DELETE FROM embedding_ledger WHERE id IN ("
                "   SELECT id FROM embedding_ledger WHERE recorded_at < %s ORDER BY id LIMIT %s)"
                "  RETURNING recorded_at, space_id, chunks_total, chunks_embedded, tokens_embedded,"
                "            tokens_reused, requests),"
                " summed AS (INSERT INTO embedding_ledger_daily AS d (day, space_id, switches, chunks_total,"
                "   chunks_embedded, tokens_embedded, tokens_reused, requests)"
                "  SELECT (recorded_at AT TIME ZONE 'UTC')::date, space_id, count(*), sum(chunks_total),"
                "         sum(chunks_embedded), sum(tokens_embedded), sum(tokens_reused), sum(requests)"
                "  FROM gone GROUP BY 1, 2"
                "  ON CONFLICT (day, space_id) DO UPDATE SET switches = d.switches + excluded.switches,"
                "   chunks_total = d.chunks_total + excluded.chunks_total,"
                "   chunks_embedded = d.chunks_embedded + excluded.chunks_embedded,"
                "   tokens_embedded = d.tokens_embedded + excluded.tokens_embedded,"
                "   tokens_reused = d.tokens_reused + excluded.tokens_reused,"
                "   requests = d.requests + excluded.requests)"
                " SELECT count(*) FROM gone", (before, batch_size), prepare=False).fetchone()[0]
        if not moved:
            return rows, transactions
        rows, transactions = rows + moved, transactions + 1


@dataclass(frozen=True)
class RetiredTable:
    space_id: int
    model: str
    dimensions: int
    retired_at: datetime


def drop_retired_tables(conn: psycopg.Connection, before: datetime, *, dry_run: bool) -> list[RetiredTable]:
    """Drop the vector table of each space retired before ``before`` and not kept; returns them."""
    due = [RetiredTable(*r) for r in conn.execute(
        "SELECT space_id, model, dimensions, retired_at FROM embedding_spaces WHERE status = 'retired'"
        " AND NOT keep_table AND table_dropped_at IS NULL AND retired_at < %s ORDER BY space_id",
        (before,)).fetchall()]
    for space in [] if dry_run else due:
        with conn.transaction():
            # Re-checked under the row lock: a build of that model since the read makes it 'building'.
            still = conn.execute(
                "SELECT 1 FROM embedding_spaces WHERE space_id = %s AND status = 'retired' AND NOT keep_table"
                " FOR UPDATE", (space.space_id,)).fetchone()
            if still is None:
                continue
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(f"space_vectors_{space.space_id}")))
            conn.execute("UPDATE embedding_spaces SET table_dropped_at = now() WHERE space_id = %s",
                         (space.space_id,))
    return due


class NoSuchSpace(LookupError):
    pass


def keep_table(conn: psycopg.Connection, space_id: int, keep: bool) -> tuple[str, datetime | None]:
    """Keep (or stop keeping) a retired space's table past its retention; returns the space's
    status and when its table was dropped (None: it is there)."""
    row = conn.execute("UPDATE embedding_spaces SET keep_table = %s WHERE space_id = %s"
                       " RETURNING status, table_dropped_at", (keep, space_id)).fetchone()
    if row is None:
        raise NoSuchSpace(f"no embedding space {space_id} (`rag-pipeline space list` lists them)")
    return row[0], row[1]


def retired_tables(conn: psycopg.Connection) -> dict[int, tuple[datetime | None, bool, datetime | None]]:
    """Each retired space: (retired_at, kept, table_dropped_at), for `space list`."""
    return {r[0]: (r[1], r[2], r[3]) for r in conn.execute(
        "SELECT space_id, retired_at, keep_table, table_dropped_at FROM embedding_spaces WHERE status = 'retired'")}
