"""The index checks pass on a healthy index and name what is wrong on a broken one."""

import gzip
import uuid

import dagster as dg

from rag_pipeline.defs.index import checks
from rag_pipeline.settings import get_settings
from rag_pipeline.store import deliveries
from rag_pipeline_tests.harness import Pipeline, load_defs


def evaluations(instance) -> dict[str, dg.AssetCheckEvaluation]:
    result = load_defs().resolve_job_def("index_checks").execute_in_process(instance=instance)
    assert result.success
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def test_checks_pass_then_catch_a_broken_index(database_url, conn, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("EMBEDDING_PROVIDER", "hash")
    get_settings.cache_clear()
    with dg.instance_for_test() as instance:
        pipeline = Pipeline(instance, load_defs())
        for url in ("https://example.com/a", "https://example.com/b"):
            deliveries.insert(conn, rid=uuid.uuid4().hex, url=url, pushed_url=None, crawler_status=200,
                              original_status=200, content_type=None,
                              body=gzip.compress(b"# Title\n\nSome words about " + url.encode()),
                              body_encoding="gzip")
        assert len(pipeline.tick().partitions) == 2

        healthy = evaluations(instance)
        assert set(healthy) == {checks.INDEX_MATCHES_SOURCE, checks.NO_TOMBSTONED_CHUNKS,
                                checks.ONE_ACTIVE_SPACE, checks.NO_STUCK_DELIVERIES}
        assert all(e.passed for e in healthy.values()), healthy

        # Break the invariants by hand: a tombstone that kept its chunks, and an old unrouted delivery.
        conn.execute("UPDATE pages SET deleted_at = now() WHERE url = 'https://example.com/a'")
        deliveries.insert(conn, rid="stuck-1", url="https://example.com/c", pushed_url=None, crawler_status=200,
                          original_status=200, content_type=None, body=b"x", body_encoding="identity")
        conn.execute("UPDATE deliveries SET received_at = now() - interval '2 hours' WHERE rid = 'stuck-1'")
        broken = evaluations(instance)
        tomb = broken[checks.NO_TOMBSTONED_CHUNKS]
        assert not tomb.passed and tomb.severity == dg.AssetCheckSeverity.ERROR
        assert "https://example.com/a" in tomb.description
        stuck = broken[checks.NO_STUCK_DELIVERIES]
        assert not stuck.passed and "stuck-1" in stuck.description
        assert broken[checks.ONE_ACTIVE_SPACE].passed

        # A live chunk whose vector is missing from the space search reads.
        conn.execute("DELETE FROM space_vectors WHERE chunk_id IN (SELECT chunk_id FROM chunks c"
                     " JOIN pages p USING (page_id) WHERE p.url = 'https://example.com/b')")
        missing = evaluations(instance)[checks.ONE_ACTIVE_SPACE]
        assert not missing.passed and "https://example.com/b" in missing.description
