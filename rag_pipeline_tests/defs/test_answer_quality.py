"""A site's labelled questions as a Dagster asset: its sensor asks for an evaluation once the
site's pages settle, the run plots recall@10 and MRR, the check goes red on a fall past the margin
from the recent best, and a bad questions file fails that run alone, naming its line."""

from __future__ import annotations

import dagster as dg
import pytest

from rag_pipeline.defs.quality.site_quality import QUALITY_CHECK, quality_due
from rag_pipeline.ingest.routing import route_batch
from rag_pipeline.store import evaluations as store
from rag_pipeline_tests import quality_corpus as corpus
from rag_pipeline_tests.harness import configure, evaluate_sensor, load_defs
from rag_pipeline_tests.ingest.pagework import MAX, CountingEmbedder, index, put

KEY = dg.AssetKey(["docs", "answer_quality"])


@pytest.fixture
def site(conn, database_url, tmp_path, monkeypatch):
    folder = tmp_path / "sites"
    questions = corpus.declare(folder, other_words=False)
    configure(monkeypatch, SITES_DIR=str(folder), SAMPLE_SITE_URL=None, DATABASE_URL=database_url,
              EMBEDDING_PROVIDER="hash", EMBEDDING_DIMENSIONS="64")
    for url, text in corpus.pages().items():
        put(conn, url, text)
    route_batch(conn, 1000, MAX)
    embedder = CountingEmbedder()
    for url in corpus.pages():
        index(conn, url, embedder)
    conn.execute("UPDATE pages SET site = 'docs'")
    return questions


def run(defs: dg.Definitions, instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    return defs.resolve_job_def("docs_answer_quality").execute_in_process(instance=instance, raise_on_error=False)


def test_the_site_is_evaluated_once_settled_plotted_and_checked(site, conn):
    defs = load_defs()
    assert defs.resolve_assets_def(KEY).check_keys == {dg.AssetCheckKey(KEY, QUALITY_CHECK)}
    with dg.instance_for_test() as instance:
        # Pages changed a moment ago: still being written, not evaluated yet.
        skipped = evaluate_sensor(defs, "docs_quality_sensor", instance)
        assert not skipped.run_requests
        conn.execute("UPDATE pages SET last_changed_at = now() - interval '1 minute'")
        due = evaluate_sensor(defs, "docs_quality_sensor", instance)
        (request,) = due.run_requests
        assert request.tags["rag/quality_due"] == "first evaluation"

        first = run(defs, instance)
        assert first.success
        (materialization,) = first.asset_materializations_for_node(defs.resolve_assets_def(KEY).op.name)
        meta = materialization.metadata
        assert meta["questions"].value == len(corpus.QUESTIONS) and meta["stale_questions"].value == 0
        assert meta["recall_at_10"].value >= 0.75 and 0 < meta["mrr"].value <= meta["recall_at_10"].value
        (check,) = first.get_asset_check_evaluations()
        assert check.passed and check.metadata["recent_best"].value.startswith("none yet")
        # Evaluated since the pages last changed: nothing to do until they change again.
        assert not evaluate_sensor(defs, "docs_quality_sensor", instance).run_requests

        # The same questions in other words: the hash model finds fewer, the check goes red.
        site.write_text(corpus.questions_jsonl(other_words=True))
        worse = run(defs, instance)
        assert worse.success     # the evaluation itself worked; its check says the quality fell
        (check,) = worse.get_asset_check_evaluations()
        fell = check.metadata["recall_at_10"].value
        assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
        assert check.metadata["recent_best"].value == meta["recall_at_10"].value > fell + 0.05
        recorded = conn.execute("SELECT recall, jsonb_array_length(failing) FROM answer_evaluations"
                                " WHERE site = 'docs' ORDER BY evaluated_at").fetchall()
        assert [round(r, 4) for r, _ in recorded] == [meta["recall_at_10"].value, fell]
        assert recorded[1][1] == round(len(corpus.QUESTIONS) * (1 - fell))

        # A typo in the file fails this run alone, naming the line.
        site.write_text(corpus.questions_jsonl(other_words=False) + '{"question": "q", "ur": "/x"}\n')
        broken = run(defs, instance)
        assert not broken.success
        failure = broken.get_step_failure_events()[0].step_failure_data.user_failure_data
        assert failure.description.startswith(f"{site}:{len(corpus.QUESTIONS) + 1}: unknown key 'ur'")


def test_a_tombstoned_answer_page_makes_its_question_stale_not_a_miss(site, conn):
    conn.execute("UPDATE pages SET deleted_at = now() WHERE url = %s", (corpus.url("otters"),))
    assert store.passages_of(conn, [corpus.url("otters")]) == {}
    defs = load_defs()
    with dg.instance_for_test() as instance:
        result = run(defs, instance)
        (materialization,) = result.asset_materializations_for_node(defs.resolve_assets_def(KEY).op.name)
        assert materialization.metadata["stale_questions"].value == 1
        assert materialization.metadata["questions"].value == len(corpus.QUESTIONS) - 1


def test_when_a_site_is_due():
    from datetime import UTC, datetime, timedelta

    now = datetime(2026, 12, 7, 12, tzinfo=UTC)
    ago = lambda s: now - timedelta(seconds=s)   # noqa: E731
    assert quality_due(None, None, now, 3600) is None                   # nothing indexed
    assert quality_due(None, ago(5), now, 3600) is None                 # still being written
    assert quality_due(None, ago(60), now, 3600) == "first evaluation"
    assert quality_due(ago(120), ago(60), now, 3600) == "its pages changed"
    assert quality_due(ago(30), ago(60), now, 3600) is None
    assert quality_due(ago(4000), ago(5000), now, 3600) == "every 3600 s"
