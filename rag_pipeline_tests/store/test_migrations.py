import psycopg

from rag_pipeline.store import db


def test_migrations_apply_once_in_order(pg_server_url):
    url = db.with_database(pg_server_url, "t_migrate_once")
    try:
        first = db.prepare(url)
        files = [p.stem for p in db.migration_files()]
        assert first == files
        with psycopg.connect(url) as conn:
            before = conn.execute("SELECT version, applied_at FROM schema_migrations ORDER BY version").fetchall()
            tables = {r[0] for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()}
        assert {"deliveries", "pages", "chunks", "staged_chunks", "vectors", "embedding_spaces"} <= tables
        # Running again applies nothing and leaves the record untouched.
        assert db.prepare(url) == []
        with psycopg.connect(url) as conn:
            after = conn.execute("SELECT version, applied_at FROM schema_migrations ORDER BY version").fetchall()
        assert after == before
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute("DROP DATABASE IF EXISTS t_migrate_once WITH (FORCE)")


def test_redact_hides_password():
    assert "s3cret" not in db.redact("postgresql://u:s3cret@localhost:5432/rag")


def test_unreachable_server_gives_clear_error():
    import pytest

    with pytest.raises(db.DatabaseError, match="cannot reach PostgreSQL"):
        db.ensure_database("postgresql://nobody@127.0.0.1:1/rag?connect_timeout=2")


def test_concurrent_prepare_creates_and_migrates_once(pg_server_url):
    from concurrent.futures import ThreadPoolExecutor

    url = db.with_database(pg_server_url, "t_migrate_race")
    try:
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda _: db.prepare(url), range(4)))
        applied = [version for r in results for version in r]
        # Each file applied exactly once, whichever process got to it.
        assert sorted(applied) == [p.stem for p in db.migration_files()]
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute("DROP DATABASE IF EXISTS t_migrate_race WITH (FORCE)")
