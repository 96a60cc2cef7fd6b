"""The real-documentation corpora of the benches (bench/labelled/): which reST pages count as a
site's pages, and how `bench/peers.py --docs` names their files and finds their URLs again."""

from __future__ import annotations

from bench.labelled.salt_docs import has_prose, url_of
from bench.labelled.sdist_docs import to_markdown
from bench.peers import file_name, page_url


def test_a_page_of_directives_only_is_not_a_page_of_its_own():
    stub = "salt.modules.aliases\n====================\n\n.. automodule:: salt.modules.aliases\n    :members:\n"
    toc = ".. _toc:\n\n=====\nIndex\n=====\n\n.. toctree::\n    :maxdepth: 2\n\n    topics/index\n"
    assert not has_prose(stub)
    assert not has_prose(toc)
    assert has_prose(stub + "\nThis module manages the aliases file.\n")


def test_titles_become_headings_in_the_order_of_their_adornments():
    rest = "=====\nTitle\n=====\n\nIntro.\n\nPart\n----\n\nText.\n\nOther\n-----\n"
    assert to_markdown(rest) == "# Title\n\nIntro.\n\n## Part\n\nText.\n\n## Other\n"


def test_a_real_sites_file_names_give_its_urls_back_through_the_map():
    urls = [url_of("topics/tutorials/walkthrough.rst"), url_of("topics/releases/3006.0.md"), url_of("faq.rst")]
    names = {file_name(url): url for url in urls}
    assert len(names) == 3 and all("/" not in name and name.endswith(".md") for name in names)
    assert [page_url(name, names) for name in names] == urls
    generated = "https://docs.example.com/guide/00042"
    assert file_name(generated) == "00042.md" and page_url("00042.md") == generated
