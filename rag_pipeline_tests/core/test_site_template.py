"""Learning a site's template (issue 43, pure core): blocks, learning, never losing content, pins,
stripping and hashing, volatile lines from a page's history."""

from __future__ import annotations

import functools
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rag_pipeline.core.site_template import Template, learn
from rag_pipeline.core.template_blocks import cut_page, mask_volatile
from rag_pipeline.core.template_pins import Pin, parse_pins
from rag_pipeline.core.template_strip import content_for_hash, line_shape, strip
from rag_pipeline.core.text import normalize_markdown
from rag_pipeline.core.volatile_text import confirmed_volatile, note_volatile, volatile_lines
from rag_pipeline_tests.core.wrapped_site import SITE, Chrome, content_pages, own_site, wrapped_site

PROPERTY_SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def normalized(site: dict[str, str]) -> dict[str, str]:
    return {url: normalize_markdown(text) for url, text in site.items()}


@functools.cache
def contents() -> dict[str, tuple[str, str]]:
    return content_pages()


def first_chrome() -> Chrome:
    # Each page has its own "Last updated" date: the line differs page to page, its shape does not.
    return Chrome(updated={url: f"2026-11-{index % 28 + 1:02d}" for index, url in enumerate(contents())})


@functools.cache
def crawl() -> dict[str, str]:
    return normalized(wrapped_site(first_chrome(), contents()))


@functools.cache
def learned() -> Template:
    return learn(crawl(), own_site)


def url_in(section: str, position: int = 3) -> str:
    return sorted(url for url in crawl() if url.startswith(f"{SITE}/{section}/"))[position]


def uncovered(markdown: str, spans: tuple[tuple[int, int], ...]) -> str:
    """The page with the spans cut out, computed independently of strip()."""
    kept = [True] * len(markdown)
    for start, end in spans:
        for index in range(start, end):
            kept[index] = False
    return "".join(char for char, keep in zip(markdown, kept) if keep)


# --------------------------------------------------------------------------- blocks


def test_blocks_cover_the_page_and_name_their_kinds() -> None:
    url = url_in("ref")
    page = crawl()[url]
    blocks = cut_page(page, url)
    assert "".join(page[b.start : b.end] for b in blocks) == page
    kinds = [b.kind for b in blocks]
    assert kinds[:3] == ["line", "link_list", "line"]  # skip link, top navigation, cookie banner
    assert "heading" in kinds and "code" in kinds and "list_item" in kinds
    sidebar = [b for b in blocks if b.kind == "link_list"][1]
    assert len(sidebar.parts) == 25 and sidebar.targets[0] == f"{SITE}/ref/ref-with-part-1/"


def test_tables_are_not_candidates_so_a_shared_header_row_stays() -> None:
    blocks = cut_page("| a | b |\n|---|---|\n| 1 | 2 |", SITE + "/x/")
    assert [b.kind for b in blocks] == ["table"]
    site = {f"{SITE}/ref/f{n}/": f"# f{n}\n\n| Name | Type |\n|---|---|\n| arg{n} | int |" for n in range(8)}
    template = learn(site, own_site)
    url = f"{SITE}/ref/f3/"
    assert strip(site[url], template, url).content == site[url]


def test_a_loose_list_of_links_is_one_link_list_but_two_tight_lists_stay_apart() -> None:
    loose = cut_page("- [A](/a/)\n\n- [B](/b/)\n\n- C", SITE + "/x/")
    assert [b.kind for b in loose] == ["link_list"]
    tight = cut_page("- [A](/a/)\n- [B](/b/)\n- C\n\n- one thing\n- another thing", SITE + "/x/")
    assert [b.kind for b in tight] == ["link_list", "list_item", "list_item"]


