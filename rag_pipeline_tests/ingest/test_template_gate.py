"""A site's learned template through routing and the indexing steps: a redeploy is routed
unchanged (no run, no embedding, last_changed_at still, the newest text kept as the source), a
content edit is a change, the template stays out of the chunks and in the stored source, and
learning it again re-routes nothing."""

from __future__ import annotations

from rag_pipeline.core.site_spec import SiteSpec
from rag_pipeline.core.urls import normalize_url
from rag_pipeline.crawl.template_learning import learn_site
from rag_pipeline.ingest.routing import route_batch
from rag_pipeline.store import sites
from rag_pipeline_tests.core.wrapped_site import SITE, Chrome, content_pages, wrapped_site
from rag_pipeline_tests.ingest.pagework import MAX, CountingEmbedder, index, put

SPEC = SiteSpec(name="docs", seeds=(SITE + "/",))
NAV_ITEM = "[Getting started]("
FOOTER = "Build 4f3a9c1"


def crawl(conn, pages: dict[str, str], embedder) -> dict:
    """Every page delivered, routed, and the changed ones indexed: routing's outcomes."""
    for url, text in pages.items():
        put(conn, url, text)
    routed = route_batch(conn, 10_000, MAX)
    for item in routed.queued:
        index(conn, item.page_url, embedder)
    return dict(routed.outcomes)


def loaded(conn):
    sites.sync_declared(conn, [SPEC])
    embedder = CountingEmbedder()
    first = wrapped_site()
    assert crawl(conn, first, embedder) == {"queued": len(first)}
    learning = learn_site(conn, SPEC)
    assert learning.outcome == "learned" and learning.template.blocks
    return first, embedder


def row(conn, url: str):
    return conn.execute("SELECT last_changed_at, last_verified_at, source_text, indexed_hash FROM pages"
                        " WHERE url = %s", (normalize_url(url),)).fetchone()


def chunk_text(conn, url: str) -> str:
    return "\n".join(r[0] for r in conn.execute(
        "SELECT c.content FROM chunks c JOIN pages p USING (page_id) WHERE p.url = %s ORDER BY c.chunk_index",
        (normalize_url(url),)))


def test_a_redeploy_is_routed_unchanged_and_embeds_nothing(conn):
    first, embedder = loaded(conn)
    url = next(iter(first))
    changed_before, verified_before, source_before, hash_before = row(conn, url)
    embedder.inputs.clear()
    redeployed = wrapped_site(Chrome().redeployed())
    assert crawl(conn, redeployed, embedder) == {"unchanged": len(first)}
    assert embedder.inputs == []
    changed, verified, source, indexed = row(conn, url)
    assert changed == changed_before and verified > verified_before
    # The newest crawl, its template included, is the stored source (what is learned and re-cut
    # from), and is what the chunks reflect: no run is owed.
    assert "Build 9b2e771" in source and source != source_before and indexed != hash_before
    assert conn.execute("SELECT count(*) FROM pages WHERE indexed_hash IS DISTINCT FROM source_hash").fetchone()[0] == 0
    # The next redeploy compares against the cached key: still nothing.
    assert crawl(conn, wrapped_site(Chrome().redeployed().redeployed()), embedder) == {"unchanged": len(first)}


def test_a_content_edit_is_queued_and_cut_without_the_template(conn):
    first, embedder = loaded(conn)
    contents = content_pages()
    url = next(u for u in contents if "/topics/" in u)
    title, text = contents[url]
    edited = dict(contents, **{url: (title, text.replace("## Details", "## Details\n\nA sentence added.", 1))})
    embedder.inputs.clear()
    assert crawl(conn, wrapped_site(Chrome().redeployed(), edited), embedder) == {
        "queued": 1, "unchanged": len(first) - 1}
    cut = chunk_text(conn, url)
    assert "A sentence added." in cut
    assert NAV_ITEM not in cut and "Build 9b2e771" not in cut and "cookie policy" not in cut
    source = row(conn, url)[2]
    assert "Build 9b2e771" in source and NAV_ITEM in source   # the stored source keeps the whole page
    assert all("Build" not in text for text in embedder.inputs)
    # A page not re-cut keeps the chunks it had: a template learned is no reason to re-embed it.
    other = next(u for u in contents if u != url)
    assert FOOTER in chunk_text(conn, other)


