"""The `prune` job and schedule in a real Dagster instance, and `rag-pipeline prune`."""

import gzip
import json
import uuid

import dagster as dg
import psycopg
from click.testing import CliRunner

from rag_pipeline.cli import main as cli
from rag_pipeline.settings import get_settings
from rag_pipeline.store import deliveries, retention
from rag_pipeline_tests.harness import Pipeline, load_defs

URL = "https://example.com/handbook"


def deliver(conn, text: str) -> int:
    return deliveries.insert(conn, rid=uuid.uuid4().hex, url=URL, pushed_url=None, crawler_status=200,
                             original_status=200, content_type="text/markdown",
                             body=gzip.compress(text.encode()), body_encoding="gzip")


def prune_metadata(result: dg.ExecuteInProcessResult) -> dict:
    assert result.success
    (output,) = [e for e in result.all_events
                 if e.event_type == dg.DagsterEventType.STEP_OUTPUT and e.step_key == "prune_storage"]
    return {k: v.value for k, v in output.step_output_data.metadata.items()}


def test_prune_job_and_its_daily_schedule():
    defs = load_defs()
    assert defs.resolve_job_def("prune").tags["rag/kind"] == "maintenance"
    schedule = defs.resolve_schedule_def("prune_schedule")
    assert schedule.job_name == "prune" and schedule.cron_schedule == "17 3 * * *"
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING


def test_the_index_works_the_same_after_the_prune_job(database_url, conn, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("EMBEDDING_PROVIDER", "hash")
    get_settings.cache_clear()
    with dg.instance_for_test() as instance:
        defs = load_defs()
        pipeline = Pipeline(instance, defs)
        deliver(conn, "# Handbook\n\nRotate the webhook token monthly.")
        assert len(pipeline.tick().runs) == 1
        deliver(conn, "# Handbook\n\nRotate the webhook token monthly.")
        assert not pipeline.tick().runs                       # unchanged
        conn.execute("UPDATE deliveries SET received_at = received_at - interval '20 days'")

        job = defs.resolve_job_def("prune")
        dry = prune_metadata(job.execute_in_process(
            instance=instance, run_config={"ops": {"prune_storage": {"config": {"dry_run": True}}}}))
        assert (dry["dry_run"], dry["deliveries_deleted"]) == (True, 2)
        assert conn.execute("SELECT count(*) FROM deliveries").fetchone()[0] == 2
        done = prune_metadata(job.execute_in_process(instance=instance))
        assert (done["dry_run"], done["deliveries_deleted"], done["pushes_deleted"]) == (False, 2, 0)
        assert done["retention_days"] == {"deliveries": 14, "pushes": 30, "vectors": 30}
        assert conn.execute("SELECT count(*) FROM deliveries").fetchone()[0] == 0

        # The hash gate reads pages.indexed_hash: the same text needs no run, a change gets one.
        same = deliver(conn, "# Handbook\n\nRotate the webhook token monthly.")
        assert not pipeline.tick().runs
        assert conn.execute("SELECT outcome FROM deliveries WHERE id = %s", (same,)).fetchone()[0] == "unchanged"
        deliver(conn, "# Handbook\n\nRotate the webhook token weekly.")
        assert len(pipeline.tick().runs) == 1
        live = conn.execute("SELECT string_agg(content, ' ') FROM chunks").fetchone()[0]
        assert "weekly" in live and "monthly" not in live


def test_cli_prune(database_url, conn, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", database_url)
    get_settings.cache_clear()
    for _ in range(3):
        deliveries.insert(conn, rid=uuid.uuid4().hex, url=URL, pushed_url=None, crawler_status=500,
                          original_status=None, content_type=None, body=b"", body_encoding="identity")
    conn.execute("UPDATE deliveries SET processed_at = now(), outcome = 'skipped', page_url = url,"
                 " received_at = now() - interval '15 days'")

    dry = CliRunner().invoke(cli, ["prune", "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    report = json.loads(dry.output)
    assert (report["dry_run"], report["deliveries"], report["retention_days"]["deliveries"]) == (True, 3, 14)

    # Not on a terminal: plain progress lines on stderr, counted against the tables' estimates.
    conn.execute("ANALYZE deliveries")
    monkeypatch.setenv("PRUNE_BATCH_SIZE", "1")
    monkeypatch.setenv("PUSH_RETENTION_DAYS", "0")
    monkeypatch.setenv("VECTOR_RETENTION_DAYS", "0")
    get_settings.cache_clear()
    walked = CliRunner().invoke(cli, ["prune", "--dry-run"])
    assert walked.exit_code == 0, walked.output
    assert walked.stderr.splitlines() == [f"  {n} of 3 rows walked, deliveries" for n in (1, 2, 3)]
    assert "deliveries: would delete 3" in walked.stdout
    for name in ("PRUNE_BATCH_SIZE", "PUSH_RETENTION_DAYS", "VECTOR_RETENTION_DAYS"):
        monkeypatch.delenv(name)
    get_settings.cache_clear()

    with psycopg.connect(database_url, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s)", (retention.PRUNE_LOCK_KEY,))
        busy = CliRunner().invoke(cli, ["prune"])
        assert busy.exit_code == 1 and "another prune is running" in busy.output
    assert conn.execute("SELECT count(*) FROM deliveries").fetchone()[0] == 3

    done = CliRunner().invoke(cli, ["prune"])
    assert done.exit_code == 0, done.output
    assert "deliveries: deleted 3 (settled, received over 14 d ago)" in done.output
    assert conn.execute("SELECT count(*) FROM deliveries").fetchone()[0] == 0

    monkeypatch.setenv("PUSH_RETENTION_DAYS", "-3")
    get_settings.cache_clear()
    bad = CliRunner().invoke(cli, ["prune"])
    assert bad.exit_code == 1 and "PUSH_RETENTION_DAYS" in bad.output
