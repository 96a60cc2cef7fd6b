"""What `make run`'s terminal shows of a run that ended and of a line a service logged."""

from rag_pipeline.core.run_lines import LogErrors, Repeats, RunEnd, error_in_log, first_line, run_line


def test_a_batch_that_ended_is_one_line_with_its_pages_and_tokens():
    end = RunEnd("4c8f48a6d1e2", "index_batch", "SUCCESS", 2.94, pages_planned=5, pages_indexed=5,
                 tokens_embedded=12345)
    assert run_line(end) == "batch 4c8f48a6: 5 pages indexed, 12,345 tokens embedded in 2.9 s"
    one = RunEnd("4c8f48a6d1e2", "index_batch", "SUCCESS", None, pages_indexed=1, tokens_embedded=1)
    assert run_line(one) == "batch 4c8f48a6: 1 page indexed, 1 token embedded"


def test_a_failed_batch_says_how_far_it_got_and_why():
    end = RunEnd("4c8f48a6d1e2", "index_batch", "FAILURE", 8.0, pages_planned=5, pages_indexed=3,
                 tokens_embedded=900, reason="2 of 5 page(s) failed")
    assert run_line(end) == ("batch 4c8f48a6 failed in 8.0 s: 3 pages of 5 indexed, 900 tokens embedded; "
                             "2 of 5 page(s) failed")


def test_other_runs_are_shown_only_when_they_fail():
    assert run_line(RunEnd("ab12cd34ef", "push", "SUCCESS", 1.0)) is None
    assert run_line(RunEnd("ab12cd34ef", "push", "FAILURE", 1.0, reason="crawler refused")) == \
        "run push ab12cd34 failed in 1.0 s: crawler refused"
    assert run_line(RunEnd("ab12cd34ef", "sample_discovery", "CANCELED", None)) == \
        "run sample_discovery ab12cd34 was canceled"


def test_errors_in_the_logs_are_picked_out_of_the_rest():
    colored = ("\x1b[32m2026-12-07 05:37:15 +0000\x1b[0m - dagster.daemon.SensorDaemon - \x1b[31mERROR\x1b[0m - "
               "Sensor delivery_sensor failed")
    assert error_in_log("dagster.log", colored) == "dagster.log: dagster.daemon.SensorDaemon - ERROR - Sensor delivery_sensor failed"
    assert error_in_log("dagster.log", "2026-12-07 05:30:43 +0000 - dagster.daemon.SensorDaemon - INFO - "
                                       "Checking for new runs for sensor: recrawl_sensor") is None
    assert error_in_log("webhook.log", "ERROR:    [Errno 98] address already in use") == \
        "webhook.log: ERROR:    [Errno 98] address already in use"
    assert error_in_log("webhook.log", '{"ts":1.0,"level":"error","event":"db down"}')
    assert error_in_log("webhook.log", '{"ts":1.0,"level":"info","event":"access"}') is None
    # The database keeper's incidents, not its start line.
    assert error_in_log("db.log", "watching the embedded server on /x/pgdata every 2 s") is None
    assert error_in_log("db.log", "embedded server on /x/pgdata is down; starting it again")
    assert error_in_log("site.log", "embedded server on /x is down") is None
    assert len(error_in_log("dagster.log", "x - ERROR - " + "y" * 500)) < 240


def test_an_error_repeated_every_tick_is_shown_once_a_window():
    seen = Repeats(window_s=600)
    assert seen.fresh("dagster.log: Sensor x failed at tick 12", 0)
    assert not seen.fresh("dagster.log: Sensor x failed at tick 13", 15)
    assert seen.fresh("dagster.log: Sensor y failed at tick 13", 15)
    assert seen.fresh("dagster.log: Sensor x failed at tick 14", 601)


def _traceback(*exception: str) -> list[str]:
    return ["Traceback (most recent call last):", '  File "/x/watch.py", line 12, in check',
            "    conn = psycopg.connect(url)", "           ^^^^^^^^^^^^^^^^^^^^^", *exception]


def test_a_traceback_is_shown_as_its_exception_and_two_different_ones_are_both_shown():
    errors = LogErrors("db.log")
    assert errors.lines(_traceback("psycopg.OperationalError: connection refused on port 5432")) == []
    # Held while a chained traceback may follow; the next line, or a quiet look, shows it.
    assert errors.lines(["watching the embedded server on /x every 2 s"]) == \
        ["db.log: psycopg.OperationalError: connection refused on port 5432"]
    assert errors.lines(_traceback("KeyError: 'pgdata'")) == []
    assert errors.lines([]) == ["db.log: KeyError: 'pgdata'"]
    assert errors.lines([]) == []
    # Each keyed by its exception: the second traceback is not the first one repeated.
    seen = Repeats(window_s=600)
    assert seen.fresh("db.log: psycopg.OperationalError: connection refused on port 5432", 0)
    assert seen.fresh("db.log: KeyError: 'pgdata'", 5)
    assert not seen.fresh("db.log: psycopg.OperationalError: connection refused on port 5433", 10)


def test_a_chained_traceback_is_shown_as_the_exception_raised_last():
    errors = LogErrors("dagster.log")
    lines = ["\x1b[32m2026-12-07 05:37:15 +0000\x1b[0m - dagster.daemon - ERROR - tick failed",
             *_traceback("KeyError: 'a'"), "",
             "The above exception was the direct cause of the following exception:", "",
             *_traceback("ValueError: boom 12", "second line of its message"),
             "2026-12-07 05:37:16 +0000 - dagster.daemon - INFO - Checking for new runs"]
    assert errors.lines(lines) == ["dagster.log: dagster.daemon - ERROR - tick failed", "dagster.log: ValueError: boom 12"]


def test_a_traceback_cut_short_is_still_shown():
    errors = LogErrors("webhook.log")
    cut = _traceback()[:2] + ["ERROR:    [Errno 98] address already in use"]
    assert errors.lines(cut) == ["webhook.log: a traceback cut short (see the log)",
                                 "webhook.log: ERROR:    [Errno 98] address already in use"]


def test_first_line():
    assert first_line("\n  boom  \nTraceback…") == "boom"
    assert first_line("") == ""