def test_volatile_tokens_are_masked_in_the_shape() -> None:
    one = cut_page("Build 4f3a9c1 · 2026-12-01", SITE)[0]
    two = cut_page("Build 9b2e771 · 2026-12-07", SITE)[0]
    assert one.fingerprint != two.fingerprint and one.shape == two.shape
    assert mask_volatile("Build 4f3a9c1 · 2026-12-01") == "Build ‹hex› · ‹date›"
    assert mask_volatile("Updated Dec 7, 2026 at 10:30 UTC") == "Updated ‹date› at ‹time›"
    assert mask_volatile("Django 5.1.9, 1,234 views, id 3f2a1b4c-0d9e-4f5a-8b7c-6d5e4f3a2b1c") == (
        "Django ‹ver›, ‹n› views, id ‹hex›"
    )
    # Words made of hex letters are words; a hex id needs a digit and 7+ characters.
    assert mask_volatile("a decade of added feedback, cafe 12ab") == "a decade of added feedback, cafe 12ab"


# --------------------------------------------------------------------------- learning


def by(template: Template, how: str) -> dict[str, object]:
    return {block.text: block for block in template.blocks if block.by == how}


def test_learns_the_navigation_banner_footer_and_each_sections_sidebar() -> None:
    template = learned()
    pages = len(crawl())
    texts = by(template, "text")
    nav = next(b for b in template.blocks if b.kind == "link_list" and b.by == "text")
    assert nav.pages_seen == pages and nav.text.startswith("- [Home]")
    cookie = next(b for b in template.blocks if b.text.startswith("We use cookies"))
    assert cookie.by == "text" and cookie.canonical_url is not None and cookie.pages_seen == pages
    shapes = {b.text: b for b in template.blocks if b.by == "shape"}
    assert shapes["Last updated ‹date›"].kind == "volatile"  # a different date on each page
    assert any(text.startswith("Build 4f3a9c1") for text in shapes)  # one build on every page
    sidebars = {b.scope: b for b in template.blocks if b.by == "sidebar"}
    assert set(sidebars) == {"section intro", "section topics", "section ref", "section howto"}
    assert sidebars["section ref"].pages_seen == 40 and sidebars["section ref"].example_url.startswith(SITE + "/ref/")
    for block in template.blocks:
        assert block.example_url in crawl() and block.pages_seen >= 5
    assert not any("Details" in text or "```" in text for text in texts)


def test_stripping_leaves_the_pages_own_content() -> None:
    url = url_in("ref")
    title, content = contents()[url]
    split = strip(crawl()[url], learned(), url)
    assert split.content.strip() == normalize_markdown(content)
    assert "In this section" not in split.content  # its heading went with the sidebar


def test_learning_is_deterministic_whatever_the_order_of_pages() -> None:
    reversed_pages = dict(reversed(list(crawl().items())))
    assert learn(reversed_pages, own_site) == learned()
    assert learn(crawl(), set(u for u in crawl()) | {f"{SITE}/{p}/" for p in ("home", "faq")}).texts


def test_a_block_of_one_sections_pages_is_template_in_that_section() -> None:
    site = dict(crawl())
    notice = "Deprecated API: these pages describe version 4 and will be removed."
    for url in site:
        if "/howto/" in url:  # 12 of 88 pages: far from half of the site, all of its section
            site[url] = site[url].replace("### In this section", f"{notice}\n\n### In this section")
    template = learn(site, own_site)
    block = next(b for b in template.blocks if b.text == notice)
    assert block.scope == "section howto" and block.pages_seen == 12
    assert notice not in strip(site[url_in("howto")], template, url_in("howto")).content


def test_below_the_thresholds_nothing_is_template() -> None:
    site = dict(list(crawl().items())[:4])  # fewer pages than min_pages
    template = learn(site, own_site)
    assert template.blocks == () and template.texts == frozenset()
    url = next(iter(site))
    assert strip(site[url], template, url).content == site[url]


def test_an_own_site_link_list_on_one_page_is_content_not_a_sidebar() -> None:
    site = dict(crawl())
    url = url_in("topics")
    # Own-site links, but not the sidebars' items: nothing else carries this list.
    see_also = f"- [How often pages are crawled]({SITE}/intro/recrawl-cadence/)\n- [The receiver]({SITE}/intro/webhook/)"
    site[url] = site[url].replace("### In this section", f"See also:\n\n{see_also}\n\n### In this section")
    split = strip(site[url], learn(site, own_site), url)
    assert see_also in split.content


