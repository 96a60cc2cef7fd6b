"""Batch runs through the real Dagster daemon: its sensor ticks, its run launcher, its worker processes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import dagster as dg
import psycopg
import pytest

from rag_pipeline.settings import Settings
from rag_pipeline.store import db
from rag_pipeline_tests.fakes.openai_server import FakeOpenAI
from rag_pipeline_tests.harness import TOKEN, configure, deliver
from rag_pipeline_tests.servers import serve
from webhook_sensor.app import create_app

CHECKOUT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def url(n: int) -> str:
    return f"https://docs.example.com/daemon/{n}"


def page(n: int, extra: str = "") -> str:
    return (f"# Page {n}\n\nPage {n} explains the heron gate number {n}.{extra}\n\n"
            f"## Setup\n\nGate {n} opens at {n % 12} o'clock and closes at dusk.")


class Daemon:
    def __init__(self, proc: subprocess.Popen, instance: dg.DagsterInstance, log: Path):
        self.proc, self.instance, self.log = proc, instance, log

    def wait(self, condition, timeout_s: float, what: str):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = condition()
            if value:
                return value
            if self.proc.poll() is not None:
                pytest.fail(f"the daemon exited ({self.proc.returncode}) waiting for {what}:\n{self.tail()}")
            time.sleep(0.05)
        pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}:\n{self.tail()}")

    def batch_runs(self) -> list[dg.DagsterRun]:
        return sorted(self.instance.get_runs(filters=dg.RunsFilter(job_name="index_batch")),
                      key=lambda r: r.run_id)

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])


@pytest.fixture
def stack(database_url, tmp_path, monkeypatch):
    """Receiver and fake embedder on loopback, and `dagster-daemon run` on the repo's workspace."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(CHECKOUT / "dagster.yaml", home / "dagster.yaml")
    dagster_url = db.as_url(db.with_database(database_url, f"dagster_{uuid.uuid4().hex[:8]}"))
    db.ensure_database(dagster_url)
    with FakeOpenAI(dimensions=64) as fake:
        env = dict(
            DATABASE_URL=database_url, EMBEDDING_PROVIDER="openai", OPENAI_API_KEY="sk-test",
            OPENAI_BASE_URL=fake.base_url, EMBEDDING_DIMENSIONS="64", EMBEDDING_MAX_RETRIES="0",
            # Recovery by heartbeat only: a lease that outlives every test, a worker silent 5 s is gone.
            RUN_RETRY_BACKOFF_S="0", BATCH_HEARTBEAT_S="1", BATCH_HEARTBEAT_TIMEOUT_S="5", DAGSTER_HOME=str(home),
            DAGSTER_POSTGRES_URL=dagster_url, RAG_HOME=str(tmp_path / "rag_home"),
        )
        configure(monkeypatch, **env)
        app = create_app(Settings(WEBHOOK_TOKEN=TOKEN), database_url=database_url)
        log = tmp_path / "daemon.log"
        with serve(app, health_path="/healthz") as base, log.open("w") as out:
            instance = dg.DagsterInstance.from_config(str(home))

            def start() -> Daemon:
                proc = subprocess.Popen([str(BIN / "dagster-daemon"), "run", "-w", str(CHECKOUT / "workspace.yaml")],
                                        cwd=CHECKOUT, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)
                daemons.append(proc)
                return Daemon(proc, instance, log)

            daemons: list[subprocess.Popen] = []
            try:
                yield base, fake, start
            finally:
                for proc in daemons:
                    _kill_group(proc)
                instance.dispose()


