"""Issue 45 point 4 through the real daemon: a model switch is gated on the sites' labelled
questions. A better model is let through (`space activate`); a deliberately worse one (the hash
embedder) is refused, by the CLI and by the `space_activate` run the daemon launches, with both
spaces' figures in the message and in the run's failure (what the UI shows); `force` switches
anyway, and the switch is recorded as forced."""

from __future__ import annotations

import json
import subprocess
import uuid

import dagster as dg
import pytest
from click.testing import CliRunner

from rag_pipeline.cli import main as cli
from rag_pipeline.embedders.hash_embedder import HashEmbedder
from rag_pipeline.embedders.local_embedder import LocalEmbedder
from rag_pipeline.ingest import model_switch
from rag_pipeline.ingest.routing import route_batch
from rag_pipeline.store import db, spaces
from rag_pipeline_tests import quality_corpus as corpus
from rag_pipeline_tests.daemons import BIN, CHECKOUT, daemon_stack
from rag_pipeline_tests.harness import configure
from rag_pipeline_tests.ingest.pagework import MAX, index, put


@pytest.fixture
def dagster_url(database_url):
    return db.as_url(db.with_database(database_url, f"dagster_{uuid.uuid4().hex[:8]}"))


def launch(force: bool) -> str:
    """The run as the UI's Launchpad submits it: to the instance's run queue, for the daemon."""
    run_id = str(uuid.uuid4())
    config = {"ops": {"activate_space": {"config": {"force": force}}}}
    done = subprocess.run([str(BIN / "dagster"), "job", "launch", "-w", str(CHECKOUT / "workspace.yaml"),
                           "-j", "space_activate", "--config-json", json.dumps(config), "--run-id", run_id],
                          cwd=CHECKOUT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return run_id


def ended(daemon, run_id: str) -> dg.DagsterRun:
    return daemon.wait(lambda: (r := daemon.instance.get_run_by_id(run_id)) is not None and r.is_finished and r,
                       180, f"run {run_id[:8]} finished")


def activations(conn) -> list[tuple]:
    return conn.execute("SELECT a.space_id, s.model, a.forced, a.figures FROM space_activations a"
                        " JOIN embedding_spaces s USING (space_id) ORDER BY a.activated_at").fetchall()


@pytest.mark.timeout(600)
def test_a_worse_model_is_refused_with_the_figures_and_forced_on_record(database_url, dagster_url, conn, tmp_path,
                                                                         monkeypatch):
    folder = tmp_path / "sites"
    corpus.declare(folder, other_words=True)
    with daemon_stack(database_url, dagster_url, tmp_path, monkeypatch) as (_base, _fake, start):
        hashed = HashEmbedder(dimensions=64)
        for url, text in corpus.pages().items():
            put(conn, url, text)
        route_batch(conn, 1000, MAX)
        for url in corpus.pages():
            index(conn, url, hashed)
        assert spaces.active(conn).model == "hash-v1-64"

        # A better model: the offline one. Built, then let through by the gate, figures shown.
        configure(monkeypatch, SITES_DIR=str(folder), SAMPLE_SITE_URL=None, EMBEDDING_PROVIDER="local",
                  EMBEDDING_DIMENSIONS=None)
        model_switch.build(conn, LocalEmbedder())
        better = CliRunner().invoke(cli, ["space", "activate"])
        assert better.exit_code == 0, better.output
        lines = better.output.splitlines()
        assert lines[0].startswith("recall@10 and MRR, space 1 (hash-v1-64) (active) → space 2 (")
        assert lines[1].startswith(f"  docs: {len(corpus.QUESTIONS)} questions, recall@10 ")
        assert lines[-1].startswith("active: space 2 (")
        (first,) = activations(conn)
        assert first[2] is False and first[3][0]["candidate_recall"] > first[3][0]["active_recall"] + 0.02

        # The worse model: the hash embedder again. The CLI refuses it, figures side by side, and
        # nothing changes.
        configure(monkeypatch, EMBEDDING_PROVIDER="hash", EMBEDDING_DIMENSIONS="64")
        model_switch.build(conn, hashed)
        refused = CliRunner().invoke(cli, ["space", "activate"])
        assert refused.exit_code == 1
        assert "refused: space 1 (hash-v1-64) answers worse than space 2" in refused.output
        assert "more than the margin 0.020" in refused.output, refused.output
        assert spaces.active(conn).space_id == 2

        # The job the UI runs, launched to the daemon's queue: the same refusal fails the run,
        # with the figures in its failure event.
        daemon = start(SITES_DIR=str(folder), EMBEDDING_PROVIDER="hash", EMBEDDING_DIMENSIONS="64")
        run_id = launch(force=False)
        assert ended(daemon, run_id).status == dg.DagsterRunStatus.FAILURE
        (failure,) = daemon.instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
        data = failure.dagster_event.step_failure_data.user_failure_data
        assert data.description.startswith("refused: space 1 (hash-v1-64) answers worse than space 2")
        assert "  docs: 8 questions, recall@10 " in data.description
        figures = data.metadata["figures"].value
        assert figures[0]["set"] == "docs" and figures[0]["candidate_recall"] < figures[0]["active_recall"] - 0.02
        assert spaces.active(conn).space_id == 2 and len(activations(conn)) == 1

        # force: true switches anyway, and says so on record.
        run_id = launch(force=True)
        assert ended(daemon, run_id).status == dg.DagsterRunStatus.SUCCESS, daemon.tail()
        assert spaces.active(conn).model == "hash-v1-64"
        forced = activations(conn)[-1]
        assert forced[1] == "hash-v1-64" and forced[2] is True and forced[3] == figures