def test_bad_thresholds_are_refused_with_a_reason() -> None:
    with pytest.raises(ValueError, match="min_share"):
        learn(crawl(), own_site, min_share=0)
    with pytest.raises(ValueError, match="min_pages"):
        learn(crawl(), own_site, min_pages=1)


# --------------------------------------------------------------------------- never remove content

LICENCE = (
    "This document is licensed under the Creative Commons Attribution 4.0 licence. You may copy, "
    "share and adapt it for any purpose, provided you credit the authors and link to the licence."
)


def legal_site() -> dict[str, str]:
    site = {}
    for number in range(12):
        clause = " ".join(["The parties agree to the terms of section", str(number)] + ["and its annexes"] * (number + 1))
        site[f"{SITE}/legal/clause-{number}/"] = f"# Clause {number}\n\n{clause}.\n\n{LICENCE}\n\n© 2026 Example"
    return site


def test_shared_prose_stays_content_on_its_canonical_page_only() -> None:
    site = legal_site()
    template = learn(site, own_site)
    licence = next(b for b in template.blocks if b.text == LICENCE)
    # The page where the licence is the largest share of the text: the shortest clause.
    assert licence.canonical_url == f"{SITE}/legal/clause-0/"
    holders = [url for url, page in site.items() if LICENCE in strip(page, template, url).content]
    assert holders == [f"{SITE}/legal/clause-0/"]
    # The short copyright line is template on every page, its canonical page included.
    assert not any("© 2026" in strip(page, template, url).content for url, page in site.items())


def test_every_learned_prose_block_is_searchable_somewhere() -> None:
    template = learned()
    for block in template.blocks:
        if block.canonical_url is not None:
            url = block.canonical_url
            assert block.text in " ".join(strip(crawl()[url], template, url).content.split())


# --------------------------------------------------------------------------- pins


def test_a_content_pin_keeps_a_learned_block_and_a_template_pin_removes_an_unlearned_one() -> None:
    rare = "Join our community call every Thursday."
    site = dict(crawl())
    urls = sorted(site)[:2]
    for url in urls:
        site[url] = site[url].replace("### In this section", f"{rare}\n\n### In this section")
    pins = parse_pins([{"as": "content", "glob": "We use cookies*"}, {"as": "template", "text": rare}])
    template = learn(site, own_site, pins=pins)
    for url in urls:
        content = strip(site[url], template, url).content
        assert "We use cookies" in content and rare not in content
    assert not any(b.text.startswith("We use cookies") for b in template.blocks)
    assert next(b for b in template.blocks if b.text == rare).by == "pin"
    # Without the pins, the opposite.
    plain = learned()
    assert "We use cookies" not in strip(crawl()[url_in("ref")], plain, url_in("ref")).content


def test_content_pin_wins_over_template_pin() -> None:
    pins = (Pin("template", "regex", r"^Build "), Pin("content", "regex", r"4f3a9c1"))
    url = url_in("ref")
    template = learn(crawl(), own_site, pins=pins)
    assert "Build 4f3a9c1" in strip(crawl()[url], template, url).content


@pytest.mark.parametrize(
    ("items", "reason"),
    [
        ("Build *", "must be a list"),
        ([["x"]], "#1 must be a mapping"),
        ([{"as": "content"}], "exactly one of text, glob or regex"),
        ([{"as": "boilerplate", "text": "x"}], "'as' must be content or template"),
        ([{"as": "content", "text": "x", "glob": "y"}], "exactly one"),
        ([{"as": "content", "text": "x", "where": "footer"}], "unknown keys \\['where'\\]"),
        ([{"as": "template", "regex": "(unclosed"}], "#1: a template pin's regex '\\(unclosed' is invalid"),
        ([{"as": "template", "text": "  "}], "non-empty"),
        ([{"as": "template", "glob": 3}], "glob must be a string"),
    ],
)
def test_bad_pins_are_refused_in_one_line(items: object, reason: str) -> None:
    with pytest.raises(ValueError, match=reason) as raised:
        parse_pins(items)  # type: ignore[arg-type]
    assert "\n" not in str(raised.value)


