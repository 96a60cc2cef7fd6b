import psycopg

from rag_pipeline.store import db, schema


def test_migrations_apply_once_in_order(pg_server_url):
    url = db.with_database(pg_server_url, "t_migrate_once")
    try:
        first = schema.prepare(url)
        files = [p.stem for p in schema.migration_files()]
        assert first == files
        with psycopg.connect(url) as conn:
            before = conn.execute("SELECT version, applied_at FROM schema_migrations ORDER BY version").fetchall()
            tables = {r[0] for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()}
        assert {"deliveries", "pages", "chunks", "staged_chunks", "vectors", "embedding_spaces"} <= tables
        # Running again applies nothing and leaves the record untouched.
        assert schema.prepare(url) == []
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
            results = list(pool.map(lambda _: schema.prepare(url), range(4)))
        applied = [version for r in results for version in r]
        # Each file applied exactly once, whichever process got to it.
        assert sorted(applied) == [p.stem for p in schema.migration_files()]
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute("DROP DATABASE IF EXISTS t_migrate_race WITH (FORCE)")


def test_an_index_made_before_space_tables_keeps_its_vectors_and_search(pg_server_url, tmp_path):
    """010 moves the active space's vectors off `chunks` into its own table and index, and gives a
    space being built its table, filled from the cache, with the rest on its backlog."""
    import shutil
    import uuid

    import numpy as np
    from pgvector.psycopg import register_vector

    from rag_pipeline.store import search, spaces

    old = tmp_path / "sql"
    old.mkdir()
    for path in schema.migration_files():
        if path.stem < "010":
            shutil.copy(path, old / path.name)
    name = f"t_{uuid.uuid4().hex[:12]}"
    url = db.with_database(pg_server_url, name)
    try:
        schema.prepare(url, old)
        vec = lambda i: np.eye(8, dtype=np.float32)[i % 8]  # noqa: E731
        with psycopg.connect(url) as conn:
            register_vector(conn)
            conn.execute("INSERT INTO embedding_spaces (space_id, model, dimensions, status) VALUES"
                         " (1, 'old', 8, 'active'), (2, 'new', 8, 'building')")
            conn.execute("CREATE INDEX chunks_hnsw_space_1 ON chunks USING hnsw ((embedding::vector(8)) vector_cosine_ops)"
                         " WHERE space_id = 1")
            page = uuid.uuid4()
            conn.execute("INSERT INTO pages (page_id, url) VALUES (%s, 'https://example.com/m')", (page,))
            for i in range(3):
                h = bytes([i]) * 32
                conn.execute(
                    "INSERT INTO chunks (chunk_id, page_id, chunk_index, content, embed_text, embed_hash,"
                    " token_count, chunker_version, space_id, embedding)"
                    " VALUES (%s, %s, %s, %s, %s, %s, 1, 'v', 1, %s)",
                    (uuid.uuid4(), page, i, f"text {i}", f"text {i}", h, vec(i)))
                if i < 2:   # the building space has vectors of two of the three texts
                    conn.execute("INSERT INTO vectors (space_id, embed_hash, embedding, token_count)"
                                 " VALUES (2, %s, %s, 1)", (h, vec(i + 4)))
            conn.commit()
        assert schema.prepare(url) == [p.stem for p in schema.migration_files() if p.stem >= "010"]
        with psycopg.connect(url) as conn:
            register_vector(conn)
            columns = {r[0] for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'chunks'")}
            assert "embedding" not in columns and "space_id" not in columns
            counts = dict(conn.execute("SELECT space_id, count(*) FROM space_vectors GROUP BY 1").fetchall())
            assert counts == {1: 3, 2: 2}
            assert conn.execute("SELECT space_id, count(*) FROM space_backlog GROUP BY 1").fetchall() == [(2, 1)]
            active = spaces.active(conn)
            assert spaces.index_state(conn, active) == "valid"
            hits = search.nearest(conn, active, vec(1), k=1)
            assert hits[0].content == "text 1" and hits[0].distance < 1e-6
    finally:
        db.close_pools()
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(psycopg.sql.Identifier(name)))


