"""What one run did to the index, read back from the ledger: the line `make run` prints a batch."""

from __future__ import annotations

import psycopg


def switched_by_run(conn: psycopg.Connection, run_id: str) -> tuple[int, int]:
    """(pages switched, tokens sent to the model) by the run ``run_id``: the ledger has a row a
    page switch, with the run that made it. Read once a batch run ends, before any roll-up."""
    pages, tokens = conn.execute(
        "SELECT count(*), coalesce(sum(tokens_embedded), 0) FROM embedding_ledger WHERE run_id = %s",
        (run_id,)).fetchone()
    return int(pages), int(tokens)