def test_learning_the_template_again_routes_nothing_and_embeds_nothing(conn):
    first, embedder = loaded(conn)
    redeployed = wrapped_site(Chrome().redeployed())
    assert crawl(conn, redeployed, embedder) == {"unchanged": len(first)}
    tags = {r[0] for r in conn.execute("SELECT content_key_tag FROM pages")}
    assert learn_site(conn, SPEC, force=True).outcome == "learned"
    embedder.inputs.clear()
    assert crawl(conn, wrapped_site(Chrome().redeployed().redeployed()), embedder) == {"unchanged": len(first)}
    assert embedder.inputs == []
    assert {r[0] for r in conn.execute("SELECT content_key_tag FROM pages")}.isdisjoint(tags)


def test_a_stamp_in_a_pages_content_stops_routing_it_after_two_changes(conn):
    url = "https://stats.example.org/"
    page = "# Stats\n\nGenerated {at} for this site.\n\nThe dashboard lists every site's backlog."
    embedder = CountingEmbedder()
    assert crawl(conn, {url: page.format(at="2026-12-01 10:30")}, embedder) == {"queued": 1}
    assert crawl(conn, {url: page.format(at="2026-12-02 10:30")}, embedder) == {"queued": 1}   # one change: an edit
    assert crawl(conn, {url: page.format(at="2026-12-03 10:30")}, embedder) == {"unchanged": 1}
    assert crawl(conn, {url: page.format(at="2026-12-04 10:30")}, embedder) == {"unchanged": 1}
    edited = page.replace("backlog.", "backlog and its failures.")
    assert crawl(conn, {url: edited.format(at="2026-12-05 10:30")}, embedder) == {"queued": 1}
    assert "its failures" in chunk_text(conn, url)


def apply_all(conn, pages: dict[str, str]) -> None:
    """Delivered, routed and applied by one batch run's code (apply_batch), as index_batch does."""
    from rag_pipeline.ingest import batch_apply
    from rag_pipeline.store import deliveries

    for url, text in pages.items():
        put(conn, url, text)
    route_batch(conn, 10_000, MAX)
    work = deliveries.queued_work(conn, 10_000)
    events = list(batch_apply.apply_batch(
        conn, work, batch_key=None, embedder_for=lambda _space: CountingEmbedder(),
        chunk_budget=lambda _space: (512, 64), max_page_bytes=MAX, retry=batch_apply.RetryPolicy(3, 1.0)))
    assert not [e for e in events if isinstance(e, batch_apply.Failed)]


def test_a_young_sites_first_batch_learns_its_template_before_it_cuts(conn, database_url):
    import psycopg

    from rag_pipeline.store import site_templates

    sites.sync_declared(conn, [SPEC])
    site = wrapped_site()
    urls = sorted(site)
    apply_all(conn, {u: site[u] for u in urls[:10]})   # fewer than 20 pages: too young to learn
    assert site_templates.current(conn, ["docs"]) == {}
    # Another process learning the site: the batch cuts with what there is and goes on.
    with psycopg.connect(database_url, autocommit=True) as other:
        assert site_templates.try_learning_lock(other, "docs")
        apply_all(conn, {u: site[u] for u in urls[10:30]})
        assert site_templates.current(conn, ["docs"]) == {}
    apply_all(conn, {u: site[u] for u in urls[30:]})
    template, _ = site_templates.current(conn, ["docs"])["docs"]
    assert template.pages == len(urls)
    assert FOOTER not in chunk_text(conn, urls[-1]) and NAV_ITEM not in chunk_text(conn, urls[-1])
    assert FOOTER in chunk_text(conn, urls[0])   # cut before it was learned, and not re-cut since