def _fresh(pg_server_url, name):
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(psycopg.sql.Identifier(name)))
    return db.with_database(pg_server_url, name)


def test_a_changed_applied_migration_is_refused_and_a_no_transaction_one_runs_outside(pg_server_url, tmp_path):
    import pytest

    sql_dir = tmp_path / "sql"
    sql_dir.mkdir()
    (sql_dir / "001_items.sql").write_text("CREATE TABLE items (id int PRIMARY KEY, name text);\n")
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction: the marker runs it outside one.
    (sql_dir / "002_items_index.sql").write_text(
        f"{schema.NO_TRANSACTION}\n-- a big table's index, built without blocking writes\n"
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS items_name ON items (name);\n"
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS items_name_id ON items (name, id);\n")
    url = _fresh(pg_server_url, "t_migrate_checksum")
    try:
        with pytest.raises(db.NoDatabase, match="create it with `rag-pipeline db migrate`"):
            schema.require_current(url, sql_dir)
        db.ensure_database(url)
        with pytest.raises(schema.SchemaOutdated, match="has no schema yet: run `rag-pipeline db migrate`"):
            schema.require_current(url, sql_dir)
        assert schema.prepare(url, sql_dir) == ["001_items", "002_items_index"]
        schema.require_current(url, sql_dir)
        with psycopg.connect(url) as conn:
            indexes = {r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'items'")}
            checksums = dict(conn.execute("SELECT version, checksum FROM schema_migrations").fetchall())
        assert {"items_name", "items_name_id"} <= indexes
        assert checksums["001_items"] == schema.migrations(sql_dir)[0].checksum

        (sql_dir / "003_more.sql").write_text("ALTER TABLE items ADD COLUMN price int;\n")
        with pytest.raises(schema.SchemaOutdated, match=r"needs migration\(s\) 003_more: run `rag-pipeline db migrate`"):
            schema.require_current(url, sql_dir)
        (sql_dir / "001_items.sql").write_text("CREATE TABLE items (id bigint PRIMARY KEY, name text);\n")
        for attempt in (lambda: schema.prepare(url, sql_dir), lambda: schema.require_current(url, sql_dir)):
            with pytest.raises(db.DatabaseError, match=r"changed after they were applied: 001_items\.sql"):
                attempt()
        with psycopg.connect(url) as conn:   # nothing of 003 ran
            columns = {r[0] for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'items'")}
        assert "price" not in columns
    finally:
        _fresh(pg_server_url, "t_migrate_checksum")


def test_migrations_applied_before_checksums_were_kept_get_theirs_recorded(pg_server_url, tmp_path):
    sql_dir = tmp_path / "sql"
    sql_dir.mkdir()
    (sql_dir / "001_items.sql").write_text("CREATE TABLE items (id int PRIMARY KEY);\n")
    url = _fresh(pg_server_url, "t_migrate_legacy")
    try:
        db.ensure_database(url)
        with psycopg.connect(url, autocommit=True) as conn:   # as the runner before checksums left it
            conn.execute("CREATE TABLE schema_migrations (version text PRIMARY KEY,"
                         " applied_at timestamptz NOT NULL DEFAULT now())")
            conn.execute("CREATE TABLE items (id int PRIMARY KEY)")
            conn.execute("INSERT INTO schema_migrations (version) VALUES ('001_items')")
        schema.require_current(url, sql_dir)          # current, though nothing records its checksum yet
        assert schema.prepare(url, sql_dir) == []
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT checksum FROM schema_migrations").fetchone()[0] == \
                schema.migrations(sql_dir)[0].checksum
    finally:
        _fresh(pg_server_url, "t_migrate_legacy")
