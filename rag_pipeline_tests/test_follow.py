"""`rag-pipeline follow` (make run's terminal) against a real Dagster instance and index."""

from __future__ import annotations

import time

import dagster as dg
import pytest

from rag_pipeline.cli.follow_command import _Follower
from rag_pipeline.store import spaces


@dg.op
def index_pages(context):
    raise dg.Failure("2 of 5 page(s) failed: https://example.com/a (fetch: 503)")


@dg.job(name="index_batch")
def failing_batch():
    index_pages()


@dg.op
def push_pages():
    raise ValueError("the crawler refused the token")


@dg.job(name="push")
def failing_push():
    push_pages()


@dg.op
def fine():
    pass


@dg.job(name="index_batch")
def good_batch():
    fine()


def _lines(capsys) -> list[str]:
    return [line.split(" ", 1)[1] for line in capsys.readouterr().out.splitlines()]


def test_follow_prints_a_line_a_batch_and_a_line_a_failed_run(database_url, conn, capsys):
    space = spaces.ensure_active(conn, "test-model", 8)
    with dg.instance_for_test() as instance:
        follower = _Follower(instance, database_url, time.time() - 1, None)
        follower.look()
        assert capsys.readouterr().out == ""

        ok = good_batch.execute_in_process(instance=instance, tags={"rag/pages": "2"})
        for page, tokens in (("https://example.com/a", 100), ("https://example.com/b", 1150)):
            conn.execute("INSERT INTO embedding_ledger (run_id, page_url, space_id, chunks_total, chunks_embedded,"
                         " tokens_embedded, tokens_reused, requests) VALUES (%s, %s, %s, 1, 1, %s, 0, 1)",
                         (ok.run_id, page, space.space_id, tokens))
        failing_batch.execute_in_process(instance=instance, tags={"rag/pages": "5"}, raise_on_error=False)
        push = failing_push.execute_in_process(instance=instance, raise_on_error=False)
        follower.look()
        lines = _lines(capsys)
        assert lines[0].startswith(f"batch {ok.run_id[:8]}: 2 pages indexed, 1,250 tokens embedded in ")
        assert lines[1].startswith("batch ") and " failed in " in lines[1]
        assert lines[1].endswith(": 0 pages of 5 indexed, 0 tokens embedded; "
                                 "2 of 5 page(s) failed: https://example.com/a (fetch: 503)")
        assert lines[2].startswith(f"run push {push.run_id[:8]} failed in ")
        assert lines[2].endswith(": ValueError: the crawler refused the token")
        assert len(lines) == 3

        follower.look()   # each run once
        assert capsys.readouterr().out == ""


def test_follow_shows_the_errors_services_log_once_a_window(tmp_path, capsys):
    logs = tmp_path / "logs"
    logs.mkdir()
    daemon_error = "2026-12-07 05:37:15 +0000 - dagster.daemon.SensorDaemon - ERROR - Sensor delivery_sensor failed\n"
    with dg.instance_for_test() as instance:
        follower = _Follower(instance, "unused", time.time(), logs)
        (logs / "dagster.log").write_text("… - INFO - Checking for new runs for sensor: recrawl_sensor\n" + daemon_error)
        (logs / "db.log").write_text("watching the embedded server on /x every 2 s\n")
        follower.look()
        assert _lines(capsys) == ["dagster.log: dagster.daemon.SensorDaemon - ERROR - Sensor delivery_sensor failed"]
        with (logs / "dagster.log").open("a") as f:
            f.write(daemon_error + "2026-12-07 05:37:16 +0000 - dagster - INFO - half a li")
        with (logs / "db.log").open("a") as f:
            f.write("embedded server on /x is down; starting it again\n")
        follower.look()
        assert _lines(capsys) == ["db.log: embedded server on /x is down; starting it again"]


def test_follow_shows_each_traceback_by_its_exception(tmp_path, capsys):
    """A traceback's first line is the same for all: shown as that, the first hid every other."""
    logs = tmp_path / "logs"
    logs.mkdir()

    def traceback(exception: str) -> str:
        return ("Traceback (most recent call last):\n"
                '  File "/x/rag_pipeline/cli/db_commands.py", line 80, in watch\n'
                "    keeper.check()\n" + exception + "\n")

    with dg.instance_for_test() as instance:
        follower = _Follower(instance, "unused", time.time(), logs)
        (logs / "db.log").write_text(traceback("psycopg.OperationalError: connection refused"))
        follower.look()
        follower.look()   # quiet since: no chained traceback to wait for
        with (logs / "db.log").open("a") as f:
            f.write(traceback("PermissionError: [Errno 13] Permission denied: '/x/pgdata'"))
        follower.look()
        follower.look()
        assert _lines(capsys) == ["db.log: psycopg.OperationalError: connection refused",
                                  "db.log: PermissionError: [Errno 13] Permission denied: '/x/pgdata'"]


def test_follow_without_an_instance_is_one_line(tmp_path, database_url, monkeypatch):
    from click.testing import CliRunner

    from rag_pipeline.cli import main

    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "nowhere"))
    monkeypatch.setenv("DAGSTER_POSTGRES_URL", database_url)
    done = CliRunner().invoke(main, ["follow"])
    assert done.exit_code == 1
    assert done.output.strip().splitlines()[-1].startswith("Error: no Dagster instance at ")
    assert len(done.output.strip().splitlines()) == 1


pytestmark = pytest.mark.filterwarnings("ignore::dagster.BetaWarning")
