"""QUERY_STATEMENT_TIMEOUT_S bounds the queries of a search, never silently nothing: not a value
rounded down to 0 ms (PostgreSQL's "no timeout"), not the plain pool of the same URL, and not the
set-up of a connection (registering the vector types), which would leave the pool empty."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pgvector.psycopg
import pytest

from rag_pipeline.settings import SettingsError, load_settings
from rag_pipeline.store import db

BIN = Path(sys.executable).parent


@pytest.mark.parametrize("value", ["0.0004", "0.0009999"])
def test_a_timeout_below_a_millisecond_is_refused_naming_the_variable(value, monkeypatch):
    monkeypatch.setenv("QUERY_STATEMENT_TIMEOUT_S", value)
    with pytest.raises(SettingsError, match=r"^bad setting QUERY_STATEMENT_TIMEOUT_S="):
        load_settings()


def test_the_cli_says_so_in_one_line(monkeypatch, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "RAG_HOME": str(tmp_path), "QUERY_STATEMENT_TIMEOUT_S": "0.0001"}
    done = subprocess.run([str(BIN / "rag-pipeline"), "search", "anything"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().startswith("Error: bad setting QUERY_STATEMENT_TIMEOUT_S='0.0001'")
    assert len(done.stderr.strip().splitlines()) == 1


def test_milliseconds_are_rounded_up_never_to_zero():
    assert db.statement_timeout_ms(0.001) == 1
    assert db.statement_timeout_ms(0.0015) == 2
    assert db.statement_timeout_ms(10) == 10_000
    with pytest.raises(ValueError):
        db.statement_timeout_ms(0)


def _shown(conn) -> str:
    return conn.execute("SHOW statement_timeout").fetchone()[0]


def test_a_timed_pool_is_not_the_plain_pool_of_the_same_url(database_url):
    with db.connection(database_url) as plain:      # the URL's plain pool, opened first
        assert _shown(plain) == "0"
    with db.get_pool(database_url, statement_timeout_s=0.25).connection(timeout=10) as timed:
        assert _shown(timed) == "250ms"
    with db.connection(database_url) as plain:
        assert _shown(plain) == "0"


def test_the_set_up_runs_without_the_timeout_and_the_queries_with_it(database_url, monkeypatch):
    """A set-up slower than the timeout (here 0.3 s against 0.1 s, as registering the types on a
    busy catalog may be) still gives a connection, and that connection's queries are bounded."""
    real = pgvector.psycopg.register_vector
    seen = []

    def slow_registration(conn):
        seen.append(_shown(conn))
        conn.execute("SELECT pg_sleep(0.3)")
        real(conn)

    monkeypatch.setattr(pgvector.psycopg, "register_vector", slow_registration)
    with db.get_pool(database_url, statement_timeout_s=0.1).connection(timeout=10) as conn:
        assert seen and seen[0] == "0"
        assert _shown(conn) == "100ms"
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("SELECT pg_sleep(1)")
