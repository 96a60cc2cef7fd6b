"""With duplicates, reordering, delays, crawler 503s, push API errors and a receiver outage, the
index ends equal to the site, and every push has its delivery or a visible failure."""

from __future__ import annotations

import time

from rag_pipeline.crawl.simulator import Faults
from rag_pipeline.settings import get_settings
from rag_pipeline_tests.crawl.conftest import make_sim
from rag_pipeline_tests.crawl.test_recrawl_e2e import Crawl, html
from rag_pipeline_tests.harness import Pipeline, load_defs

PAGES = 12
NASTY = Faults(delay_s=(0.0, 0.05), duplicate_rate=0.3, reorder_window=4, crawler_503_rate=0.2,
               push_error_rate=0.3, push_error_status=503)


def page_html(n: int, version: int) -> str:
    return html(f"Page {n}", f"Marker p{n}v{version}: page {n} at version {version} talks about topic {n * 7}.")


def drain(crawl: Crawl, pipeline: Pipeline) -> None:
    crawl.settle()
    crawl.sim.flush_held()
    crawl.settle()
    for _ in range(5):  # bounded: one tick routes everything delivered so far
        if not pipeline.tick().result.run_requests:
            break


def test_index_converges_to_the_site_under_faults(gate, site, conn, crawl_env, instance, tmp_path):
    crawl_env.setenv("CRAWLER_PUSH_MAX_RETRIES", "8")
    get_settings.cache_clear()
    version = {n: 1 for n in range(PAGES)}
    for n in range(PAGES):
        site.set_page(f"/p{n}", page_html(n, 1))
    seeds = tmp_path / "seeds.txt"
    seeds.write_text("".join(f"{site.url(f'/p{n}')} every=1h\n" for n in range(PAGES)))

    sim = make_sim(gate.webhook_url, crawl_env, faults=NASTY, concurrency=4, seed=7,
                   max_delivery_retries=8)
    try:
        defs = load_defs()
        pipeline, crawl = Pipeline(instance, defs), Crawl(instance, defs, sim)

        # Round 1 starts with the receiver down; it comes back once deliveries have bounced off it.
        gate.down.set()
        crawl.run("seed", "seed_pages", {"file": str(seeds)})
        for _ in range(100):
            if gate.refused >= 3:
                break
            time.sleep(0.03)
        gate.down.clear()
        drain(crawl, pipeline)
        assert gate.refused > 0

        # The site changes: edits, deletions, a redirect. Round 2, still faulty.
        for n in (0, 1, 2, 3):
            version[n] = 2
            site.set_page(f"/p{n}", page_html(n, 2))
        site.remove("/p4", status=404)
        site.remove("/p5", status=410)
        site.set_page("/p6-new", page_html(6, 2))
        site.redirect("/p6", "/p6-new", status=301)
        version[6] = 2
        crawl.run("recrawl_now", "push_matching", {"pattern": "*"})
        drain(crawl, pipeline)

        # The crawler recovers (duplicates and reordering go on): one more round of recrawls.
        sim.faults = Faults(duplicate_rate=0.3, reorder_window=4)
        crawl.run("recrawl_now", "push_matching", {"pattern": "*"})
        drain(crawl, pipeline)
    finally:
        sim.stop()

    def key(path: str) -> str:
        return site.url(path).replace("http://", "https://")

    rows = {r[0]: r[1:] for r in conn.execute(
        "SELECT url, source_text, source_hash, indexed_hash, deleted_at, alias_of FROM pages").fetchall()}
    chunk_text = dict(conn.execute(
        "SELECT p.url, string_agg(c.content, ' ') FROM chunks c JOIN pages p USING (page_id) GROUP BY 1"
    ).fetchall())
    for n in range(PAGES):
        if n in (4, 5):
            _, _, indexed_hash, deleted_at, _ = rows[key(f"/p{n}")]
            assert deleted_at is not None and indexed_hash is None and key(f"/p{n}") not in chunk_text
            continue
        url = key("/p6-new") if n == 6 else key(f"/p{n}")
        source_text, source_hash, indexed_hash, deleted_at, alias_of = rows[url]
        marker = f"Marker p{n}v{version[n]}"
        assert marker in source_text and marker in chunk_text[url], (url, source_text)
        assert indexed_hash == source_hash and deleted_at is None and alias_of is None
    assert rows[key("/p6")][4] == key("/p6-new") and key("/p6") not in chunk_text

    # Every push: delivered (stored once per rid, whatever the duplicates) or visibly failed.
    orphans = conn.execute(
        "SELECT p.push_id, p.url, p.result FROM pushes p WHERE p.result <> 'failed'"
        " AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.rid = p.rid)").fetchall()
    assert orphans == []
    assert conn.execute("SELECT count(*) FROM pushes WHERE result = 'pending'").fetchone()[0] == 0
    dup_rids = conn.execute("SELECT count(*) - count(DISTINCT rid) FROM deliveries").fetchone()[0]
    assert dup_rids == 0
    skipped = conn.execute("SELECT count(*) FROM deliveries WHERE crawler_status = 503").fetchone()[0]
    assert skipped == conn.execute(
        "SELECT count(*) FROM deliveries WHERE crawler_status = 503 AND outcome = 'skipped'").fetchone()[0]
