"""What `make run` and the README's commands print in a newcomer's terminal."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_dg_run_from_the_venv_without_activating_it_prints_no_venv_warning(tmp_path):
    """The README runs `.venv/bin/dg scaffold …` from a shell where no venv is active: dg then
    compares $VIRTUAL_ENV (unset) with the project's .venv and warned in 7 lines. A copy of the
    project's pyproject.toml beside a .venv reproduces that wherever the suite's venv lives."""
    shutil.copy(CHECKOUT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / ".venv").mkdir()
    # Dagster's one-time telemetry notice (printed by the first dagster command a machine runs, with
    # no DAGSTER_HOME) is not this warning: an instance that opts out keeps it off stderr.
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {**{k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}, "DAGSTER_HOME": str(home)}
    done = subprocess.run([str(BIN / "dg"), "list", "envs"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "virtual environment" not in done.stderr, done.stderr
    assert done.stderr.strip() == ""


# ---- `make run` itself (scripts/run.sh), started once: the embedded server in a temporary RAG_HOME,
# every service on a free loopback port, the sample site discovered, pushed and indexed.

import re
import signal
import socket
import threading
import time

import dagster as dg
import psutil
import pytest

from rag_pipeline_tests.waiting import wait_until

BATCH_LINE = re.compile(r"^\d\d:\d\d:\d\d batch ([0-9a-f]{8}): (\d+) pages? indexed, [\d,]+ tokens? embedded")


class Terminal:
    """What run.sh prints, line by line, as a person would see it."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))

    def index_of(self, pattern: str) -> int | None:
        return next((i for i, line in enumerate(list(self.lines)) if re.search(pattern, line)), None)

    def closed(self, timeout_s: float) -> None:
        self.proc.wait(timeout_s)
        self._reader.join(10)


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _stop_everything(proc: subprocess.Popen, env: dict) -> None:
    """A test that failed half-way leaves nothing running: run.sh's own stop, then what is left."""
    if proc.poll() is None:
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        for child in children:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
    subprocess.run([str(BIN / "rag-pipeline"), "db", "stop"], env=env, cwd=CHECKOUT, capture_output=True, timeout=60)


def _run_env(home: Path) -> dict:
    webhook, query_api, dagster, site = _free_ports(4)
    drop = ("DATABASE_URL", "WEBHOOK_TOKEN", "QUERY_API_TOKEN", "DAGSTER_HOME", "DAGSTER_POSTGRES_URL",
            "VIRTUAL_ENV", "OPENAI_API_KEY", "VERBOSE", "SAMPLE_SITE_URL", "CRAWLER", "CRAWLER_ALLOW_NETWORKS")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(RAG_HOME=str(home), WEBHOOK_PORT=str(webhook), QUERY_API_PORT=str(query_api),
               DAGSTER_PORT=str(dagster), SITE_PORT=str(site), EMBEDDING_PROVIDER="local")
    return env


def _ticks_since(log: Path, offset: int) -> int:
    """The sensor ticks the daemon logged past `offset` of dagster.log."""
    with log.open("rb") as f:
        f.seek(offset)
        return f.read().count(b"Checking for new runs for sensor")


