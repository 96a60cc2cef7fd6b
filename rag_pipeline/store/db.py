"""Where the database is and how to reach it (its schema: `store/schema.py`).

`DATABASE_URL` wins. Without it the embedded PostgreSQL 18 + pgvector of `store/embedded.py`
runs with its data under `RAG_HOME/pgdata`; the first time this package starts a data
directory, `store/doctor.py` proves that its pgvector runs on this CPU.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import threading
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import quote, urlencode

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool

from rag_pipeline.core import addresses
from rag_pipeline.settings import Settings
from rag_pipeline.store import embedded

log = logging.getLogger(__name__)

APP_DATABASE = "rag"
DAGSTER_DATABASE = "dagster"




class DatabaseError(RuntimeError):
    """A database problem worth a clear message rather than a traceback."""


class NoDatabase(DatabaseError):
    """A read found no index where it looked; nothing was created."""


def server_url(settings: Settings, database: str = APP_DATABASE, *, create: bool = True) -> str:
    """The URL of `database` on the configured server (embedded when DATABASE_URL is unset).

    With `create=False` an embedded data directory that does not exist yet is an error, not a
    new empty server: a read must never answer from an index it just made.
    """
    if settings.database_url:
        if database == APP_DATABASE:
            return settings.database_url
        return with_database(settings.database_url, database)
    if not create and not embedded.exists(settings):
        raise NoDatabase(
            f"no index at {embedded.pgdata_dir(settings)} ({describe_home(settings)}): start it with "
            f"`make run` or `rag-pipeline db start`, or point RAG_HOME or DATABASE_URL at your index"
        )
    try:
        server, _ = embedded.start(settings)
    except embedded.EmbeddedError as exc:
        raise DatabaseError(str(exc)) from exc
    check_embedded_once(settings, server.get_uri("postgres"))
    return server.get_uri(database)


def describe_home(settings: Settings) -> str:
    return f"RAG_HOME={settings.rag_home}, {settings.rag_home_source()}"


def doctor_marker(settings: Settings) -> Path:
    return settings.rag_home / "doctor.json"


# (doctor marker, package version) this process has seen pass.
_passed: set[tuple[Path, str]] = set()


def check_embedded_once(settings: Settings, admin_url: str) -> None:
    """Run the doctor the first time this package version serves the data directory, and obey it."""
    marker = doctor_marker(settings)
    version = embedded.package_version()
    if (marker, version) in _passed:
        return   # this process saw the verdict already: every connection asks, the file is read once
    try:
        seen = json.loads(marker.read_text())
    except (OSError, ValueError):
        seen = {}
    if seen.get("package_version") == version:
        if seen.get("ok"):
            _passed.add((marker, version))
            return
        raise DatabaseError(f"{seen.get('message')} (found by the doctor on {seen.get('at')}; "
                            f"`rag-pipeline db doctor` checks again)")
    report = run_doctor(settings, admin_url)
    if not report.ok:
        raise DatabaseError(report.failure)
    _passed.add((marker, version))


def run_doctor(settings: Settings, url: str | None = None):
    """Diagnose the configured server; for the embedded one, record the verdict for later starts."""
    from rag_pipeline.store import doctor

    if settings.database_url:
        return doctor.diagnose(url or settings.database_url, source=f"DATABASE_URL ({redact(settings.database_url)})")
    if url is None:
        server, _ = embedded.start(settings)
        url = server.get_uri("postgres")
    report = doctor.diagnose(
        url, source=f"embedded, {embedded.PACKAGE} {embedded.package_version()} at {embedded.pgdata_dir(settings)}",
        log_file=embedded.log_file(settings),
    )
    if not report.conclusive:
        return report
    marker = doctor_marker(settings)
    tmp = marker.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({
        "package_version": embedded.package_version(), "ok": report.ok, "message": report.failure,
        "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }))
    tmp.replace(marker)
    return report


def with_database(url: str, database: str) -> str:
    """`url` naming `database` instead, in the same form (a URL stays a URL)."""
    params = conninfo_to_dict(url)
    params["dbname"] = database
    return as_url(params) if is_url(url) else make_conninfo(**params)


def is_url(conninfo: str) -> bool:
    return conninfo.startswith(("postgresql://", "postgres://"))


def as_url(conninfo: str | dict) -> str:
    """A postgresql:// URL for any conninfo: SQLAlchemy (dagster-postgres) parses only URLs."""
    params = dict(conninfo_to_dict(conninfo) if isinstance(conninfo, str) else conninfo)
    user, password = params.pop("user", None), params.pop("password", None)
    host, port = params.pop("host", None), params.pop("port", None)
    dbname = params.pop("dbname", None) or ""
    netloc = ""
    if user:
        netloc = quote(user, safe="") + (f":{quote(password, safe='')}" if password else "") + "@"
    if host and not host.startswith("/") and "," not in host:
        netloc += f"[{host}]" if ":" in host else host
        if port:
            netloc += f":{port}"
    else:  # a socket directory or several hosts go in the query, as libpq and SQLAlchemy accept
        params.update({k: v for k, v in (("host", host), ("port", port)) if v})
    query = f"?{urlencode(params, safe='/')}" if params else ""
    return f"postgresql://{netloc}/{quote(dbname, safe='')}{query}"


