"""A site's learned template in PostgreSQL (store/site_templates.py): replaced whole, read back as the
same Template, its page sources streamed by keyset, and a learning that fails keeping the old one."""

from __future__ import annotations

import hashlib

import pytest

from rag_pipeline.core.site_spec import SiteSpec
from rag_pipeline.core.site_template import learn
from rag_pipeline.core.template_pins import parse_pins
from rag_pipeline.core.urls import normalize_url, page_id
from rag_pipeline.crawl.template_learning import learn_site
from rag_pipeline.store import pages as pages_store
from rag_pipeline.store import site_templates as store
from rag_pipeline_tests.core.wrapped_site import SITE, Chrome, own_site, wrapped_site

SPEC = SiteSpec(name="docs", seeds=(SITE + "/",))


def stored_pages(conn, pages: dict[str, str], site: str | None = "docs") -> None:
    """Pages as routing leaves them: a row each, with its newest crawl as the stored source."""
    urls = {normalize_url(url): text for url, text in pages.items()}
    pages_store.ensure_many(conn, [(page_id(u), u, u, site, None, "sitemap") for u in urls])
    pages_store.set_sources(conn, [(page_id(u), text, hashlib.sha256(text.encode()).hexdigest(), 1, 200)
                                   for u, text in urls.items()])


def test_a_replaced_template_reads_back_as_the_same_template(conn):
    pages = wrapped_site()
    template = learn(pages, own_site, pins=parse_pins([{"as": "template", "text": "Skip to main content"}]))
    first = store.replace(conn, "docs", template)
    learned = store.load(conn, "docs")
    assert learned.template == template and learned.learned_at == first and learned.error is None
    # Learned again: the blocks are replaced, not added to.
    smaller = learn(dict(list(pages.items())[:40]), own_site)
    store.replace(conn, "docs", smaller)
    assert store.load(conn, "docs").template == smaller
    assert conn.execute("SELECT count(*) FROM site_template_blocks").fetchone()[0] == len(smaller.blocks)
    assert store.load(conn, "other") is None


def test_the_sources_are_streamed_in_batches_and_only_the_sites_live_pages(conn):
    pages = wrapped_site()
    stored_pages(conn, pages)
    stored_pages(conn, {"https://elsewhere.example.org/a/": "# A\n\nNot docs."}, site="other")
    gone = normalize_url(next(iter(pages)))
    conn.execute("UPDATE pages SET deleted_at = now() WHERE url = %s", (gone,))
    statements = []
    real_execute = conn.execute

    def counting(query, *args, **kwargs):
        if "source_text FROM pages" in str(query):
            statements.append(query)
        return real_execute(query, *args, **kwargs)

    conn.execute = counting
    try:
        read = list(store.live_sources(conn, "docs", batch=10))
    finally:
        del conn.execute
    assert sorted(url for url, _ in read) == sorted(normalize_url(u) for u in pages if normalize_url(u) != gone)
    assert len(statements) == 9          # 87 live pages, 10 a statement
    assert store.live_count(conn, "docs") == 87


def test_a_failed_learning_keeps_the_old_template_and_says_why(conn):
    stored_pages(conn, wrapped_site())
    learned = learn_site(conn, SPEC)
    assert learned.outcome == "learned" and learned.reason == "never learned" and learned.template.pages == 88
    before = store.load(conn, "docs")
    # The database refuses the new blocks halfway through the replacing transaction.
    conn.execute("CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS"
                 " $$ BEGIN RAISE EXCEPTION 'disk full'; END $$")
    conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON site_template_blocks FOR EACH ROW EXECUTE FUNCTION refuse()")
    stored_pages(conn, wrapped_site(Chrome().redeployed()))
    failed = learn_site(conn, SPEC, force=True)
    assert failed.outcome == "failed" and "disk full" in failed.error and failed.template == before.template
    assert "template learning failed (asked for)" in failed.summary and "is kept" in failed.summary
    after = store.load(conn, "docs")
    assert after.template == before.template and after.learned_at == before.learned_at
    assert "disk full" in after.error and after.failed_at is not None
    conn.execute("DROP TRIGGER refuse ON site_template_blocks")
    again = learn_site(conn, SPEC, force=True)
    assert again.outcome == "learned" and store.load(conn, "docs").error is None


@pytest.mark.parametrize("moved, due", [(7, False), (8, True)])
def test_it_is_learned_again_when_the_pages_moved_by_more_than_a_tenth(conn, moved, due):
    pages = wrapped_site()
    urls = list(pages)
    stored_pages(conn, {u: pages[u] for u in urls[:70]})
    assert learn_site(conn, SPEC).outcome == "learned"
    assert learn_site(conn, SPEC).outcome == "kept"
    stored_pages(conn, {u: pages[u] for u in urls[70:70 + moved]})
    assert (learn_site(conn, SPEC).outcome == "learned") is due


def test_nothing_is_learned_before_any_page_has_a_source(conn):
    kept = learn_site(conn, SPEC)
    assert (kept.outcome, kept.reason, kept.template) == ("kept", "no page has a stored source yet", None)
    assert store.load(conn, "docs") is None
