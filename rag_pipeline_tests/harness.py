"""A real Dagster instance, the real definitions, and helpers to tick the sensor and run what it asks."""

from __future__ import annotations

import gzip
import uuid
from contextlib import contextmanager
from dataclasses import dataclass

import dagster as dg
import httpx

from rag_pipeline.defs.index.batch_runs import pages_of as batch_pages
from rag_pipeline.defs.index.partitions import pages_partitions
from rag_pipeline_tests.servers import TLS

TOKEN = "e2e-token"


def configure(monkeypatch, **env: str | None) -> None:
    """Set (or, for None, unset) environment variables and read the settings anew."""
    from rag_pipeline.settings import get_settings

    for name, value in env.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    get_settings.cache_clear()


def load_defs() -> dg.Definitions:
    from rag_pipeline.definitions import defs

    return defs()


def evaluate_sensor(defs: dg.Definitions, name: str, instance: dg.DagsterInstance, *,
                    cursor: str | None = None):
    """One evaluation of the sensor `name` as the daemon makes it: the code location's resources
    set up for it (their settings read, their clients made) and torn down after it."""
    with dg.build_sensor_context(instance=instance, resources=defs.resources, cursor=cursor,
                                 definitions=defs) as context:
        return defs.resolve_sensor_def(name)(context)


@dataclass
class Tick:
    result: dg.SensorResult
    runs: list[dg.DagsterRun]

    @property
    def partitions(self) -> list[str]:
        """The pages this tick put into batch runs, in request order."""
        return [url for r in self.result.run_requests or [] for url in batch_pages(r)]


class Pipeline:
    """Evaluates delivery_sensor in a real instance and executes its run requests there."""

    def __init__(self, instance: dg.DagsterInstance, defs: dg.Definitions):
        self.instance = instance
        self.defs = defs
        self.job = defs.resolve_job_def("index_batch")
        self.cursor: str | None = None
        self.snapshot_cursor: str | None = None

    def snapshot(self) -> dg.SensorResult:
        """Evaluate index_snapshot_sensor as the daemon does: its `index` event recorded."""
        result = evaluate_sensor(self.defs, "index_snapshot_sensor", self.instance, cursor=self.snapshot_cursor)
        self.snapshot_cursor = result.cursor if result.cursor is not None else self.snapshot_cursor
        for event in result.asset_events or []:
            self.instance.report_runless_asset_event(event)
        return result

    def tick(self, *, execute: bool = True, expect_success: bool = True) -> Tick:
        result = evaluate_sensor(self.defs, "delivery_sensor", self.instance, cursor=self.cursor)
        assert isinstance(result, dg.SensorResult)
        # What the daemon does with a tick's result: its cursor kept, its asset events recorded.
        self.cursor = result.cursor if result.cursor is not None else self.cursor
        for event in result.asset_events or []:
            self.instance.report_runless_asset_event(event)
        for request in result.dynamic_partitions_requests or []:
            self.instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        runs = []
        if execute:
            for request in result.run_requests or []:
                job = self.defs.resolve_job_def(request.job_name) if request.job_name else self.job
                outcome = job.execute_in_process(
                    run_config=request.run_config, instance=self.instance, tags=request.tags,
                    raise_on_error=False,
                )
                assert outcome.success is expect_success
                runs.append(outcome.dagster_run)
        return Tick(result, runs)

    def report_failure(self, run: dg.DagsterRun) -> None:
        """Evaluate delivery_failure_sensor on a failed run, as the daemon does after it fails."""
        sensor = self.defs.resolve_sensor_def("delivery_failure_sensor")
        failures = self.instance.all_logs(run.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
        assert failures, f"run {run.run_id} did not fail"
        with dg.build_run_status_sensor_context(
            sensor_name=sensor.name, dagster_event=failures[-1].dagster_event,
            dagster_instance=self.instance, dagster_run=self.instance.get_run_by_id(run.run_id),
            resources=self.defs.resources,
        ).for_run_failure() as context:
            sensor(context)

    def partitions(self) -> list[str]:
        return self.instance.get_dynamic_partitions(pages_partitions.name)


def deliver(base_url: str, url: str, markdown: str | bytes, *, original_status: int = 200,
            crawler_status: int = 200, rid: str | None = None) -> httpx.Response:
    body = markdown.encode() if isinstance(markdown, str) else markdown
    resp = httpx.post(
        f"{base_url}/webhook",
        params={"token": TOKEN},
        headers={"rid": rid or uuid.uuid4().hex, "url": url, "Original-Status": str(original_status),
                 "CB-Status": str(crawler_status), "Content-Encoding": "gzip"},
        content=gzip.compress(body),
        timeout=10,
        verify=TLS,
    )
    resp.raise_for_status()
    return resp


@contextmanager
def openai_stack(database_url: str, monkeypatch, fake):
    """The real receiver on loopback, the pipeline embedding through `fake` (256 dims), and a real
    Dagster instance: (receiver URL, Pipeline)."""
    from rag_pipeline.settings import Settings, get_settings
    from rag_pipeline_tests.servers import serve
    from webhook_sensor.app import create_app

    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("EMBEDDING_PROVIDER", "openai")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
    monkeypatch.setenv("EMBEDDING_DIMENSIONS", "256")
    get_settings.cache_clear()
    app = create_app(Settings(WEBHOOK_TOKEN=TOKEN), database_url=database_url)
    with serve(app, health_path="/healthz") as base, dg.instance_for_test() as instance:
        yield base, Pipeline(instance, load_defs())
