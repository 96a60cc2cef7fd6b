"""Pushes left pending by a push run that died are expired by recrawl_sensor, not kept forever."""

from __future__ import annotations

import dagster as dg

from rag_pipeline.settings import get_settings
from rag_pipeline.store import pushes
from rag_pipeline_tests.harness import evaluate_sensor, load_defs


def test_recrawl_sensor_expires_pushes_a_dead_run_left_pending(database_url, conn, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", database_url)
    get_settings.cache_clear()
    dead, slow, done = pushes.begin(
        conn, [("http://a.example.com/dead", "https://a.example.com/dead"),
               ("http://a.example.com/slow", "https://a.example.com/slow"),
               ("http://a.example.com/done", "https://a.example.com/done")],
        reason="schedule", crawler="local", run_id="r1",
    )
    pushes.finish(conn, [pushes.Outcome(done, "rid-done", 1)])
    # The dead run's pushes were recorded over an hour ago; the slow one is still within its time.
    conn.execute("UPDATE pushes SET pushed_at = now() - interval '2 hours' WHERE push_id IN (%s, %s)", (dead, done))
    conn.execute("UPDATE pushes SET pushed_at = now() - interval '50 minutes' WHERE push_id = %s", (slow,))

    with dg.instance_for_test() as instance:
        evaluate_sensor(load_defs(), "recrawl_sensor", instance)

    rows = {r[0]: r[1:] for r in conn.execute("SELECT push_id, result, error, rid FROM pushes")}
    assert rows[dead][0] == "failed" and "ended before finishing" in rows[dead][1]
    assert rows[slow] == ("pending", None, None)
    assert rows[done] == ("pushed", None, "rid-done")
    assert pushes.expire_pending(conn) == 0  # done once
