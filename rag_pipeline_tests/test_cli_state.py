"""The CLI finds its own state wherever it runs, and a read never creates an index."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from rag_pipeline.cli import main
from rag_pipeline.settings import Settings, get_settings
from rag_pipeline.store import db, schema

CHECKOUT = Path(__file__).resolve().parents[1]

READS = [
    ["search", "how do I rotate the token?"],
    ["ask", "how do I rotate the token?"],
    ["status"],
    ["cadence", "show", "https://docs.example.com/a"],
    ["backfill", "plan"],
    ["space", "list"],
]


def test_default_home_is_the_checkouts_whatever_the_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("RAG_HOME")
    monkeypatch.chdir(tmp_path)
    settings = Settings()
    assert settings.rag_home == CHECKOUT / ".rag"
    assert settings.rag_home_source() == "default: the checkout's .rag"


def test_relative_home_is_fixed_where_it_was_given(monkeypatch, tmp_path):
    monkeypatch.setenv("RAG_HOME", "state")
    monkeypatch.chdir(tmp_path)
    assert Settings().rag_home == tmp_path / "state"


@pytest.mark.parametrize("args", READS, ids=lambda a: " ".join(a[:2]))
def test_read_on_a_missing_embedded_index_creates_nothing(monkeypatch, tmp_path, args):
    home = tmp_path / "elsewhere"
    monkeypatch.setenv("RAG_HOME", str(home))
    monkeypatch.setenv("ANSWER_API_KEY", "sk-test")  # `ask` gets past its chat check to the database
    get_settings.cache_clear()
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert f"no index at {home / 'pgdata'}" in lines[0] and "RAG_HOME" in lines[0]
    assert not (home / "pgdata").exists()


def test_read_through_database_url_never_creates_the_database(monkeypatch, pg_server_url):
    name = f"t_missing_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("DATABASE_URL", db.with_database(pg_server_url, name))
    get_settings.cache_clear()
    result = CliRunner().invoke(main, ["status"])
    assert result.exit_code == 1
    assert "no index database on DATABASE_URL" in result.output and name in result.output
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        assert conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None


def test_bad_setting_is_one_line_naming_variable_and_allowed_values(monkeypatch):
    monkeypatch.setenv("CHUNK_MAX_TOKENS", "10")
    monkeypatch.setenv("EMBEDDING_PROVIDER", "bogus")
    get_settings.cache_clear()
    result = CliRunner().invoke(main, ["status"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    assert "CHUNK_MAX_TOKENS='10': Input should be greater than or equal to 32" in lines[0]
    assert "EMBEDDING_PROVIDER='bogus': Input should be 'openai', 'local' or 'hash'" in lines[0]


def test_a_heartbeat_timeout_shorter_than_two_beats_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("BATCH_HEARTBEAT_S", "40")
    monkeypatch.setenv("BATCH_HEARTBEAT_TIMEOUT_S", "60")
    get_settings.cache_clear()
    result = CliRunner().invoke(main, ["status"])
    get_settings.cache_clear()
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert "BATCH_HEARTBEAT_TIMEOUT_S (60) must be at least twice BATCH_HEARTBEAT_S (40)" in result.output


def test_a_database_without_the_current_schema_is_refused_with_what_to_run(monkeypatch, pg_server_url):
    import dagster as dg

    from rag_pipeline.defs.resources import PostgresResource

    name = f"t_bare_{uuid.uuid4().hex[:8]}"
    url = db.with_database(pg_server_url, name)
    db.ensure_database(url)
    try:
        monkeypatch.setenv("DATABASE_URL", url)
        get_settings.cache_clear()
        result = CliRunner().invoke(main, ["status"])
        assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
        assert "has no schema yet: run `rag-pipeline db migrate`" in result.output
        # A Dagster run or sensor says the same when its resource starts, and migrates nothing.
        with pytest.raises(dg.DagsterResourceFunctionError) as raised:
            with dg.build_resources({"postgres": PostgresResource()}):
                pass
        assert isinstance(raised.value.__cause__, schema.SchemaOutdated)
        assert "run `rag-pipeline db migrate`" in str(raised.value.__cause__)
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT to_regclass('pages')").fetchone()[0] is None
        migrated = CliRunner().invoke(main, ["db", "migrate"])
        assert migrated.exit_code == 0 and migrated.output.startswith("applied: 001_init")
        assert CliRunner().invoke(main, ["status"]).exit_code == 0
    finally:
        db.close_pools()
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_a_pasted_placeholder_key_is_one_line_that_never_echoes_the_secret(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-…")
    get_settings.cache_clear()
    result = CliRunner().invoke(main, ["ask", "what is a webhook?"])
    get_settings.cache_clear()
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert "Traceback" not in result.output and "sk-" not in result.output
    assert "OPENAI_API_KEY='***': must be printable ASCII without spaces" in result.output


def test_token_prints_the_query_token_from_any_directory_or_says_where_it_looked(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from rag_pipeline.cli import main
    from rag_pipeline.settings import get_settings

    home = tmp_path / "home"
    home.mkdir()
    (home / "query_api_token").write_text("qt-from-make-run\n")
    monkeypatch.setenv("RAG_HOME", str(home))
    monkeypatch.delenv("QUERY_API_TOKEN", raising=False)
    monkeypatch.chdir(tmp_path)
    get_settings.cache_clear()
    found = CliRunner().invoke(main, ["token", "query"])
    assert found.exit_code == 0 and found.output == "qt-from-make-run\n"
    monkeypatch.delenv("WEBHOOK_TOKEN", raising=False)
    get_settings.cache_clear()
    missing = CliRunner().invoke(main, ["token", "webhook"])
    assert missing.exit_code == 1 and len(missing.output.strip().splitlines()) == 1
    assert "no webhook token: set WEBHOOK_TOKEN" in missing.output and str(home / "webhook_token") in missing.output
    get_settings.cache_clear()
