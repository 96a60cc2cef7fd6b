"""The real Dagster daemon on the repo's workspace, with the receiver and a fake embedder on loopback."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pytest

from rag_pipeline.settings import Settings
from rag_pipeline.store import db
from rag_pipeline_tests.fakes.openai_server import FakeOpenAI
from rag_pipeline_tests.harness import TOKEN, configure
from rag_pipeline_tests.servers import serve
from rag_pipeline_tests.waiting import wait_until
from webhook_sensor.app import create_app

CHECKOUT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


class Daemon:
    def __init__(self, proc: subprocess.Popen, instance: dg.DagsterInstance, log: Path):
        self.proc, self.instance, self.log = proc, instance, log

    def wait(self, condition, timeout_s: float, what: str):
        """`wait_until`, failing at once (with the daemon's log) if the daemon exits meanwhile."""
        def ready():
            value = condition()
            if not value and self.proc.poll() is not None:
                pytest.fail(f"the daemon exited ({self.proc.returncode}) waiting for {what}:\n{self.tail()}")
            return value

        try:
            return wait_until(ready, timeout_s, what, poll_s=0.05)
        except AssertionError as exc:
            pytest.fail(f"{exc}:\n{self.tail()}")

    def batch_runs(self) -> list[dg.DagsterRun]:
        return sorted(self.instance.get_runs(filters=dg.RunsFilter(job_name="index_batch")),
                      key=lambda r: r.run_id)

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])


@contextmanager
def daemon_stack(database_url: str, dagster_url: str, tmp_path: Path, monkeypatch):
    """Receiver and fake embedder on loopback, and `start(**env)` for `dagster-daemon run` on the
    repo's workspace; every daemon started is killed with its process group at the end."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(CHECKOUT / "deploy" / "dagster.yaml", home / "dagster.yaml")
    db.ensure_database(dagster_url)
    with FakeOpenAI(dimensions=64) as fake:
        env = dict(
            DATABASE_URL=database_url, EMBEDDING_PROVIDER="openai", OPENAI_API_KEY="sk-test",
            OPENAI_BASE_URL=fake.base_url, EMBEDDING_DIMENSIONS="64", EMBEDDING_MAX_RETRIES="0",
            # Recovery by heartbeat only: a lease that outlives every test, a worker silent 5 s is gone.
            RUN_RETRY_BACKOFF_S="0", BATCH_HEARTBEAT_S="1", BATCH_HEARTBEAT_TIMEOUT_S="5", DAGSTER_HOME=str(home),
            # A tick at every turn of the daemon's 5 s sensor loop, not every third.
            DELIVERY_INTERVAL_S="4",
            DAGSTER_POSTGRES_URL=dagster_url, RAG_HOME=str(tmp_path / "rag_home"),
        )
        configure(monkeypatch, **env)
        app = create_app(Settings(WEBHOOK_TOKEN=TOKEN), database_url=database_url)
        log = tmp_path / "daemon.log"
        with serve(app, health_path="/healthz") as base, log.open("w") as out:
            instance = dg.DagsterInstance.from_config(str(home))

            def start(**extra: str) -> Daemon:
                proc = subprocess.Popen([str(BIN / "dagster-daemon"), "run", "-w", str(CHECKOUT / "workspace.yaml")],
                                        cwd=CHECKOUT, env={**os.environ, **env, **extra}, stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True)
                daemons.append(proc)
                return Daemon(proc, instance, log)

            daemons: list[subprocess.Popen] = []
            try:
                yield base, fake, start
            finally:
                for proc in daemons:   # the test is over: nothing left to shut down gracefully
                    kill_group(proc, graceful=False)
                instance.dispose()


def kill_group(proc: subprocess.Popen, graceful: bool = True) -> None:
    """The daemon and everything it started. SIGTERM first (unless not `graceful`: a daemon takes up
    to 10 s to stop); then SIGKILL for the whole group even when the daemon is gone: a code server
    whose run worker was killed can outlive its daemon (seen: SIGTERM and the missing heartbeat
    left it running)."""
    if graceful:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        try:
            wait_until(lambda: not _group_alive(proc.pid), 5, "the daemon's process group to exit")
            return
        except AssertionError:
            pass   # stragglers: killed below
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    proc.wait(10)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
