"""Index economics: text is embedded once, noise is not change, re-chunks reuse every vector they can."""

from __future__ import annotations

import dataclasses
import json

import dagster as dg
import pytest
from click.testing import CliRunner

import rag_pipeline.core.chunking as chunking
from rag_pipeline.cli import main as cli
from rag_pipeline.core.urls import chunk_id
from rag_pipeline.embedders.hash_embedder import HashEmbedder
from rag_pipeline.ingest import backfill, indexing
from rag_pipeline.ingest.routing import route_batch
from rag_pipeline.settings import get_settings
from rag_pipeline.store import db, search, spaces
from rag_pipeline_tests.harness import Pipeline, batch_pages, configure, evaluate_sensor, load_defs
from rag_pipeline_tests.ingest.pagework import MAX, CountingEmbedder, doc, index, put

def test_same_text_on_two_urls_is_embedded_once_and_both_are_cited(db_conn):
    embedder = CountingEmbedder()
    text = doc(3)
    for url in ("https://a.example.com/copy", "https://b.example.com/copy"):
        put(db_conn, url, text)
    queued = route_batch(db_conn, 100, MAX).queued
    assert len(queued) == 2
    first = index(db_conn, "https://a.example.com/copy", embedder)
    second = index(db_conn, "https://b.example.com/copy", embedder)
    assert first.chunks_embedded == first.chunks_total > 0
    assert second.chunks_embedded == 0 and second.tokens_reused > 0 and second.requests == 0
    assert len(embedder.inputs) == len(set(embedder.inputs)) == first.chunks_total
    space = spaces.active(db_conn)
    hits = search.nearest(db_conn, space, embedder.embed(["topic1 details"]).vectors[0], k=10)
    assert {"https://a.example.com/copy", "https://b.example.com/copy"} <= {h.url for h in hits}


def test_ids_are_stable_and_a_shorter_page_loses_its_tail(db_conn):
    embedder = CountingEmbedder()
    url = "https://example.com/long"
    put(db_conn, url, doc(8))
    route_batch(db_conn, 100, MAX)
    long_result = index(db_conn, url, embedder)
    ids_long = [r[0] for r in db_conn.execute(
        "SELECT chunk_id FROM chunks ORDER BY chunk_index").fetchall()]
    assert ids_long == [chunk_id(url, i) for i in range(long_result.chunks_total)]

    put(db_conn, url, doc(3))
    route_batch(db_conn, 100, MAX)
    short_result = index(db_conn, url, embedder)
    ids_short = [r[0] for r in db_conn.execute("SELECT chunk_id FROM chunks ORDER BY chunk_index").fetchall()]
    assert short_result.chunks_total < long_result.chunks_total
    assert ids_short == ids_long[: short_result.chunks_total]  # same IDs for the same positions
    assert short_result.chunks_embedded == 0  # the head's texts were all embedded before


def test_footer_date_is_not_a_change(db_conn):
    url = "https://example.com/footer"
    put(db_conn, url, doc(2) + "\n\nLast updated: 2024-05-01 10:32 UTC\n\n© 2024 Example Inc.")
    route_batch(db_conn, 100, MAX)
    index(db_conn, url, CountingEmbedder())
    put(db_conn, url, doc(2) + "\n\nLast updated: 2025-11-29 08:00 UTC\n\n© 2025 Example Inc.")
    routed = route_batch(db_conn, 100, MAX)
    assert routed.queued == [] and dict(routed.outcomes) == {"unchanged": 1}


def test_operator_rules_file_filters_a_session_banner(db_conn, tmp_path, monkeypatch):
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "- name: session-banner\n"
        "  pattern: '^Your session id is [0-9a-f]+\\.\\n?'\n"
        "  url_pattern: '^https://app\\.example\\.com/'\n"
        "  flags: [MULTILINE]\n"
    )
    monkeypatch.setenv("BOILERPLATE_RULES", str(rules))
    get_settings.cache_clear()
    url = "https://app.example.com/docs"
    put(db_conn, url, "Your session id is 1a2b.\n\n" + doc(1))
    route_batch(db_conn, 100, MAX)
    index(db_conn, url, CountingEmbedder())
    put(db_conn, url, "Your session id is 9f9f.\n\n" + doc(1))
    assert dict(route_batch(db_conn, 100, MAX).outcomes) == {"unchanged": 1}
    # The rule is scoped to its URL pattern: elsewhere the banner is content.
    other = "https://other.example.com/docs"
    put(db_conn, other, "Your session id is 1a2b.\n\n" + doc(1))
    route_batch(db_conn, 100, MAX)
    index(db_conn, other, CountingEmbedder())
    put(db_conn, other, "Your session id is 9f9f.\n\n" + doc(1))
    assert len(route_batch(db_conn, 100, MAX).queued) == 1