# --------------------------------------------------------------------------- hashing across recrawls


def hashes(site: dict[str, str], template: Template) -> dict[str, str]:
    return {url: content_for_hash(page, template, url) for url, page in site.items()}


def test_a_redeploy_that_changes_only_the_template_changes_no_hash() -> None:
    redeployed = normalized(wrapped_site(first_chrome().redeployed(), contents()))
    assert all(redeployed[url] != crawl()[url] for url in crawl())
    assert hashes(redeployed, learned()) == hashes(crawl(), learned())


def test_a_content_edit_next_to_the_template_changes_that_pages_hash_only() -> None:
    url = url_in("howto")
    edited_contents = dict(contents())
    title, text = edited_contents[url]
    edited_contents[url] = (title, text + "\n\nA new closing paragraph, right above the sidebar.")
    edited = normalized(wrapped_site(first_chrome().redeployed(), edited_contents))
    before, after = hashes(crawl(), learned()), hashes(edited, learned())
    assert [u for u in crawl() if before[u] != after[u]] == [url]
    assert "A new closing paragraph" in strip(edited[url], learned(), url).content


def test_the_template_can_be_relearned_on_the_redeployed_site_with_the_same_hashes() -> None:
    redeployed = normalized(wrapped_site(first_chrome().redeployed(), contents()))
    assert hashes(redeployed, learn(redeployed, own_site)) == hashes(crawl(), learned())


# --------------------------------------------------------------------------- properties

SENTENCE_WORDS = st.sampled_from(
    "index page chunk token search model site crawl delivery sensor run asset embedding vector "
    "query answer passage citation heading partition backlog ledger policy retry window".split()
)
PARAGRAPH = st.lists(SENTENCE_WORDS, min_size=3, max_size=40).map(lambda ws: " ".join(ws).capitalize() + ".")


@st.composite
def contents_with_body(draw: st.DrawFn) -> tuple[str, str]:
    """A page of the wrapped site with its content replaced by drawn paragraphs and lists."""
    url = draw(st.sampled_from(sorted(crawl())))
    parts = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["para", "para", "heading", "list", "code"]))
        if kind == "para":
            parts.append(draw(PARAGRAPH))
        elif kind == "heading":
            parts.append("## " + draw(PARAGRAPH))
        elif kind == "list":
            parts.append("\n".join("- " + p for p in draw(st.lists(PARAGRAPH, min_size=1, max_size=4))))
        else:
            parts.append("```\n" + draw(PARAGRAPH) + "\n```")
    body = "# " + contents()[url][0] + "\n\n" + "\n\n".join(parts)
    page = normalize_markdown(crawl()[url].replace(normalize_markdown(contents()[url][1]), body))
    return url, page


@PROPERTY_SETTINGS
@given(drawn=contents_with_body())
def test_stripping_is_idempotent_and_covers_the_page(drawn: tuple[str, str]) -> None:
    url, page = drawn
    split = strip(page, learned(), url)
    assert uncovered(page, split.template_spans) == split.content
    assert all(a < b for a, b in split.template_spans)
    assert all(b1 < a2 for (_, b1), (a2, _) in zip(split.template_spans, split.template_spans[1:]))
    assert strip(split.content, learned(), url).content == split.content


@PROPERTY_SETTINGS
@given(
    drawn=contents_with_body(),
    chrome=st.sampled_from([first_chrome().redeployed(), Chrome(build="abc1234", built_on="2027-01-02")]),
)
def test_template_only_changes_never_change_the_hash_of_any_content(drawn: tuple[str, str], chrome: Chrome) -> None:
    url, page = drawn
    site = dict(contents())
    site[url] = (site[url][0], strip(page, learned(), url).content.strip())
    before = normalize_markdown(wrapped_site(first_chrome(), site)[url])
    after = normalize_markdown(wrapped_site(chrome, site)[url])
    assert before != after
    assert content_for_hash(after, learned(), url) == content_for_hash(before, learned(), url)


