"""The hash gate past the template (core/content_gate.py): a crawl that moved only the template or
a confirmed volatile line is unchanged; any content edit is a change; a template learned again
recomputes the stored source's key instead of taking every page as changed."""

from __future__ import annotations

from datetime import datetime, timezone

from rag_pipeline.core import content_gate
from rag_pipeline.core.site_template import learn
from rag_pipeline_tests.core.wrapped_site import Chrome, content_pages, own_site, wrapped_site

LEARNED = datetime(2026, 12, 1, tzinfo=timezone.utc)
RELEARNED = datetime(2026, 12, 7, tzinfo=timezone.utc)


def site_and_template():
    before = wrapped_site()
    return before, wrapped_site(Chrome().redeployed()), learn(before, own_site)


def test_a_redeploy_is_unchanged_on_every_page_and_reuses_the_cached_key() -> None:
    before, after, template = site_and_template()
    for url in before:
        first = content_gate.compare(before[url], after[url], url, template, LEARNED, {})
        assert first.unchanged and first.recomputed, url
        again = content_gate.compare(before[url], after[url], url, template, LEARNED, first.volatile_counts,
                                     first.old_key, first.tag)
        assert again.unchanged and not again.recomputed and again.old_key == first.old_key


def test_a_content_edit_is_a_change_whatever_the_template_did() -> None:
    contents = content_pages()
    url = next(u for u in contents if "/topics/" in u)
    before, _, template = site_and_template()
    title, text = contents[url]
    edited = dict(contents, **{url: (title, text.replace("## Details", "## Details\n\nA sentence added.", 1))})
    after = wrapped_site(Chrome().redeployed(), edited)
    gate = content_gate.compare(before[url], after[url], url, template, LEARNED, {})
    assert not gate.unchanged and gate.new_key != gate.old_key
    other = next(u for u in contents if u != url)
    assert content_gate.compare(before[other], after[other], other, template, LEARNED, {}).unchanged


def test_a_template_learned_again_recomputes_the_key_and_routes_nothing() -> None:
    before, after, template = site_and_template()
    url = next(iter(before))
    first = content_gate.compare(before[url], after[url], url, template, LEARNED, {})
    relearned = learn(after, own_site)
    gate = content_gate.compare(before[url], after[url], url, relearned, RELEARNED, first.volatile_counts,
                                first.old_key, first.tag)
    assert gate.recomputed and gate.tag != first.tag and gate.unchanged


def test_without_a_template_the_whole_text_is_content() -> None:
    before, after, _ = site_and_template()
    url = next(iter(before))
    assert not content_gate.compare(before[url], after[url], url, None, None, {}).unchanged


def test_a_stamp_in_the_content_is_masked_once_it_changed_on_two_crawls_in_a_row() -> None:
    page = "# Stats\n\nGenerated {at} for this site.\n\nThe dashboard lists every site's backlog."
    url = "https://stats.example.org/"
    second = content_gate.compare(page.format(at="2026-12-01 10:30"), page.format(at="2026-12-02 10:30"), url,
                                  None, None, {})
    assert not second.unchanged and list(second.volatile_counts.values()) == [1]
    # The run made the second crawl the source; the third crawl moves the stamp again.
    third = content_gate.compare(page.format(at="2026-12-02 10:30"), page.format(at="2026-12-03 11:00"), url,
                                 None, None, second.volatile_counts)
    assert third.unchanged and list(third.volatile_counts.values()) == [2]
    # A real edit beside the masked stamp is still a change.
    edited = page.replace("every site's backlog", "every site's backlog and its failures")
    fourth = content_gate.compare(page.format(at="2026-12-02 10:30"), edited.format(at="2026-12-04 09:00"), url,
                                  None, None, third.volatile_counts, third.old_key, third.tag)
    assert not fourth.unchanged


def test_a_number_that_moves_at_every_crawl_is_a_change_every_time() -> None:
    """A price or a counter may be the page's content: never learned volatile from its history."""
    page = "# Prices\n\nRound {n}."
    url = "https://shop.example.org/busy/"
    counts: dict[str, int] = {}
    for n in range(1, 6):
        gate = content_gate.compare(page.format(n=n - 1), page.format(n=n), url, None, None, counts)
        assert not gate.unchanged, n
        counts = gate.volatile_counts


def test_a_number_edited_once_is_a_change() -> None:
    page = "# Timeouts\n\nThe request timeout is {n} seconds.\n\nRetries back off exponentially."
    url = "https://docs.example.org/timeouts/"
    assert not content_gate.compare(page.format(n=30), page.format(n=60), url, None, None, {}).unchanged