def test_a_broken_rules_file_is_a_clear_error(tmp_path):
    from rag_pipeline.ingest.rules import RulesFileError, boilerplate_rules

    bad = tmp_path / "bad.yaml"
    bad.write_text("- name: x\n  pattern: '(unclosed'\n")
    with pytest.raises(RulesFileError, match="bad.yaml"):
        boilerplate_rules(bad)
    with pytest.raises(RulesFileError, match="cannot be read"):
        boilerplate_rules(tmp_path / "missing.yaml")


def test_rechunk_backfill_embeds_only_changed_texts_and_never_crawls(database_url, monkeypatch, hash_embedded):
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("EMBEDDING_PROVIDER", "hash")
    monkeypatch.setenv("EMBEDDING_DIMENSIONS", "64")
    get_settings.cache_clear()
    seen = hash_embedded()
    urls = [f"https://example.com/p{i}" for i in range(3)]
    with dg.instance_for_test() as instance, db.connection(database_url) as conn:
        conn.autocommit = True
        pipeline = Pipeline(instance, load_defs())
        for i, url in enumerate(urls):
            put(conn, url, doc(4, tag=f" p{i}"))
        assert sorted(pipeline.tick().partitions) == urls
        chunks_before = conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
        verified_before = dict(conn.execute("SELECT url, last_verified_at FROM pages").fetchall())
        deliveries_before = conn.execute("SELECT count(*) FROM deliveries").fetchone()[0]
        seen.clear()

        # A new chunker version that changes one chunk text per page and keeps the rest.
        real_chunk = chunking.chunk_markdown

        def new_chunker(text, max_tokens=512, overlap_tokens=64, window=None):
            pieces = real_chunk(text, max_tokens, overlap_tokens, window)
            return [dataclasses.replace(pieces[0], embed_text=pieces[0].embed_text + " (v2)"), *pieces[1:]]

        monkeypatch.setattr(chunking, "CHUNKER_VERSION", "test-v2")
        monkeypatch.setattr(indexing, "chunk_markdown", new_chunker)
        monkeypatch.setattr(backfill, "chunk_markdown", new_chunker)

        configure(monkeypatch, EMBEDDING_PRICE_PER_MTOK="0.13")
        result = CliRunner().invoke(cli, ["backfill", "plan", "--json"])
        assert result.exit_code == 0, result.output
        plan = json.loads(result.output)
        assert plan["pages"] == 3
        assert plan["chunks_to_embed"] == 3
        assert plan["chunks_total"] == chunks_before
        # The rows it writes (issue 44, point 5): one chunk text a page is new, the rest keep theirs.
        assert (plan["rows_written"], plan["rows_live"], plan["sampled"]) == (3, chunks_before, False)
        sampled = json.loads(CliRunner().invoke(cli, ["backfill", "plan", "--sample", "2", "--json"]).output)
        assert (sampled["pages"], sampled["sampled_pages"], sampled["sampled"]) == (3, 2, True)
        assert sampled["rows_written"] == 3            # 1 a page, scaled from the 2 re-cut to the 3
        # Priced at the reference price (issue 44, point 5): the tokens it would embed, in dollars.
        price = 0.13
        assert plan["price_per_mtok_usd"] == price
        assert plan["cost_usd"] == round(plan["tokens_to_embed"] / 1e6 * price, 6) > 0
        assert seen == []  # the plan never calls the embedder
        shown = CliRunner().invoke(cli, ["backfill", "plan"])      # not on a terminal: a plain last line
        # It only planned: it says what a re-chunk would do, never that pages were re-chunked.
        assert shown.stderr.splitlines() == ["  3 of 3 pages planned (cut in memory, nothing written)"]
        assert "3 page(s) would be re-chunked (a plan: nothing was changed)" in shown.stdout
        assert f"  cost: ${plan['cost_usd']:,.6f} at ${price} per million tokens" in shown.stdout
        assert f"  vector rows written: 3 of {chunks_before} live now" in shown.stdout
        # Its time: 3 pages applied say nothing of a pace (test_rechunk_scale.py measures one).
        assert plan["estimate_s"] is None and plan["measured_pages_per_s"] is None
        assert "  time: no batch measured yet to estimate the time from" in shown.stdout
        assert "re-chunked" not in shown.stderr

        requests = evaluate_sensor(pipeline.defs, "rechunk_sensor", instance).run_requests
        assert len(requests) == 1 and sorted(batch_pages(requests[0])) == urls   # one batch run
        # A second look while the batch holds the pages finds nothing to add.
        assert not evaluate_sensor(pipeline.defs, "rechunk_sensor", instance).run_requests
        outcome = pipeline.job.execute_in_process(run_config=requests[0].run_config, instance=instance,
                                                  tags=requests[0].tags)
        assert outcome.success
        for url in urls:   # each page re-cut on its own partition, with no new `pages` materialization
            for asset, count in (("pages", 1), ("chunks", 2), ("embeddings", 2)):
                records = instance.fetch_materializations(
                    dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[url]), limit=5).records
                assert len(records) == count, (url, asset)

        assert len(seen) == 3 and all(t.endswith(" (v2)") for t in seen)
        assert conn.execute("SELECT count(*) FROM deliveries").fetchone()[0] == deliveries_before
        assert dict(conn.execute("SELECT url, last_verified_at FROM pages").fetchall()) == verified_before
        assert {r[0] for r in conn.execute("SELECT DISTINCT chunker_version FROM chunks").fetchall()} == {
            chunking.chunker_signature(512, 64)}
        assert not evaluate_sensor(pipeline.defs, "rechunk_sensor", instance).run_requests
        replan = json.loads(CliRunner().invoke(cli, ["backfill", "plan", "--json"]).output)
        assert replan["pages"] == 0