def _kill_group(proc: subprocess.Popen) -> None:
    """The daemon and everything it started. SIGTERM first; then SIGKILL for the whole group even
    when the daemon is gone: a code server whose run worker was killed can outlive its daemon
    (seen: SIGTERM and the missing heartbeat left it running)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    proc.wait(10)


def applied(conn, n: int) -> bool:
    return conn.execute("SELECT count(*) FROM deliveries WHERE outcome = 'embedded'").fetchone()[0] >= n


def test_one_daemon_run_applies_the_tick_each_page_on_its_partition_a_poisoned_one_alone(stack, conn):
    base, fake, start = stack
    fake.poison("cormorant")
    for n in range(20):
        deliver(base, url(n), page(n, " A cormorant nests here." if n == 7 else ""))
    daemon = start()   # everything is delivered before the first tick: one tick's worth of pages

    runs = daemon.wait(lambda: [r for r in daemon.batch_runs() if r.is_finished] or None, 120, "the batch run")
    assert len(daemon.batch_runs()) == 1
    assert runs[0].status == dg.DagsterRunStatus.FAILURE       # red: one page needs a look
    outcomes = dict(conn.execute("SELECT page_url, outcome FROM deliveries").fetchall())
    assert outcomes.pop(url(7)) == "failed" and set(outcomes.values()) == {"embedded"}
    for n in range(20):
        records = daemon.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("embeddings"), asset_partitions=[url(n)]), limit=5).records
        if n == 7:
            assert records == []
            continue
        (record,) = records
        chunks = conn.execute("SELECT count(*) FROM chunks c JOIN pages p USING (page_id) WHERE p.url = %s",
                              (url(n),)).fetchone()[0]
        meta = record.asset_materialization.metadata
        assert record.run_id == runs[0].run_id and meta["chunks_total"].value == chunks > 0
        assert meta["status"].value == "switched"
    assert set(daemon.instance.get_dynamic_partitions("pages")) == {url(n) for n in range(20)}


def test_a_batch_killed_mid_way_leaves_pages_switched_or_due_and_the_retry_finishes(stack, conn):
    base, fake, start = stack
    pages = 120
    for n in range(pages):
        deliver(base, url(n), page(n))
    daemon = start()

    def worker_pid() -> int | None:
        runs = daemon.batch_runs()
        events = runs and daemon.instance.all_logs(runs[0].run_id, of_type=dg.DagsterEventType.STEP_START)
        return events[0].dagster_event.pid if events else None

    worker = daemon.wait(worker_pid, 120, "the batch run's worker")
    # The database shows a switch the moment it commits (the UI's events come in batches).
    daemon.wait(lambda: conn.execute("SELECT count(*) FROM deliveries WHERE outcome = 'embedded'").fetchone()[0],
                120, "the first page switched in")
    (killed_run,) = daemon.batch_runs()
    os.kill(worker, signal.SIGKILL)
    killed_at = time.monotonic()
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as peek:
        rows = peek.execute(
            "SELECT p.indexed_hash IS NOT DISTINCT FROM p.source_hash AND p.indexed_hash IS NOT NULL, d.outcome"
            " FROM deliveries d JOIN pages p ON p.url = d.page_url").fetchall()
    # Right after the kill: every page is either switched in (its delivery applied) or still due.
    assert all((switched and outcome == "embedded") or (not switched and outcome == "queued")
               for switched, outcome in rows), rows
    unswitched = sum(1 for switched, _ in rows if not switched)
    assert 0 < unswitched < pages, "the kill landed before or after the batch; nothing mid-way was tested"

    daemon.wait(lambda: applied(conn, pages), 150, "every page applied after the kill")
    assert conn.execute("SELECT count(*) FROM pages WHERE indexed_hash = source_hash").fetchone()[0] == pages
    assert conn.execute("SELECT count(DISTINCT outcome) FROM deliveries").fetchone()[0] == 1
    # A page the killed run switched in was not applied again.
    once = conn.execute("SELECT count(*) FROM embedding_ledger").fetchone()[0]
    assert once == pages
    # Within a tick or two, not a lease of 30 minutes. A worker killed alone is seen dying by its
    # code server, which marks the run failed (the daemon's kill, below, takes the code server too).
    assert time.monotonic() - killed_at < 60
    assert daemon.instance.get_run_by_id(killed_run.run_id).status == dg.DagsterRunStatus.FAILURE
    reason = conn.execute("SELECT end_reason FROM batches ORDER BY requested_at LIMIT 1").fetchone()[0]
    assert "failed" in reason or "FAILURE" in reason, reason


def test_a_daemon_killed_with_its_run_leaves_no_run_started_and_its_pages_are_applied_after_restart(
        stack, conn):
    base, fake, start = stack
    pages = 120
    for n in range(pages):
        deliver(base, url(n), page(n))
    daemon = start()
    daemon.wait(lambda: conn.execute("SELECT count(*) FROM deliveries WHERE outcome = 'embedded'").fetchone()[0],
                120, "the first page switched in")
    # The daemon, its code server and the run's worker, all at once (as a crash or a reboot would).
    os.killpg(daemon.proc.pid, signal.SIGKILL)
    daemon.proc.wait(10)
    killed_at = time.monotonic()
    (run,) = daemon.batch_runs()
    assert daemon.instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.STARTED
    assert not applied(conn, pages)

    restarted = start()
    restarted.wait(lambda: applied(conn, pages), 150, "every page applied after the restart")
    assert conn.execute("SELECT count(*) FROM embedding_ledger").fetchone()[0] == pages
    restarted.wait(lambda: restarted.instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.FAILURE,
                   30, "the killed run marked failed")
    assert time.monotonic() - killed_at < 120
    # Every run ends, the retry included: none stays STARTED.
    restarted.wait(lambda: all(r.is_finished for r in restarted.batch_runs()), 60, "every batch run to end")
    # Nobody saw that worker die: its silence did (BATCH_HEARTBEAT_TIMEOUT_S=5 here).
    reason = conn.execute("SELECT end_reason FROM batches ORDER BY requested_at LIMIT 1").fetchone()[0]
    assert "stopped beating" in reason, reason


def test_a_page_delivered_again_while_a_batch_holds_it_is_applied_after_it_newest_last(stack, conn):
    base, fake, start = stack
    fake.delay(4.0)                      # the batch holds the page while its embedding is slow
    deliver(base, url(1), page(1))
    daemon = start()

    def taken_not_switched():
        # The batch has taken the crawl as the page's source and is embedding it (slowly).
        row = conn.execute("SELECT p.source_delivery_id IS NOT NULL AND p.leased_until > now(), d.outcome"
                           " FROM pages p JOIN deliveries d ON d.page_url = p.url").fetchone()
        return bool(row and row[0] and row[1] == "queued")

    daemon.wait(taken_not_switched, 90, "the first batch to take the page")
    first = daemon.batch_runs()[0]
    deliver(base, url(1), page(1, " Revised: the gate moved to the pier."))
    assert conn.execute("SELECT outcome FROM deliveries ORDER BY id").fetchall()[0] == ("queued",)  # still held
    daemon.wait(lambda: applied(conn, 2), 120, "both crawls applied")

    rows = conn.execute("SELECT outcome, applied_at FROM deliveries ORDER BY id").fetchall()
    assert [r[0] for r in rows] == ["embedded", "embedded"] and rows[0][1] < rows[1][1]
    assert "Revised" in conn.execute("SELECT source_text FROM pages").fetchone()[0]
    runs = daemon.wait(lambda: [r for r in daemon.batch_runs() if r.is_finished] == daemon.batch_runs()
                       and daemon.batch_runs(), 60, "the runs to finish")
    assert len(runs) == 2 and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
    records = {r.run_id: daemon.instance.get_run_record_by_id(r.run_id) for r in runs}
    second = next(r for r in runs if r.run_id != first.run_id)
    # Never two batches on one page at once: the second started after the first had finished.
    assert records[second.run_id].start_time >= records[first.run_id].end_time
    assert conn.execute("SELECT count(*) FROM embedding_ledger").fetchone()[0] == 2