def test_a_small_sections_sidebar_is_template_once_the_sites_sidebars_are_learned() -> None:
    """A section of one page: its sidebar, on one page, can never be learned by count. It links
    to the page itself and stays on its host: template, before and after it gains an item."""
    from rag_pipeline.core.template_strip import strip

    before, after, template = site_and_template()
    assert template.sidebar_items
    url = "https://docs.example.org/faq/only-page/"
    lone = "- [Only page](https://docs.example.org/faq/only-page/)"
    grown = lone + "\n- [Upgrading to 6.0](https://docs.example.org/faq/upgrading-to-60/)"
    body = "# Only page\n\nThe one page of its section, with a paragraph of its own content."
    see_also = ("- [Signals in depth](https://docs.example.org/topics/signals-in-depth/)\n"
                "- [The settings list](https://docs.example.org/ref/the-settings-list/)")
    for sidebar in (lone, grown):
        page = f"{sidebar}\n\n{body}\n\n{see_also}\n"
        content = strip(page, template, url).content
        assert "Only page](" not in content and "Upgrading" not in content
        assert "The one page of its section" in content
        assert "[Signals in depth](" in content   # a list of other pages is not taken for a sidebar
    assert content_gate.compare(f"{lone}\n\n{body}", f"{grown}\n\n{body}", url, template, LEARNED, {}).unchanged
    # With no sidebar learned, nothing is taken on that ground.
    bare = learn({u: "# T\n\nText." for u in before}, own_site)
    assert "Only page](" in strip(f"{lone}\n\n{body}", bare, url).content


def test_a_bare_date_that_differs_on_every_page_stays_content_and_a_labelled_stamp_goes() -> None:
    """A release's date under its title is on every release page in one shape, each with its own
    date: content. "Last updated <date>" carries a label: chrome, whatever its dates."""
    from datetime import date, timedelta

    from rag_pipeline.core.template_strip import strip

    pages = {}
    for n in range(40):
        day = date(2024, 1, 1) + timedelta(days=9 * n)
        pages[f"https://docs.example.org/releases/5.{n}/"] = (
            f"# Django 5.{n} release notes\n\n*{day:%B %-d, %Y}*\n\nWelcome to Django 5.{n}, with fix number {n}."
            f" It repairs a regression.\n\nLast updated {day + timedelta(days=n % 3):%Y-%m-%d}\n")
    template = learn(pages, own_site)
    url = "https://docs.example.org/releases/5.7/"
    content = strip(pages[url], template, url).content
    assert "*March 4, 2024*" in content and "Last updated" not in content


def test_sections_are_found_below_the_sites_common_path() -> None:
    from rag_pipeline.core.site_template import sections_below

    urls = ["https://docs.example.org/en/5.2", "https://docs.example.org/en/5.2/ref/models",
            "https://docs.example.org/en/5.2/topics/db/queries", "https://docs.example.org/en/5.2/glossary.html"]
    section_of = sections_below(urls)
    assert [section_of(u) for u in urls] == ["", "ref", "topics", "glossary.html"]
    # Without the root page the common path is the same: the sections are not each page.
    assert sections_below(urls[1:])(urls[1]) == "ref"


def test_a_line_a_page_repeats_is_its_structure_not_template() -> None:
    """Chrome is once a page. An admonition's label written several times on most pages is how
    those pages are written, and stays; the same label once a page on every page is template."""
    from rag_pipeline.core.template_strip import strip

    body = "Note:\n\nKeep the {n} settings apart.\n\nNote:\n\nRestart after editing setting {n}.\n"
    pages = {f"https://docs.example.org/s/{n}/": f"# Page {n}\n\n" + body.format(n=n) for n in range(20)}
    url = "https://docs.example.org/s/3/"
    assert strip(pages[url], learn(pages, own_site), url).content.count("Note:") == 2
    once = {u: text + "\nPowered by Sphinx\n" for u, text in pages.items()}
    assert "Powered by Sphinx" not in strip(once[url], learn(once, own_site), url).content


def test_a_literal_blocks_lines_and_wordless_lines_are_never_template() -> None:
    """Indented lines (a literal block's code) and lines of no words repeat across a tutorial's
    pages without being chrome: they stay, however many pages carry them."""
    from rag_pipeline.core.template_strip import strip

    words = ["otters", "herons", "beavers", "salmon", "kestrels", "badgers", "voles", "newts", "moths", "crabs"]
    pages = {}
    for n in range(20):
        prose = f"The {words[n % 10]} of part {words[(n * 3) % 10]} gather where the {words[(n * 7) % 10]} rest."
        pages[f"https://docs.example.org/intro/{n}/"] = (
            f"# Part about {words[n % 10]} and {words[(n + 1) % 10]}\n\n{prose}\n\n"
            "    >>> from polls.models import Choice\n    ...\n\n]\n")
    url = "https://docs.example.org/intro/3/"
    content = strip(pages[url], learn(pages, own_site), url).content
    assert ">>> from polls.models import Choice" in content and "\n]\n" in content and "    ..." in content