@pytest.fixture(scope="module")
def make_run(tmp_path_factory):
    home = tmp_path_factory.mktemp("make-run") / "rag"
    env = _run_env(home)
    started = time.monotonic()
    # Its own session: Ctrl-C is a SIGINT to the terminal's foreground group, run.sh's. With SIGINT
    # at its default, as a terminal gives it: a suite started in the background of a shell (CI, a
    # supervisor) has it ignored, and bash cannot trap a signal ignored when it starts.
    proc = subprocess.Popen([sys.executable, "scripts/reset_signals.py", "bash", "scripts/run.sh"], cwd=CHECKOUT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    terminal = Terminal(proc)
    try:
        yield terminal, home, env, started
    finally:
        _stop_everything(proc, env)


@pytest.mark.timeout(480)
def test_make_run_shows_a_banner_one_line_a_batch_and_a_clean_stop(make_run):
    terminal, home, env, started = make_run
    logs = home / "logs"

    # Before the banner: a "starting…" line (and the first migration's) only, none of a service's.
    assert wait_until(lambda: terminal.lines, 120, "run.sh's first line")[0].startswith("starting rag-pipeline…")
    banner = wait_until(lambda: terminal.index_of(r"rag-pipeline is running") or terminal.proc.poll() is not None,
                        300, "the ready banner")
    assert terminal.proc.poll() is None, "\n".join(terminal.lines)
    before = [line for line in terminal.lines[:banner] if line.strip()]
    assert len(before) <= 2 and all(not re.search(r"INFO|DEBUG|Uvicorn", line) for line in before), before
    assert str(logs / "{dagster,webhook,query_api,site,db}.log") in "\n".join(terminal.lines[banner:]), \
        "the banner names the log files"

    # The sample site is discovered, pushed, delivered and indexed: one line says so.
    batch = wait_until(lambda: next((m for m in map(BATCH_LINE.match, terminal.lines) if m), None), 240,
                       "a batch line in the terminal")
    assert int(batch.group(2)) >= 1
    # An idle spell, as long as the daemon takes to tick its sensors three more times (each tick
    # a "Checking for new runs" line in dagster.log): what a tick logs stays out of the terminal.
    idle_from = len(terminal.lines)
    log_from = (logs / "dagster.log").stat().st_size
    idle_started = time.monotonic()
    wait_until(lambda: _ticks_since(logs / "dagster.log", log_from) >= 3, 180, "three daemon ticks in dagster.log")
    print(f"idle spell of three daemon ticks: {time.monotonic() - idle_started:.0f} s")
    after_banner = [line for line in terminal.lines[banner:] if line.strip()]
    shown = after_banner[after_banner.index(next(l for l in after_banner if l.startswith("  Below:"))) + 1:]
    assert all(BATCH_LINE.match(line) for line in shown) and len(shown) <= 3, shown
    assert len(terminal.lines) - idle_from <= 2, terminal.lines[idle_from:]

    # The rest went to the log files: the daemon's ticks, the run's INFO lines, none at DEBUG.
    dagster_log = (logs / "dagster.log").read_text()
    assert "Checking for new runs for sensor" in dagster_log
    assert "page(s):" in dagster_log and " - DEBUG - " not in dagster_log
    for name in ("webhook.log", "query_api.log", "site.log", "db.log"):
        assert (logs / name).stat().st_size > 0, name
    assert "POST" in (logs / "webhook.log").read_text()   # the crawler's deliveries

    # The UI still has every event of the batch run, the DEBUG-level ones included.
    url = subprocess.run([str(BIN / "rag-pipeline"), "db", "url", "--database", "dagster"], env=env, cwd=CHECKOUT,
                         capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_POSTGRES_URL", url)
        with dg.DagsterInstance.from_config(str(home / "dagster_home")) as instance:
            run = next(r for r in instance.get_runs(filters=dg.RunsFilter(job_name="index_batch"))
                       if r.run_id.startswith(batch.group(1)))
            kinds = {e.dagster_event.event_type for e in instance.all_logs(run.run_id) if e.dagster_event}
    assert {dg.DagsterEventType.STEP_START, dg.DagsterEventType.ASSET_MATERIALIZATION,
            dg.DagsterEventType.RUN_SUCCESS} <= kinds

    # Ctrl-C: one line, and nothing after it; no job notice from bash.
    os.killpg(terminal.proc.pid, signal.SIGINT)
    terminal.closed(120)
    assert terminal.proc.returncode == 0
    assert not any("Terminated" in line for line in terminal.lines), terminal.lines
    last = [line for line in terminal.lines if line.strip()][-1]
    assert last.startswith("stopping… stopped: "), terminal.lines[-5:]
    print(f"make run test: {time.monotonic() - started:.0f} s")


def test_a_service_that_cannot_start_is_named_with_the_end_of_its_log_at_once(tmp_path, database_url):
    """The receiver's port is taken: run.sh says so when the receiver exits, with its log's last
    lines, instead of waiting out its 60 s or printing nothing (its output is in a log file).
    On the test server (DATABASE_URL): no embedded server to make for a start that fails."""
    env = _run_env(tmp_path / "rag")
    env["DATABASE_URL"] = database_url
    taken = socket.socket()
    taken.bind(("127.0.0.1", int(env["WEBHOOK_PORT"])))
    taken.listen()
    proc = subprocess.Popen(["bash", "scripts/run.sh"], cwd=CHECKOUT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out = proc.communicate(timeout=150)[0].decode()
    finally:
        taken.close()
        _stop_everything(proc, env)
    assert proc.returncode != 0
    assert f"the service behind http://127.0.0.1:{env['WEBHOOK_PORT']}/healthz exited; the end of " \
           f"{tmp_path / 'rag' / 'logs' / 'webhook.log'}:" in out, out
    assert "address already in use" in out.lower(), out
    assert "Terminated" not in out and "Traceback" not in out.split("webhook.log:")[0], out
