"""What `search` returns: one passage a page unless more are asked for, best first."""

from __future__ import annotations

from collections import Counter

import pytest
from click.testing import CliRunner

from rag_pipeline.cli import main as cli
from rag_pipeline.embedders.hash_embedder import HashEmbedder
from rag_pipeline.ingest.routing import route_batch
from rag_pipeline.settings import get_settings
from rag_pipeline.store import db, search, spaces
from rag_pipeline_tests.ingest.pagework import MAX, index, put

KESTREL = "https://docs.example.com/kestrel"
OTHERS = [f"https://docs.example.com/other/{n}" for n in range(12)]


@pytest.fixture
def db_conn(database_url):
    with db.connection(database_url) as conn:
        conn.autocommit = True
        yield conn


def _index(db_conn) -> HashEmbedder:
    embedder = HashEmbedder(dimensions=64)
    put(db_conn, KESTREL, "# Kestrel\n\n" + "\n\n".join(
        f"The kestrel nesting ledge {i} faces east." for i in range(12)))
    for n, url in enumerate(OTHERS):
        put(db_conn, url, f"# Other {n}\n\nA kestrel nesting ledge near bridge {n}, with {n} pigeons and a river.")
    route_batch(db_conn, 100, MAX)
    for url in [KESTREL, *OTHERS]:
        index(db_conn, url, embedder, max_tokens=16, overlap=0)
    return embedder


def test_results_are_one_passage_a_page_unless_more_are_asked_for(db_conn):
    embedder = _index(db_conn)
    space = spaces.active(db_conn)
    query = embedder.embed(["kestrel nesting ledge faces east"]).vectors[0]

    flat = search.nearest(db_conn, space, query, k=10)
    assert sum(h.page_url == KESTREL for h in flat) >= 5   # the premise: one page holds most of the nearest

    one = search.nearest(db_conn, space, query, k=10, per_page=1)
    assert len(one) == 10 and len({h.page_url for h in one}) == 10
    assert one[0].page_url == KESTREL and one[0].distance == flat[0].distance   # its best passage first
    assert [h.distance for h in one] == sorted(h.distance for h in one)

    three = search.nearest(db_conn, space, query, k=10, per_page=3)
    assert len(three) == 10 and max(Counter(h.page_url for h in three).values()) == 3


def test_the_cli_collapses_by_page_and_takes_per_page(db_conn, database_url, monkeypatch):
    _index(db_conn)
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("EMBEDDING_PROVIDER", "hash")
    monkeypatch.setenv("EMBEDDING_DIMENSIONS", "64")
    get_settings.cache_clear()
    import json

    # By default (SEARCH_PER_PAGE), at most three passages of one page, each earning its place.
    shown = CliRunner().invoke(cli, ["search", "kestrel nesting ledge faces east", "--k", "6", "--json"])
    assert shown.exit_code == 0, shown.output
    urls = [r["url"] for r in json.loads(shown.output)["results"]]
    assert len(urls) == 6 and Counter(urls)[KESTREL] == 3
    one = CliRunner().invoke(cli, ["search", "kestrel nesting ledge faces east", "--k", "6", "--per-page", "1",
                                   "--json"])
    urls = [r["url"] for r in json.loads(one.output)["results"]]
    assert len(urls) == 6 and len(set(urls)) == 6
    monkeypatch.setenv("SEARCH_PER_PAGE", "1")
    get_settings.cache_clear()
    shown = CliRunner().invoke(cli, ["search", "kestrel nesting ledge faces east", "--k", "6", "--json"])
    assert len({r["url"] for r in json.loads(shown.output)["results"]}) == 6
    more = CliRunner().invoke(cli, ["search", "kestrel nesting ledge faces east", "--k", "6", "--per-page", "6",
                                    "--json"])
    assert Counter(r["url"] for r in json.loads(more.output)["results"])[KESTREL] > 1
    bad = CliRunner().invoke(cli, ["search", "kestrel", "--per-page", "0"])
    assert bad.exit_code == 2 and "--per-page" in bad.output


@pytest.mark.parametrize("per_page", [1, 3, None])
def test_the_first_results_do_not_depend_on_how_many_are_asked_for(db_conn, per_page):
    embedder = _index(db_conn)
    space = spaces.active(db_conn)
    question = "kestrel nesting ledge faces east with pigeons"
    query = embedder.embed([question]).vectors[0]
    config = "english"
    for mode, ask in [("vector", lambda k: search.nearest(db_conn, space, query, k, per_page=per_page)),
                      ("lexical", lambda k: search.lexical(db_conn, question, k, config=config, per_page=per_page)),
                      ("hybrid", lambda k: search.hybrid(db_conn, space, query, question, k, config=config,
                                                         per_page=per_page))]:
        widest = [h.key for h in ask(20)]
        assert len(widest) == (13 if per_page == 1 else 20), mode
        for k in (1, 2, 5, 10, 13):
            assert [h.key for h in ask(k)] == widest[:k], (mode, k)