@PROPERTY_SETTINGS
@given(drawn=contents_with_body(), data=st.data())
def test_any_edit_of_a_content_paragraph_changes_the_hash(drawn: tuple[str, str], data: st.DataObject) -> None:
    url, page = drawn
    content = strip(page, learned(), url).content
    words = [m for m in re.finditer(r"\b[a-z]{3,}\b", content)]
    word = data.draw(st.sampled_from(words))
    edited = page.replace(content, content[: word.start()] + word.group() + "x" + content[word.end() :])
    assert content_for_hash(edited, learned(), url) != content_for_hash(page, learned(), url)


@PROPERTY_SETTINGS
@given(body=st.lists(PARAGRAPH, min_size=1, max_size=6).map("\n\n".join))
def test_a_page_without_template_blocks_is_unchanged(body: str) -> None:
    url = f"{SITE}/blog/post/"
    assert strip(body, learned(), url).content == body
    assert strip(body, Template.empty(), url).content == body


# --------------------------------------------------------------------------- volatile lines


PREVIOUS = "# Status\n\nViewed 1,204 times.\n\nGenerated 2026-12-01 10:30.\n\nThe timeout is 30 seconds.\n\n```\nretries = 3\n```"
CURRENT = "# Status\n\nA new paragraph.\n\nViewed 1,377 times.\n\nGenerated 2026-12-07 08:00.\n\nThe timeout is 30 seconds.\n\n```\nretries = 5\n```"


def test_volatile_lines_are_aligned_by_shape_and_skip_code() -> None:
    found = volatile_lines(PREVIOUS, CURRENT)
    # The counter moved too, but a number that moves may be content (a price): only stamps count.
    assert [(v.previous, v.current) for v in found] == [("Generated 2026-12-01 10:30.", "Generated 2026-12-07 08:00.")]
    assert [CURRENT.split("\n")[v.line] for v in found] == ["Generated 2026-12-07 08:00."]
    assert volatile_lines(CURRENT, CURRENT) == []


def test_volatile_lines_are_masked_for_the_hash_but_kept_in_the_content() -> None:
    url = f"{SITE}/status/"
    shapes = {v.shape for v in volatile_lines(PREVIOUS, CURRENT)}
    later = CURRENT.replace("2026-12-07 08:00", "2026-12-08 09:15")
    assert content_for_hash(later, Template.empty(), url, shapes) == content_for_hash(CURRENT, Template.empty(), url, shapes)
    assert content_for_hash(later, Template.empty(), url) != content_for_hash(CURRENT, Template.empty(), url)
    assert "Generated 2026-12-08 09:15." in strip(later, Template.empty(), url).content
    counted = CURRENT.replace("1,377", "1,502")
    assert content_for_hash(counted, Template.empty(), url, shapes) != content_for_hash(CURRENT, Template.empty(), url, shapes)
    edited = CURRENT.replace("30 seconds", "60 seconds")
    assert content_for_hash(edited, Template.empty(), url, shapes) != content_for_hash(CURRENT, Template.empty(), url, shapes)


def test_a_line_is_masked_only_once_it_changed_on_consecutive_crawls() -> None:
    stamp = line_shape("Generated 2026-12-01 10:30.")
    counts = note_volatile({}, PREVIOUS, CURRENT)
    assert counts == {stamp: 1} and stamp not in confirmed_volatile(counts)  # one change: a real edit?
    third = CURRENT.replace("2026-12-07 08:00", "2026-12-08 09:15")
    counts = note_volatile(counts, CURRENT, third)
    assert counts == {stamp: 2} and confirmed_volatile(counts) == {stamp}
    counts = note_volatile(counts, third, third)
    assert counts == {}
    with pytest.raises(ValueError, match="min_changes"):
        confirmed_volatile(counts, 0)
