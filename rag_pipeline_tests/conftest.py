"""Shared fixtures: one real PostgreSQL+pgvector per test session, a fresh database per test."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from rag_pipeline.settings import get_settings
from rag_pipeline.store import db, embedded, schema


# The longest test files (`make test PYTEST_ADDOPTS=--durations=40`), longest first, are started
# first: `make test` hands each file whole to one of its workers, and a long file started last would
# leave one worker running it alone while the other is idle.
# Daemon files and CPU-bound fuzz files alternate: three daemon stacks started at once slow each
# other's runs past their waits.
LONG_FILES = (
    "test_daemon_kills.py", "test_fuzz_openapi.py", "test_sites_daemon.py", "test_fuzz.py",
    "test_daemon_batches.py", "test_database_restart.py", "test_make_run_terminal.py", "test_checks.py", "test_adaptive_cadence_e2e.py",
    "test_search_filters.py", "test_chunking.py", "test_bulk_index.py", "test_batches.py",
)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FILES)))


@pytest.fixture(scope="session")
def pg_server_url():
    """TEST_DATABASE_URL (any server with pgvector and CREATEDB), else a throwaway embedded server."""
    external = os.environ.get("TEST_DATABASE_URL")
    if external:
        yield external
        return
    pgdata = Path(tempfile.mkdtemp(prefix="rag-test-pg-"))
    server = embedded.temporary_server(pgdata)
    _require_working_vectors(server.get_uri("postgres"), pgdata / "log")
    _skip_disk_flushes(server.get_uri("postgres"))
    yield server.get_uri("postgres")
    db.close_pools()
    server.cleanup()
    shutil.rmtree(pgdata, ignore_errors=True)


def _skip_disk_flushes(url: str) -> None:
    """A throwaway server need not survive a machine crash: commits still write their WAL before
    they answer (a killed postmaster loses nothing acknowledged), but nothing waits for the disk.
    Thousands of commits a test file (Dagster writes an event a commit) each waited ~1-3 ms."""

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET fsync = off")
        conn.execute("ALTER SYSTEM SET full_page_writes = off")
        conn.execute("SELECT pg_reload_conf()")


def _require_working_vectors(url: str, log_file: Path) -> None:
    """One clear stop instead of a hundred errors when the server's pgvector cannot run here."""
    from rag_pipeline.store import doctor

    report = doctor.diagnose(url, source="the test server", log_file=log_file)
    if not report.ok:
        pytest.exit(f"the embedded server cannot run the tests on this machine: {report.failure}", returncode=3)


@pytest.fixture(scope="session")
def migrated_template(pg_server_url):
    """A database migrated once per test process: each test's fresh database is a copy of it
    (CREATE DATABASE … TEMPLATE: a file copy, about 0.1 s, instead of every migration again)."""
    name = f"rag_template_{uuid.uuid4().hex[:8]}"
    url = db.with_database(pg_server_url, name)
    schema.prepare(url)
    db.close_pools(url)
    yield name
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@contextmanager
def _fresh_database(pg_server_url: str, template: str):
    name = f"t_{uuid.uuid4().hex[:12]}"
    url = db.with_database(pg_server_url, name)
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template)))
    schema.require_current(url)   # the copy is the schema this code expects
    yield url
    db.close_pools(url)
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def database_url(pg_server_url, migrated_template):
    """A fresh, migrated database for one test, dropped afterwards."""
    with _fresh_database(pg_server_url, migrated_template) as url:
        yield url


@pytest.fixture(scope="module")
def module_database_url(pg_server_url, migrated_template):
    """A fresh, migrated database shared by the tests of one module (costly data written once)."""
    with _fresh_database(pg_server_url, migrated_template) as url:
        yield url


@pytest.fixture
def conn(database_url):
    with psycopg.connect(database_url, autocommit=True) as connection:
        from pgvector.psycopg import register_vector

        register_vector(connection)
        yield connection


@pytest.fixture(scope="session", autouse=True)
def _test_network_and_deliveries():
    """Before any fixture of any scope (a module's index is built before its tests' own fixtures):
    the tests' sites are on loopback, as `make run`'s is, so the network guard lets that network
    through (test_guarded_http checks the guard with nothing allowed); and most tests deliver pages
    no push asked for (the receiver's own contract is what they test): test_delivery_trust checks
    that a deployment, where that is off, indexes none of them."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CRAWLER_ALLOW_NETWORKS", "127.0.0.0/8")
        mp.setenv("WEBHOOK_ACCEPT_UNSOLICITED", "true")
        yield


@pytest.fixture(autouse=True)
def _fresh_settings(monkeypatch, tmp_path):
    """Each test reads the environment anew, and never the developer's `.env` or RAG_HOME."""
    monkeypatch.setenv("RAG_HOME", str(tmp_path / "rag_home"))
    for var in ("DATABASE_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL", "EMBEDDING_PROVIDER",
                "EMBEDDING_MODEL", "EMBEDDING_DIMENSIONS", "WEBHOOK_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture
def stack(database_url, tmp_path, monkeypatch):
    """A webhook receiver, the Dagster daemon and its code server on a fresh `dagster` database."""
    from rag_pipeline_tests.daemons import daemon_stack

    dagster_url = db.as_url(db.with_database(database_url, f"dagster_{uuid.uuid4().hex[:8]}"))
    with daemon_stack(database_url, dagster_url, tmp_path, monkeypatch) as parts:
        yield parts
