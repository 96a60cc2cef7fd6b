"""The embedded server's postmaster killed with SIGKILL mid-load, with the real receiver, daemon
and `rag-pipeline db watch` (what `make run` starts): 503s while it is down, never a 500 and
never a 200 for a delivery that was not stored; everything acknowledged is applied after."""

from __future__ import annotations

import gzip
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dagster as dg
import httpx
import psycopg
import pytest

from rag_pipeline.store import db, embedded
from rag_pipeline.settings import Settings
from rag_pipeline_tests.daemons import BIN, daemon_stack, kill_group
from rag_pipeline_tests.harness import TOKEN


def _cli(home: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    done = subprocess.run([str(BIN / "rag-pipeline"), *args], env={**env, "RAG_HOME": str(home)},
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def own_server(monkeypatch):
    """An embedded server of this test's own (the suite's shared one must not be killed)."""
    work = Path(tempfile.mkdtemp(prefix="rag-restart-"))
    os.chmod(work, 0o755)   # the server's service user (as root) walks down to its pgdata
    home = work / "home"
    try:
        url = _cli(home, "db", "start")
        _cli(home, "db", "migrate")          # the deploy step: nothing else migrates
        yield home, url, _cli(home, "db", "url", "--database", "dagster")
    finally:
        embedded.stop(Settings(RAG_HOME=str(home)))
        shutil.rmtree(work, ignore_errors=True)


def test_threads_attaching_at_once_each_get_a_working_server(own_server):
    """What the daemon's sensor threads do when it starts: attach to the running embedded server all
    at once. Each gets the server's URL (one thread once saw another's half-made server object and
    failed the tick with an AssertionError)."""
    home, url, _ = own_server
    settings = Settings(RAG_HOME=str(home))
    ready = threading.Barrier(8)

    def attach(_: int) -> str:
        ready.wait()
        return db.server_url(settings)

    with ThreadPoolExecutor(8) as pool:
        urls = list(pool.map(attach, range(8)))
    assert len(set(urls)) == 1
    with psycopg.connect(urls[0], connect_timeout=10) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def _post(client: httpx.Client, base: str, n: int) -> int | None:
    """One crawler push of page n (its own rid); the status, or None when the connection failed."""
    body = gzip.compress(f"# Page {n}\n\nThe kingfisher dives at pier {n} when the tide turns.".encode())
    headers = {"rid": f"rid-{n}", "url": f"https://docs.example.com/restart/{n}", "Original-Status": "200",
               "CB-Status": "200", "Content-Encoding": "gzip"}
    try:
        return client.post(f"{base}/webhook?token={TOKEN}", content=body, headers=headers).status_code
    except httpx.TransportError:
        return None


def test_a_killed_postmaster_is_restarted_and_nothing_acknowledged_is_lost(own_server, tmp_path, monkeypatch):
    home, url, dagster_url = own_server
    watcher_log = tmp_path / "watch.log"
    with watcher_log.open("w") as out:
        env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        watcher = subprocess.Popen([str(BIN / "rag-pipeline"), "db", "watch", "--every", "0.5"],
                                   env={**env, "RAG_HOME": str(home)}, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        with daemon_stack(url, dagster_url, tmp_path, monkeypatch) as (base, fake, start):
            daemon = start()
            pages = 40
            statuses: list[int | None] = []
            acknowledged: set[int] = set()

            def push_until_acknowledged(client: httpx.Client, n: int) -> None:
                deadline = time.monotonic() + 120
                while True:   # as a crawler does: re-send until the delivery is acknowledged
                    status = _post(client, base, n)
                    statuses.append(status)
                    if status == 200:
                        acknowledged.add(n)
                        return
                    assert time.monotonic() < deadline, f"page {n} never acknowledged: {statuses[-5:]}"
                    time.sleep(0.2)

            with httpx.Client(timeout=10) as client:
                fake.delay(2.0)          # the first batch is inside its embedding request when the server dies
                for n in range(pages // 2):
                    push_until_acknowledged(client, n)
                daemon.wait(lambda: any(r.status == dg.DagsterRunStatus.STARTED for r in daemon.batch_runs()),
                            120, "a batch run working")
                with psycopg.connect(url, autocommit=True) as peek:   # staged: its embedding request is next
                    daemon.wait(lambda: peek.execute("SELECT count(*) FROM staged_chunks").fetchone()[0], 60,
                                "the batch to stage its chunks")
                killed = int((home / "pgdata" / "postmaster.pid").read_text().split()[0])
                os.kill(killed, signal.SIGKILL)
                fake.delay(0.0)
                for n in range(pages // 2, pages):
                    push_until_acknowledged(client, n)
            refused = [s for s in statuses if s != 200]
            assert set(refused) <= {503, None}, f"a delivery got {set(refused) - {503, None}}"
            assert 503 in refused        # the receiver answered while the database was away
            assert acknowledged == set(range(pages))

            with psycopg.connect(url, autocommit=True) as conn:
                stored = {r[0] for r in conn.execute("SELECT rid FROM deliveries").fetchall()}
                assert stored == {f"rid-{n}" for n in range(pages)}   # every acknowledged one, once

                def applied() -> bool:
                    return conn.execute("SELECT count(*) FROM pages WHERE indexed_hash = source_hash"
                                        " AND indexed_hash IS NOT NULL").fetchone()[0] == pages
                daemon.wait(applied, 180, "every acknowledged page searchable after the restart")
                assert conn.execute("SELECT count(*) FROM deliveries WHERE outcome <> 'embedded'").fetchone()[0] == 0
            daemon.wait(lambda: all(r.is_finished for r in daemon.batch_runs()), 120, "every batch run to end")
            assert not [r for r in daemon.batch_runs() if r.status == dg.DagsterRunStatus.STARTED]
        # A clean stop is the operator's: the watch leaves it stopped.
        _cli(home, "db", "stop")
        deadline = time.monotonic() + 10
        while "left stopped" not in watcher_log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert embedded._postmaster(home / "pgdata") is None
    finally:
        kill_group(watcher)
    log = watcher_log.read_text()
    assert "is down; starting it again" in log and "is back after" in log, log
    assert "stopped (cleanly): left stopped" in log, log


def test_db_watch_refuses_what_it_cannot_keep_up_in_one_line(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from rag_pipeline.cli import main
    from rag_pipeline.settings import get_settings

    monkeypatch.setenv("DATABASE_URL", "postgresql://someone@db.example.com/rag")
    get_settings.cache_clear()
    theirs = CliRunner().invoke(main, ["db", "watch"])
    assert theirs.exit_code == 1 and theirs.output.strip().splitlines() == [
        "Error: DATABASE_URL is set: that server is kept up by its own service manager"]
    monkeypatch.delenv("DATABASE_URL")
    get_settings.cache_clear()
    none = CliRunner().invoke(main, ["db", "watch"])
    assert none.exit_code == 1 and len(none.output.strip().splitlines()) == 1
    assert "no embedded database at" in none.output and "`rag-pipeline db start` makes it" in none.output


def test_a_receiver_started_while_its_database_is_down_answers_503_then_stores(own_server, tmp_path):
    """`make run` after a reboot, a worker respawned mid-outage: the receiver must not exit."""
    home, url, _dagster_url = own_server
    _cli(home, "db", "stop")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    with (tmp_path / "receiver.log").open("w") as out:
        receiver = subprocess.Popen(
            [str(BIN / "rag-pipeline"), "webhook", "--host", "127.0.0.1", "--port", str(port), "--workers", "2"],
            env={**env, "DATABASE_URL": url, "WEBHOOK_TOKEN": TOKEN, "RAG_HOME": str(home)},
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(timeout=10) as client:
            deadline = time.monotonic() + 60
            health = None
            while time.monotonic() < deadline and health is None:
                assert receiver.poll() is None, (tmp_path / "receiver.log").read_text()
                try:
                    health = client.get(f"{base}/healthz")
                except httpx.TransportError:
                    time.sleep(0.2)
            assert health is not None and health.status_code == 503
            # Up or down only: the reason (which names the server) goes to the receiver's log.
            assert health.json() == {"status": "unhealthy"}
            refused = _post(client, base, 1)
            assert refused == 503
            deadline = time.monotonic() + 30   # retrying meanwhile, not exiting
            while "database unavailable at start" not in (tmp_path / "receiver.log").read_text():
                assert receiver.poll() is None and time.monotonic() < deadline, (tmp_path / "receiver.log").read_text()
                time.sleep(0.2)
            assert receiver.poll() is None, (tmp_path / "receiver.log").read_text()

            _cli(home, "db", "start")
            deadline = time.monotonic() + 30
            while (status := _post(client, base, 1)) != 200:
                assert status == 503 and time.monotonic() < deadline, status
                time.sleep(0.3)
            assert client.get(f"{base}/healthz").status_code == 200
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT rid FROM deliveries").fetchall() == [("rid-1",)]
    finally:
        kill_group(receiver)
    assert "database unavailable at start" in (tmp_path / "receiver.log").read_text()
    assert "healthz: unhealthy:" in (tmp_path / "receiver.log").read_text()


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_read_after_db_stop_says_it_started_the_server(own_server):
    home, _url, _dagster_url = own_server
    _cli(home, "db", "stop")
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    done = subprocess.run([str(BIN / "rag-pipeline"), "status"], env={**env, "RAG_HOME": str(home)},
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert f"the embedded PostgreSQL at {home / 'pgdata'} was stopped; started it" in done.stderr
    assert embedded._postmaster(home / "pgdata") is not None
    again = subprocess.run([str(BIN / "rag-pipeline"), "status"], env={**env, "RAG_HOME": str(home)},
                           capture_output=True, text=True, timeout=180)
    assert again.returncode == 0 and "was stopped" not in again.stderr   # said once, when it was so
