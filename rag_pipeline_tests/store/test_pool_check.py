"""A pooled connection that the server dropped (a restart, an administrator's terminate) is never
handed out: the next user gets a live one, not `AdminShutdown` on its first statement."""

from __future__ import annotations

import psycopg

from rag_pipeline.store import db


def test_a_connection_the_server_dropped_is_replaced_before_it_is_used(database_url):
    with db.connection(database_url) as conn:
        pid = conn.info.backend_pid           # back in the pool, idle
    with psycopg.connect(database_url, autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone()[0]
    with db.connection(database_url) as conn:
        assert conn.execute("SELECT 1").fetchone()[0] == 1
        assert conn.info.backend_pid != pid
    db.close_pools(database_url)
