"""Search indexes dropped and built again around bulk loads (the active space's HNSW index, the
GIN index of lexical search): their state, and a concurrent drop or build with session settings
that go back with the pooled connection."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql

from rag_pipeline.store import db

log = logging.getLogger(__name__)


def state(conn: psycopg.Connection, name: str) -> str:
    """'valid', 'invalid' (a concurrent build under way, or one that failed half-way) or 'missing'."""
    row = conn.execute("SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                       " WHERE c.relname = %s", (name,)).fetchone()
    return "missing" if row is None else ("valid" if row[0] else "invalid")


@contextmanager
def _session(conn: psycopg.Connection, **settings: str | None) -> Iterator[None]:
    """Session settings for the statements inside, RESET afterwards: a pooled connection goes
    back as it came. A RESET that fails (the connection broke) never hides the error it follows."""
    given = {name: value for name, value in settings.items() if value is not None}
    for name, value in given.items():
        conn.execute("SELECT set_config(%s, %s, false)", (name, value))
    try:
        yield
    finally:
        for name in given:
            try:
                conn.execute(sql.SQL("RESET {}").format(sql.Identifier(name)))
            except psycopg.OperationalError:
                if sys.exc_info()[0] is None:
                    raise


def drop_concurrently(conn: psycopg.Connection, name: str, lock_timeout: str | None = None) -> None:
    """CONCURRENTLY: writes in flight are waited for, never blocked. With `lock_timeout`, each wait
    (for the table's lock, then for the transactions open on it) gives up after that long
    (psycopg.errors.LockNotAvailable) instead of holding the caller; the index may then be left
    invalid, which the next drop or build clears."""
    db.require_autocommit(conn, "DROP INDEX CONCURRENTLY")
    with _session(conn, lock_timeout=lock_timeout):
        conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(name)))


def build_concurrently(conn: psycopg.Connection, name: str, create: sql.Composable, maintenance_work_mem: str,
                       parallel_workers: int | None = None) -> None:
    """Run ``create`` (a CREATE INDEX CONCURRENTLY of ``name``) once what a failed build left is
    gone; writers go on meanwhile."""
    db.require_autocommit(conn, "CREATE INDEX CONCURRENTLY")
    if state(conn, name) == "invalid":
        drop_concurrently(conn, name)
    workers = None if parallel_workers is None else str(parallel_workers)
    with _session(conn, maintenance_work_mem=maintenance_work_mem, max_parallel_maintenance_workers=workers):
        try:
            conn.execute(create)
        except (psycopg.errors.DiskFull, psycopg.errors.OutOfMemory) as exc:
            # A parallel build reserves all of maintenance_work_mem in the server's shared memory
            # (/dev/shm: 64MB in a default container); a serial build needs none of it.
            if parallel_workers == 0 or "shared memory" not in str(exc):
                raise
            log.warning("parallel build of %s found too little shared memory (%s): building it serially", name, exc)
            drop_concurrently(conn, name)
            with _session(conn, max_parallel_maintenance_workers="0"):
                conn.execute(create)