def test_status_sums_the_ledger(db_conn, database_url, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", database_url)
    get_settings.cache_clear()
    embedder = CountingEmbedder()
    put(db_conn, "https://example.com/s1", doc(3))
    put(db_conn, "https://example.com/s2", doc(3))  # same text: all reused
    route_batch(db_conn, 100, MAX)
    a = index(db_conn, "https://example.com/s1", embedder)
    b = index(db_conn, "https://example.com/s2", embedder)
    out = CliRunner().invoke(cli, ["status", "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    assert report["embedding"]["chunks_embedded"] == a.chunks_embedded + b.chunks_embedded
    assert report["embedding"]["tokens_reused"] == b.tokens_reused > 0
    assert report["pages"]["indexed"] == 2


def test_a_model_switch_is_refused_with_a_clear_message(db_conn):
    url = "https://example.com/m"
    put(db_conn, url, doc(1))
    route_batch(db_conn, 100, MAX)
    index(db_conn, url, CountingEmbedder())
    put(db_conn, url, doc(2))
    route_batch(db_conn, 100, MAX)
    with pytest.raises(spaces.SpaceMismatch, match="active embedding space is hash-v1-64"):
        index(db_conn, url, HashEmbedder(dimensions=32))
    # The page still shows its previous version, whole.
    assert db_conn.execute("SELECT count(*) FROM chunks").fetchone()[0] > 0


def test_the_sensor_routes_with_the_rules_file_its_settings_resource_names(db_conn, database_url, tmp_path,
                                                                          monkeypatch):
    from rag_pipeline.defs.resources import SettingsResource
    from rag_pipeline.ingest.rules import boilerplate_rules

    rules = tmp_path / "rules.yaml"
    rules.write_text("- name: session-banner\n  pattern: '^Your session id is [0-9a-f]+\\.\\n?'\n"
                     "  flags: [MULTILINE]\n")
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.delenv("BOILERPLATE_RULES", raising=False)   # the process has none: only the resource
    get_settings.cache_clear()
    url = "https://app.example.com/banner"
    put(db_conn, url, "Your session id is 1a2b.\n\n" + doc(1))
    route_batch(db_conn, 100, MAX, rules=boilerplate_rules(rules))
    index(db_conn, url, CountingEmbedder())
    delivery = put(db_conn, url, "Your session id is 9f9f.\n\n" + doc(1))
    defs = load_defs()
    resources = {**defs.resources, "settings": SettingsResource(overrides={"BOILERPLATE_RULES": str(rules)})}
    with dg.instance_for_test() as instance, \
            dg.build_sensor_context(instance=instance, resources=resources) as context:
        result = defs.resolve_sensor_def("delivery_sensor")(context)
    assert not result.run_requests
    assert db_conn.execute("SELECT outcome FROM deliveries WHERE id = %s", (delivery,)).fetchone()[0] == "unchanged"
    # The tick list says what the tick did.
    assert result.skip_reason.skip_message == "routed 1 unchanged; no page needs a run"
