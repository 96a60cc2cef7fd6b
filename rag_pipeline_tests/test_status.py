"""`rag-pipeline status`: the index, its queue and the last hour, as tables and as JSON."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import dagster as dg
import psycopg
import pytest
from click.testing import CliRunner

from rag_pipeline.cli import main as cli
from rag_pipeline.ingest.routing import route_batch
from rag_pipeline.settings import get_settings
from rag_pipeline.store import db
from rag_pipeline_tests.harness import load_defs
from rag_pipeline_tests.ingest.pagework import MAX, CountingEmbedder, doc, index, put


def test_status_reports_pages_queue_last_hour_and_cost(conn, database_url, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("EMBEDDING_PROVIDER", "hash")
    get_settings.cache_clear()
    embedder = CountingEmbedder()
    for n in range(2):
        put(conn, f"https://example.com/s{n}", doc(2, tag=str(n)))
    route_batch(conn, 100, MAX)
    switched = [index(conn, f"https://example.com/s{n}", embedder) for n in range(2)]
    put(conn, "https://example.com/s0", doc(2, tag="0"))              # a recrawl, unchanged
    route_batch(conn, 100, MAX)
    put(conn, "https://example.com/waiting", "# Waiting\n\nNot routed yet.")
    conn.execute("UPDATE deliveries SET received_at = now() - interval '90 minutes' WHERE processed_at IS NULL")

    shown = CliRunner().invoke(cli, ["status", "--json"])
    assert shown.exit_code == 0, shown.output
    report = json.loads(shown.output)
    assert report["pages"] == {"indexed": 2, "tombstoned": 0, "pending": 0}
    assert report["queue"]["unrouted"] == 1 and report["queue"]["queued"] == 0
    assert 89 <= report["queue"]["oldest_waiting_minutes"] <= 95
    assert report["last_hour"]["deliveries"] == {"embedded": 2, "unchanged": 1}
    tokens = sum(s.tokens_embedded for s in switched)
    assert report["last_hour"]["embedding"]["tokens_embedded"] == report["embedding"]["tokens_embedded"] == tokens > 0
    assert report["chunks"] == sum(s.chunks_total for s in switched)

    table = CliRunner().invoke(cli, ["status"])
    assert table.exit_code == 0, table.output
    lines = [" ".join(line.split()) for line in table.output.splitlines()]
    for title in ("pages", "queue", "last hour", "all time"):
        assert title in lines
    assert "unrouted 1" in lines and "unchanged 1" in lines and f"tokens embedded {tokens:,}" in lines


@pytest.fixture
def dagster_storage(pg_server_url):
    """A database of its own for a Dagster instance's storage, dropped afterwards."""
    name = f"t_dagster_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
        yield db.with_database(pg_server_url, name)
        admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


def test_status_names_the_failing_checks_from_the_dagster_instance(conn, database_url, dagster_storage,
                                                                  monkeypatch, tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(Path(__file__).parents[1] / "deploy" / "dagster.yaml", home / "dagster.yaml")    # the instance make run uses
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("DAGSTER_POSTGRES_URL", dagster_storage)
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("EMBEDDING_PROVIDER", "hash")
    get_settings.cache_clear()
    put(conn, "https://example.com/gone", doc(2, tag="gone"))
    route_batch(conn, 100, MAX)
    index(conn, "https://example.com/gone", CountingEmbedder())
    conn.execute("UPDATE pages SET deleted_at = now()")     # a tombstone that kept its chunks
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert load_defs().resolve_job_def("index_checks").execute_in_process(instance=instance).success

    shown = CliRunner().invoke(cli, ["status", "--json"])
    assert shown.exit_code == 0, shown.output
    checks = json.loads(shown.output)["checks"]
    assert checks["instance"] == str(home)
    (failing,) = checks["failing"]
    assert failing["check"] == "index:no_chunk_of_a_tombstoned_page" and failing["state"] == "failed"
    assert failing["severity"] == "ERROR" and "https://example.com/gone" in failing["description"]
    assert 0 <= failing["minutes_ago"] < 5
    assert checks["passed"] == 6    # the other index checks; the crawler's have their own schedule
    assert "index:pushes_delivered" in checks["not_evaluated"]

    table = CliRunner().invoke(cli, ["status"])
    lines = [" ".join(line.split()) for line in table.output.splitlines()]
    assert any(line.startswith("checks: 1 failing, 6 passing, not evaluated yet:") for line in lines), lines
    assert "failing checks" in lines
    assert any(line.startswith("index:no_chunk_of_a_tombstoned_page ERROR") for line in lines), lines


def test_status_says_where_it_looked_for_checks_when_there_is_no_instance(conn, database_url, monkeypatch,
                                                                         tmp_path):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "nowhere"))
    monkeypatch.setenv("DATABASE_URL", database_url)
    get_settings.cache_clear()
    shown = CliRunner().invoke(cli, ["status"])
    assert shown.exit_code == 0, shown.output
    assert f"checks: {tmp_path / 'nowhere'}: no Dagster instance there (no dagster.yaml): `make run` makes it" \
        in " ".join(shown.output.split())
