"""`rag-pipeline follow`: the lines `make run` keeps in its terminal, the rest being in log files.

A process of its own that reads the Dagster instance's runs (and, with --logs, the services' log
files) rather than a logger inside each run: the run workers' output goes to dagster.log whole,
and a run that dies without a word (its worker killed) still ends as a failed run here.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import click

from rag_pipeline.cli.common import CliError, dagster_storage_url, index_url
from rag_pipeline.core.run_lines import BATCH_JOB, LogErrors, Repeats, RunEnd, first_line, run_line
from rag_pipeline.settings import get_settings

PAGES_TAG = "rag/pages"   # as defs/index/batch_runs.py tags a batch run (not imported: no Dagster defs here)
# Runs already shown are remembered while their update time is within this many seconds of the
# newest seen: the instance is asked for runs updated since then, a little overlap included.
OVERLAP_S = 30.0


@click.command()
@click.option("--since", "since_ts", type=float, default=None,
              help="Unix time: show runs that ended after it (default: now).")
@click.option("--logs", "logs_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Also show the errors logged in this directory's *.log files (make run's $RAG_HOME/logs).")
@click.option("--every", "every_s", type=click.FloatRange(min=0.2), default=2.0, show_default=True,
              help="Seconds between looks.")
def follow(since_ts: float | None, logs_dir: Path | None, every_s: float) -> None:
    """Print a line for each batch run that ends (pages indexed, tokens embedded) and each run
    that fails, until stopped: what `make run` shows while the rest goes to its logs."""
    from rag_pipeline.defs import check_states

    settings = get_settings()
    url = index_url()
    home = Path(os.environ.get("DAGSTER_HOME") or settings.rag_home / "dagster_home")
    with dagster_storage_url(settings) as missing:
        if missing:
            raise CliError(f"no Dagster instance to follow: {missing}")
        instance = check_states.instance_at(home)
        if instance is None:
            raise CliError(f"no Dagster instance at {home} (no dagster.yaml): `make run` makes it; "
                           "or set DAGSTER_HOME to yours")
        follower = _Follower(instance, url, time.time() if since_ts is None else since_ts, logs_dir)
        try:
            while True:
                follower.look()
                time.sleep(every_s)
        except KeyboardInterrupt:
            pass
        finally:
            instance.dispose()


class _Follower:
    def __init__(self, instance, index_url: str, since_ts: float, logs_dir: Path | None):
        self.instance = instance
        self.index_url = index_url
        self.since_ts = since_ts
        self.logs_dir = logs_dir
        self.shown: dict[str, float] = {}     # run id → its update time
        self.offsets: dict[Path, int] = {}
        self.partial: dict[Path, bytes] = {}
        self.errors: dict[Path, LogErrors] = {}
        self.repeats = Repeats()

    def look(self) -> None:
        for look in (self._runs, self._logs):
            try:
                look()
            except Exception as exc:   # a database restarting (db watch) is not the end of following
                self._say(f"follow: could not read {look.__name__.strip('_')}: {first_line(str(exc)) or type(exc).__name__}",
                          dedupe=True)

    def _runs(self) -> None:
        import dagster as dg

        ended = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]
        after = datetime.fromtimestamp(self.since_ts, tz=timezone.utc)
        records = self.instance.get_run_records(
            filters=dg.RunsFilter(statuses=ended, updated_after=after),
            order_by="update_timestamp", ascending=True, limit=200)
        for record in records:
            run, updated = record.dagster_run, record.update_timestamp.timestamp()
            if run.run_id in self.shown or (record.end_time or updated) < self.since_ts:
                continue
            self.shown[run.run_id] = updated
            line = run_line(self._end_of(run, record))
            if line:
                self._say(line)
        if records:
            newest = max(r.update_timestamp.timestamp() for r in records)
            self.since_ts = max(self.since_ts, newest - OVERLAP_S)
            self.shown = {k: t for k, t in self.shown.items() if t >= self.since_ts}

    def _end_of(self, run, record) -> RunEnd:
        duration = record.end_time - record.start_time if record.end_time and record.start_time else None
        status = run.status.value
        pages = tokens = 0
        if run.job_name == BATCH_JOB:
            from rag_pipeline.store import db, run_figures

            with db.connection(self.index_url) as conn:
                pages, tokens = run_figures.switched_by_run(conn, run.run_id)
        planned = run.tags.get(PAGES_TAG)
        return RunEnd(run.run_id, run.job_name, status, duration,
                      pages_planned=int(planned) if planned and planned.isdigit() else None,
                      pages_indexed=pages, tokens_embedded=tokens,
                      reason="" if status == "SUCCESS" else self._reason(run.run_id))

    def _reason(self, run_id: str) -> str:
        """The first step failure's message, else the run failure's: the line to look at first."""
        import dagster as dg

        kinds = {dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.RUN_FAILURE}
        events = [r.event_log_entry.dagster_event for r in
                  self.instance.get_records_for_run(run_id, of_type=kinds, limit=20).records]
        for event in sorted((e for e in events if e), key=lambda e: e.event_type != dg.DagsterEventType.STEP_FAILURE):
            error = getattr(event.event_specific_data, "error", None)
            while error is not None and error.cause is not None:   # the op's own exception, not Dagster's wrapper
                error = error.cause
            message = (error.message if error else None) or event.message or ""
            # "<dotted exception class>: 2 of 5 page(s) failed" → what follows the class name
            head, sep, rest = first_line(message).partition(": ")
            text = rest if sep and "." in head and " " not in head else first_line(message)
            if text:
                return text
        return ""

    def _logs(self) -> None:
        if self.logs_dir is None or not self.logs_dir.is_dir():
            return
        for path in sorted(self.logs_dir.glob("*.log")):
            errors = self.errors.setdefault(path, LogErrors(path.name))
            for shown in errors.lines(self._new_lines(path)):
                self._say(shown, dedupe=True)

    def _new_lines(self, path: Path) -> list[str]:
        size = path.stat().st_size
        offset = self.offsets.get(path, 0)
        if size < offset:   # the file was started anew
            offset, self.partial[path] = 0, b""
            self.errors[path] = LogErrors(path.name)
        if size == offset:
            return []
        with path.open("rb") as f:
            f.seek(offset)
            data = self.partial.get(path, b"") + f.read(size - offset)
        self.offsets[path] = size
        *lines, self.partial[path] = data.split(b"\n")
        return [line.decode("utf-8", "replace") for line in lines]

    def _say(self, line: str, *, dedupe: bool = False) -> None:
        if dedupe and not self.repeats.fresh(line, time.monotonic()):
            return
        click.echo(f"{time.strftime('%H:%M:%S')} {line}")
        sys.stdout.flush()
