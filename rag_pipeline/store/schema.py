"""The schema: the numbered files of sql/ applied once each, in order, under an advisory lock, and
the check every process makes at start that the schema is the one its code expects."""

from __future__ import annotations

import hashlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

import psycopg

from rag_pipeline.store.db import DatabaseError, NoDatabase, database_exists, ensure_database, redact

log = logging.getLogger(__name__)


def _migrations_dir() -> Path:
    """The checkout's sql/ (a checkout, or an editable install of one), else the copy an installed
    wheel carries in rag_pipeline/migrations (setup.py puts it there)."""
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "sql").is_dir():
        return root / "sql"
    return Path(__file__).resolve().parents[1] / "migrations"


SQL_DIR = Path(os.environ["RAG_SQL_DIR"]) if os.environ.get("RAG_SQL_DIR") else _migrations_dir()
# Any constant works; it only has to differ from other advisory locks of this database.
MIGRATION_LOCK_KEY = 0x5241_4701

#: The first line of a migration that must run outside a transaction (CREATE INDEX CONCURRENTLY,
#: ALTER TYPE … ADD VALUE): its statements run one by one, each committed on its own, so the file
#: must be safe to run again if it stops halfway (IF NOT EXISTS, and an invalid index dropped first).
NO_TRANSACTION = "-- migrate: no-transaction"


class SchemaOutdated(DatabaseError):
    """The database's schema is not the one this code was written for; the message says what to run."""


@dataclass(frozen=True)
class Migration:
    version: str
    path: Path
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()

    @property
    def transactional(self) -> bool:
        return not self.sql.lstrip().startswith(NO_TRANSACTION)

    def statements(self) -> list[str]:
        """A no-transaction file's statements: split at a `;` that ends a line."""
        return [part.strip() for part in re.split(r";\s*$", self.sql, flags=re.MULTILINE) if _has_sql(part)]


def _has_sql(part: str) -> bool:
    return any(line.strip() and not line.strip().startswith("--") for line in part.splitlines())


def migration_files(directory: Path = SQL_DIR) -> list[Path]:
    files = sorted(directory.glob("[0-9][0-9][0-9]_*.sql"))
    if not files:
        raise DatabaseError(f"no migrations found in {directory}")
    return files


def migrations(directory: Path = SQL_DIR) -> list[Migration]:
    return [Migration(path.stem, path, path.read_text(encoding="utf-8")) for path in migration_files(directory)]


def _recorded(conn: psycopg.Connection) -> dict[str, str | None] | None:
    """version → checksum of what the database says it applied (None: before checksums were
    kept); None when it has no record at all."""
    exists = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()[0]
    if not exists:
        return None
    has_checksum = conn.execute(
        "SELECT 1 FROM information_schema.columns WHERE table_name = 'schema_migrations' AND column_name = 'checksum'"
    ).fetchone()
    query = ("SELECT version, checksum FROM schema_migrations" if has_checksum
             else "SELECT version, NULL FROM schema_migrations")
    return dict(conn.execute(query).fetchall())


def _check_unchanged(files: list[Migration], recorded: dict[str, str | None]) -> None:
    changed = [m.path.name for m in files if recorded.get(m.version) not in (None, m.checksum)
               and m.version in recorded]
    if changed:
        raise DatabaseError(
            f"migration file(s) changed after they were applied: {', '.join(changed)}. Applied migrations "
            "are history: restore the file(s) as they were and put the change in a new numbered file")


def migrate(conn: psycopg.Connection, directory: Path = SQL_DIR) -> list[str]:
    """Apply each numbered file once, in order, and record it with its checksum; returns what ran.
    A file changed after it was applied is an error. Needs an autocommit connection: each file is
    its own transaction, or none for a no-transaction file."""
    if not conn.autocommit:
        raise RuntimeError("migrate needs an autocommit connection")
    files = migrations(directory)
    applied_now: list[str] = []
    # A session lock, held across files: a no-transaction file cannot run under a transaction's.
    conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS schema_migrations ("
                     " version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())")
        conn.execute("ALTER TABLE schema_migrations ADD COLUMN IF NOT EXISTS checksum text")
        recorded = _recorded(conn) or {}
        _check_unchanged(files, recorded)
        for m in files:
            if m.version in recorded:
                if recorded[m.version] is None:   # applied before checksums were kept: trusted as it is now
                    conn.execute("UPDATE schema_migrations SET checksum = %s WHERE version = %s",
                                 (m.checksum, m.version))
                continue
            if m.transactional:
                with conn.transaction():
                    conn.execute(m.sql)
                    _record(conn, m)
            else:
                for statement in m.statements():
                    conn.execute(statement)
                _record(conn, m)
            log.info("migration %s applied", m.version)
            applied_now.append(m.version)
    finally:
        if not conn.closed:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
    return applied_now


def _record(conn: psycopg.Connection, m: Migration) -> None:
    conn.execute("INSERT INTO schema_migrations (version, checksum) VALUES (%s, %s)", (m.version, m.checksum))


def require_current(url: str, directory: Path = SQL_DIR) -> None:
    """What every process checks at start: the schema is the one this code expects. Raises
    NoDatabase, or SchemaOutdated saying what to run; changes nothing."""
    if not database_exists(url):
        raise NoDatabase(f"no index database at {redact(url)}: create it with `rag-pipeline db migrate` "
                         "(or `make run`)")
    files = migrations(directory)
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            recorded = _recorded(conn)
    except psycopg.OperationalError as exc:
        raise DatabaseError(f"cannot reach PostgreSQL at {redact(url)}: {' '.join(str(exc).split())}") from exc
    if recorded is None:
        raise SchemaOutdated(f"the database at {redact(url)} has no schema yet: run `rag-pipeline db migrate`")
    _check_unchanged(files, recorded)
    missing = [m.version for m in files if m.version not in recorded]
    if missing:
        raise SchemaOutdated(f"the database at {redact(url)} needs migration(s) {', '.join(missing)}: "
                             "run `rag-pipeline db migrate` (the deploy step; `make run` does it)")
    unknown = sorted(set(recorded) - {m.version for m in files})
    if unknown:
        raise SchemaOutdated(f"the database at {redact(url)} has migration(s) this code does not know "
                             f"({', '.join(unknown)}): it was migrated by a newer release; run that one")


def prepare(url: str, directory: Path = SQL_DIR) -> list[str]:
    """Create the database if needed and bring its schema up to date."""
    ensure_database(url)
    with psycopg.connect(url, autocommit=True) as conn:
        applied = migrate(conn, directory)
        update_vector_extension(conn)
        return applied


def update_vector_extension(conn: psycopg.Connection) -> None:
    """A database made with an older pgvector keeps that version's SQL objects until updated."""
    row = conn.execute(
        "SELECT e.extversion, a.default_version FROM pg_extension e"
        " JOIN pg_available_extensions a ON a.name = e.extname WHERE e.extname = 'vector'"
    ).fetchone()
    if row is None or row[0] == row[1]:
        return
    try:
        conn.execute("ALTER EXTENSION vector UPDATE")
        log.info("pgvector updated from %s to %s", row[0], row[1])
    except psycopg.Error as exc:
        log.warning("pgvector %s is installed, %s is available: run ALTER EXTENSION vector UPDATE as "
                    "the extension's owner (%s)", row[0], row[1], " ".join(str(exc).split()))

