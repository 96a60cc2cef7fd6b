"""Nothing grows without bound: the ledger rolls up with its totals exact, a retired space's table
goes after its retention unless kept, and Dagster's finished runs go with their events."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import dagster as dg
from click.testing import CliRunner

from rag_pipeline.cli import main as cli
from rag_pipeline.defs.maintenance.jobs import delete_finished_runs
from rag_pipeline.store import growth, retention, space_vectors, spaces, status
from rag_pipeline.store.prune_policy import Policy


def ledger_row(conn, space_id: int, days_ago: float, tokens: int, run_id: str = "r") -> None:
    """A row recorded now (``days_ago`` 0), or ``days_ago`` before today's UTC noon, so which UTC day
    a row falls on does not depend on the hour the test runs."""
    now = datetime.now(UTC)
    at = now if days_ago == 0 else now.replace(hour=12, minute=0, second=0, microsecond=0) - timedelta(days=days_ago)
    conn.execute(
        "INSERT INTO embedding_ledger (run_id, page_url, space_id, chunks_total, chunks_embedded, tokens_embedded,"
        " tokens_reused, requests, recorded_at) VALUES (%s, 'https://example.com/p', %s, 3, 1, %s, 7, 1, %s)",
        (run_id, space_id, tokens, at))


def table_exists(conn, space_id: int) -> bool:
    return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"space_vectors_{space_id}",)).fetchone()[0]


def test_old_ledger_rows_roll_up_into_daily_totals_that_add_up_to_the_same(conn):
    space = spaces.ensure_active(conn, "m", 8)
    for days_ago, tokens in ((120, 10), (120.01, 20), (100, 40), (5, 80), (0, 160)):
        ledger_row(conn, space.space_id, days_ago, tokens)
    before = status.ledger_totals(conn)

    result = retention.prune(conn, Policy(ledger_days=90), dry_run=True)
    assert result.ledger_rolled_up == 3
    assert conn.execute("SELECT count(*) FROM embedding_ledger").fetchone()[0] == 5   # a dry run moves nothing

    result = retention.prune(conn, Policy(ledger_days=90, batch_size=2))
    assert result.ledger_rolled_up == 3 and result.batches["ledger"] == 2
    assert conn.execute("SELECT count(*) FROM embedding_ledger").fetchone()[0] == 2
    daily = conn.execute("SELECT switches, tokens_embedded FROM embedding_ledger_daily ORDER BY day").fetchall()
    assert sorted(daily) == [(1, 40), (2, 30)]
    assert status.ledger_totals(conn) == before                     # all-time totals are exact
    assert status.ledger_totals(conn, since_minutes=60)["tokens_embedded"] == 160
    assert "rolled up 3 row(s)" in " ".join(result.lines(Policy(ledger_days=90)))

    ledger_row(conn, space.space_id, 120, 1)                         # the same day again: added to its row
    retention.prune(conn, Policy(ledger_days=90))
    assert conn.execute("SELECT sum(switches), sum(tokens_embedded) FROM embedding_ledger_daily").fetchone() == (4, 71)


def retire(conn, days_ago: float) -> spaces.Space:
    """A space that was active, retired ``days_ago`` by a switch to a new model."""
    old = spaces.ensure_active(conn, "old-model", 8)
    new = spaces.ensure_building(conn, "new-model", 8)
    assert space_vectors.flip(conn, new)
    conn.execute("UPDATE embedding_spaces SET retired_at = now() - make_interval(secs => %s) WHERE space_id = %s",
                 (days_ago * 86_400, old.space_id))
    return old


def test_a_retired_space_table_is_dropped_after_its_retention_unless_kept(conn, database_url, monkeypatch):
    old = retire(conn, days_ago=20)
    assert table_exists(conn, old.space_id)

    assert retention.prune(conn, Policy(retired_space_days=30)).retired_tables == []   # not due yet
    monkeypatch.setenv("DATABASE_URL", database_url)
    kept = CliRunner().invoke(cli, ["space", "keep", str(old.space_id)])
    assert kept.exit_code == 0, kept.output
    assert retention.prune(conn, Policy(retired_space_days=14)).retired_tables == []   # kept
    assert table_exists(conn, old.space_id)
    assert "is kept" in CliRunner().invoke(cli, ["space", "list"]).output

    CliRunner().invoke(cli, ["space", "keep", str(old.space_id), "--release"])
    assert retention.prune(conn, Policy(retired_space_days=14), dry_run=True).retired_tables == [old.space_id]
    assert table_exists(conn, old.space_id)                                              # a dry run drops nothing
    assert retention.prune(conn, Policy(retired_space_days=14)).retired_tables == [old.space_id]
    assert not table_exists(conn, old.space_id)
    assert spaces.active(conn).model == "new-model" and table_exists(conn, spaces.active(conn).space_id)
    listed = CliRunner().invoke(cli, ["space", "list"]).output
    assert "its table was dropped" in listed

    again = CliRunner().invoke(cli, ["space", "keep", str(old.space_id)])
    assert again.exit_code == 1 and "was dropped" in again.output
    unknown = CliRunner().invoke(cli, ["space", "keep", "999"])
    assert unknown.exit_code == 1 and "no embedding space 999" in unknown.output

    # Building that model again makes its table anew.
    rebuilt = spaces.ensure_building(conn, "old-model", 8)
    assert rebuilt.space_id == old.space_id and table_exists(conn, old.space_id)
    assert growth.retired_tables(conn) == {}


def test_finished_housekeeping_runs_go_with_their_events_and_index_runs_stay():
    @dg.op
    def noop() -> None:
        return None

    @dg.job(name="push")
    def push():
        noop()

    @dg.job(name="docs_discovery")
    def discovery():
        noop()

    @dg.job(name="index_batch")
    def index_batch():
        noop()

    with dg.instance_for_test() as instance:
        housekeeping = [job.execute_in_process(instance=instance).run_id for job in (push, discovery, push)]
        kept = index_batch.execute_in_process(instance=instance).run_id
        assert delete_finished_runs(instance, datetime.now(UTC) - timedelta(days=1)) == 0
        soon = datetime.now(UTC) + timedelta(seconds=5)
        assert delete_finished_runs(instance, soon, dry_run=True, page=2) == 3
        assert len(instance.get_run_records()) == 4
        assert delete_finished_runs(instance, soon, page=2) == 3
        assert [r.dagster_run.run_id for r in instance.get_run_records()] == [kept]
        assert all(not instance.all_logs(run_id) for run_id in housekeeping)
        assert instance.all_logs(kept)