def database_exists(url: str) -> bool:
    target = conninfo_to_dict(url).get("dbname")
    try:
        with psycopg.connect(with_database(url, "postgres"), autocommit=True, connect_timeout=10) as conn:
            return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (target,)).fetchone() is not None
    except psycopg.OperationalError as exc:
        raise DatabaseError(f"cannot reach PostgreSQL at {redact(url)}: {exc}") from exc


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


def _configure(conn: psycopg.Connection, statement_timeout_ms: int | None = None) -> None:
    """Every pooled connection is in autocommit: a statement alone is its own transaction, and a
    unit of work is the `with conn.transaction():` block around it, wherever it is called from.

    A statement timeout is set last: it bounds the queries the connection serves, not its set-up
    (registering the vector types queries the catalog, which a busy server may answer slowly; a
    set-up cancelled by a tight timeout would leave the pool without connections)."""
    from pgvector.psycopg import register_vector

    conn.autocommit = True
    register_vector(conn)
    if statement_timeout_ms is not None:
        bound_statements(conn, statement_timeout_ms)


def ping(conn: psycopg.Connection) -> None:
    """The cheapest round trip: a health check's proof that the database answers."""
    conn.execute("SELECT 1")


async def ping_async(conn: psycopg.AsyncConnection) -> None:
    """`ping` for the receiver's asynchronous connections."""
    await conn.execute("SELECT 1")


def statement_timeout_ms(seconds: float) -> int:
    """A timeout in seconds as PostgreSQL's milliseconds, rounded up: never 0, which PostgreSQL
    reads as no timeout at all."""
    if not seconds > 0:
        raise ValueError(f"a statement timeout must be more than 0 s, not {seconds!r}")
    return max(1, math.ceil(seconds * 1000))


def bound_statements(conn: psycopg.Connection, timeout_ms: int) -> None:
    """Every later statement of this session ends within ``timeout_ms`` (a session setting: it
    outlives the transaction it is set in)."""
    with conn.transaction():
        conn.execute("SELECT set_config('statement_timeout', %s, false)", (f"{int(timeout_ms)}ms",))


def opener(conn: psycopg.Connection) -> Callable[[], psycopg.Connection]:
    """How to open another connection like ``conn`` (its server, database and user, set up as the
    pool's are), for a thread's work beside it: a connection holds one transaction at a time.

    Every setting ``conn`` runs with is given, defaults included (`ConnectionInfo.dsn` leaves those
    out, and the PG* environment could then send the new connection elsewhere)."""
    params = {o.keyword.decode(): o.val.decode() for o in conn.pgconn.info
              if o.val is not None and o.keyword != b"password"}
    password = conn.info.password

    def open_() -> psycopg.Connection:
        other = psycopg.connect(make_conninfo(**params), password=password, connect_timeout=10)
        try:
            _configure(other)
        except BaseException:
            other.close()
            raise
        return other

    return open_


def server_is_local(conn: psycopg.Connection) -> bool:
    """Whether the server runs on this machine (a Unix socket, as the embedded server's, or a
    loopback address): then this machine's memory is the server's."""
    host = conn.info.host
    return host.startswith("/") or addresses.names_this_machine(host)


def require_autocommit(conn: psycopg.Connection, what: str) -> None:
    """For work that must not run inside a transaction (CONCURRENTLY), or that begins and ends its own."""
    if not conn.autocommit or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise RuntimeError(f"{what} needs an autocommit connection outside any transaction (as pooled ones are)")


def require_transaction(conn: psycopg.Connection, what: str) -> None:
    """For statements whose row locks must outlive them (FOR UPDATE): on an autocommit connection
    they would end with the statement, so the caller's `with conn.transaction():` must be open."""
    if conn.autocommit and conn.info.transaction_status != psycopg.pq.TransactionStatus.INTRANS:
        raise RuntimeError(f"{what} must run inside `with conn.transaction():` (its row locks end with it)")


_pools: dict[str, ConnectionPool] = {}
_pools_lock = threading.Lock()


def get_pool(url: str, *, max_size: int = 4, statement_timeout_s: float | None = None) -> ConnectionPool:
    """One small pool per database URL, statement timeout and process; `statement_timeout_s`
    bounds every query of its connections (the query API's: a costly question must not hold a
    connection for long). A pool with a timeout is never the one without: a process that opened
    the URL's plain pool first still gets its timeout."""
    timeout_ms = None if statement_timeout_s is None else statement_timeout_ms(statement_timeout_s)
    key = url if timeout_ms is None else f"{url}#statement_timeout={timeout_ms}ms"
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None:
            configure = functools.partial(_configure, statement_timeout_ms=timeout_ms)
            # `check`: a connection the server dropped while idle in the pool (a restart, a
            # terminate) is replaced before it is handed out, not failed on its first statement:
            # after a restart every sensor tick failed that way until its pool had cycled.
            pool = ConnectionPool(url, min_size=1, max_size=max_size, configure=configure, open=True,
                                  check=ConnectionPool.check_connection,
                                  kwargs={"connect_timeout": 10}, name="rag")
            _pools[key] = pool
        return pool


def close_pools(url: str | None = None) -> None:
    """Every pool of this process, or those of one database URL (whatever their timeout)."""
    with _pools_lock:
        for key in [k for k in _pools if url is None or k == url or k.startswith(f"{url}#")]:
            _pools.pop(key).close()


@contextmanager
def connection(url: str) -> Iterator[psycopg.Connection]:
    with get_pool(url).connection() as conn:
        yield conn
