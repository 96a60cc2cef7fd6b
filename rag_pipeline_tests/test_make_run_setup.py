"""`make run`'s set-up (scripts/setup.sh) against a server of the user's own, reached only through DATABASE_URL."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import dagster as dg
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from rag_pipeline.store import db, embedded, schema

CHECKOUT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def users_server():
    """A second embedded server standing in for the user's own PostgreSQL."""
    pgdata = Path(tempfile.mkdtemp(prefix="rag-users-pg-")) / "pgdata"
    server = embedded.temporary_server(pgdata)
    yield server
    server.cleanup()
    shutil.rmtree(pgdata.parent, ignore_errors=True)


@pytest.mark.parametrize("form", ["url", "keywords"])
def test_setup_with_database_url_only(users_server, tmp_path, form, monkeypatch):
    url = users_server.get_uri("rag_" + form)
    database_url = url if form == "url" else make_conninfo(**conninfo_to_dict(url))
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in ("WEBHOOK_TOKEN", "QUERY_API_TOKEN", "DAGSTER_HOME", "DAGSTER_POSTGRES_URL")}
    env.update(DATABASE_URL=database_url, RAG_HOME=str(home), BIN=str(Path(sys.executable).parent))
    script = 'set -euo pipefail; source scripts/setup.sh; echo "DAGSTER_POSTGRES_URL=$DAGSTER_POSTGRES_URL"'
    done = subprocess.run(["bash", "-c", script], cwd=CHECKOUT, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr

    dagster_url = done.stdout.strip().splitlines()[-1].removeprefix("DAGSTER_POSTGRES_URL=")
    assert dagster_url.startswith("postgresql://") and conninfo_to_dict(dagster_url)["dbname"] == "dagster"
    # dagster-postgres builds its schema there; the instance make run configures runs one push
    # run at a time (a run tag limit in deploy/dagster.yaml, nothing set by a shell command).
    monkeypatch.setenv("DAGSTER_POSTGRES_URL", dagster_url)
    with dg.DagsterInstance.from_config(str(home / "dagster_home")) as instance:
        limits = instance.get_concurrency_config().run_queue_config.tag_concurrency_limits
    with psycopg.connect(dagster_url) as conn:
        assert conn.execute("SELECT to_regclass('runs') IS NOT NULL").fetchone()[0]
    assert {"key": "rag/kind", "value": "push", "limit": 1} in limits
    with psycopg.connect(db.with_database(url, "rag_" + form)) as conn:
        assert conn.execute("SELECT count(*) FROM schema_migrations").fetchone()[0] == len(schema.migration_files())
    assert not (home / "pgdata").exists(), "the embedded server must not start when DATABASE_URL is set"
    assert (home / "webhook_token").read_text().strip()
    assert (home / "query_api_token").read_text().strip() != (home / "webhook_token").read_text().strip()
    assert (home / "query_api_token").stat().st_mode & 0o077 == 0   # the owner's only
