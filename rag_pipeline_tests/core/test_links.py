"""Links of a page's markdown, resolved against the page's URL."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rag_pipeline.core.links import MAX_LINKS_PER_PAGE, links_in

BASE = "https://docs.example.com/guide/intro"


def test_relative_absolute_and_autolinks_resolve_against_the_page():
    md = ("See [setup](setup), [the API](/api/ \"API\"), [up](../faq#top), <https://docs.example.com/x>,\n"
          "[elsewhere](https://other.example.org/p?q=1#frag) and [again](setup#step-2).")
    assert links_in(md, BASE) == [
        "https://docs.example.com/guide/setup", "https://docs.example.com/api/", "https://docs.example.com/faq",
        "https://other.example.org/p?q=1", "https://docs.example.com/x"]


def test_images_mail_scripts_and_anchors_are_not_pages():
    md = "![logo](/logo.png) [mail](mailto:a@b.c) [js](javascript:alert(1)) [top](#top) [tel](tel:123)"
    assert links_in(md, BASE) == []


def test_a_page_of_endless_links_counts_only_its_first_thousand():
    md = " ".join(f"[p{i}](/p{i})" for i in range(MAX_LINKS_PER_PAGE + 500))
    links = links_in(md, BASE)
    assert len(links) == MAX_LINKS_PER_PAGE and links[-1] == f"https://docs.example.com/p{MAX_LINKS_PER_PAGE - 1}"


def test_an_unparseable_target_is_skipped():
    assert links_in("[bad](http://[::1/x) [ok](/ok)", BASE) == ["https://docs.example.com/ok"]


@given(st.text(max_size=2000))
def test_any_text_gives_absolute_http_urls_or_nothing(text):
    for url in links_in(text, BASE):
        assert url.startswith(("http://", "https://")) and "#" not in url
