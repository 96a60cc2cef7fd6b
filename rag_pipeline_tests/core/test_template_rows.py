"""A learned template as rows and back (core/template_rows.py), when it is learned again, and how
the UI's table tells it. Pure: the database round trip is in store/test_site_templates.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rag_pipeline.core.site_template import learn, learn_from
from rag_pipeline.core.template_pins import parse_pins
from rag_pipeline.core.template_rows import (TEXT_CAP, block_rows, blocks_by_kind, header_of, learning_due,
                                             template_of, top_blocks_markdown)
from rag_pipeline.core.template_strip import content_for_hash, strip
from rag_pipeline_tests.core.wrapped_site import Chrome, own_site, wrapped_site

PINS = parse_pins([{"as": "template", "glob": "We use cookies*"}, {"as": "content", "regex": r"^© 20\d\d"}])


def _varied_site() -> dict[str, str]:
    """The wrapped site with each page's own "Last updated" date: a volatile shape is learned."""
    urls = list(wrapped_site())
    return wrapped_site(Chrome(updated={url: f"2026-11-{1 + i % 28:02d}" for i, url in enumerate(urls)}))


def test_a_template_made_rows_and_made_again_is_the_same_and_strips_alike():
    pages = _varied_site()
    template = learn(pages, own_site, pins=PINS)
    assert template.blocks and template.sidebar_items and template.shapes and template.volatile_shapes
    again = template_of(header_of(template), block_rows(template))
    assert again == template      # every field: blocks, lookup sets, canonical pages, pins, counts
    redeployed = wrapped_site(Chrome().redeployed())
    for url in list(pages)[:20]:
        assert strip(redeployed[url], again, url) == strip(redeployed[url], template, url)
        assert content_for_hash(redeployed[url], again, url) == content_for_hash(redeployed[url], template, url)


def test_shared_prose_keeps_its_canonical_page_through_the_rows():
    licence = ("This documentation is licensed under the Creative Commons Attribution licence, and every "
               "example in it may be copied into your own project without asking.")
    pages = {f"https://legal.example.org/p{i}/": f"# Page {i}\n\nOwn text of page {i}.\n\n{licence}" for i in range(8)}
    template = learn(pages, lambda url: url.startswith("https://legal.example.org/"))
    again = template_of(header_of(template), block_rows(template))
    assert again.canonical == template.canonical and len(again.canonical) == 1
    (home,) = again.canonical.values()
    assert licence in strip(pages[home], again, home).content


def test_only_the_display_text_is_capped():
    long = "word " * 1_000
    pages = {f"https://x.example.org/{i}/": f"# T{i}\n\nOwn {i}.\n\n{long}" for i in range(6)}
    template = learn(pages, lambda url: False)
    rows = block_rows(template)
    (capped,) = [row[6] for row in rows if len(row[6]) > 100]
    assert len(capped) == TEXT_CAP and capped.endswith("…")
    again = template_of(header_of(template), rows)
    assert again.texts == template.texts and again.canonical == template.canonical


def test_learn_from_a_stream_in_url_order_is_learn():
    pages = wrapped_site()
    assert learn_from(iter(sorted(pages.items())), own_site) == learn(pages, own_site)


def test_learning_is_due_when_never_done_old_or_the_pages_moved_by_more_than_a_tenth():
    now = datetime(2026, 12, 1, tzinfo=UTC)
    day = timedelta(days=1)
    assert learning_due(None, None, 0, now, day) == "never learned"
    assert learning_due(now - day, 100, 100, now, day) == "learned more than 1 day, 0:00:00 ago"
    assert learning_due(now - timedelta(hours=23), 100, 110, now, day) is None
    assert learning_due(now - timedelta(hours=23), 100, 111, now, day).startswith("pages moved from 100 to 111")
    assert learning_due(now - timedelta(hours=23), 100, 89, now, day).startswith("pages moved from 100 to 89")
    assert learning_due(now - timedelta(hours=1), 0, 1, now, day).startswith("pages moved from 0 to 1")


def test_the_ui_table_lists_the_most_seen_blocks_with_an_example_page():
    template = learn(wrapped_site(), own_site)
    table = top_blocks_markdown(template.blocks, limit=3)
    lines = table.splitlines()
    assert lines[0] == "| kind | why | pages seen | scope | example page | text |"
    assert len([line for line in lines if line.startswith("| ") and "https://docs.example.org/" in line]) == 3
    assert f"… and {len(template.blocks) - 3} more" in table
    assert sum(blocks_by_kind(template.blocks).values()) == len(template.blocks)
    assert top_blocks_markdown(()) == "no template blocks learned"
