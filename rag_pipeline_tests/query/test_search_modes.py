"""Vector, lexical and hybrid retrieval: hybrid finds an exact term (an error code) that the
embedding model does not tell apart, and keeps what vector search finds by meaning."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from rag_pipeline.cli import main as cli
from rag_pipeline.embedders.hash_embedder import HashEmbedder
from rag_pipeline.ingest.routing import route_batch
from rag_pipeline.settings import get_settings
from rag_pipeline.store import db, search, spaces, text_search
from rag_pipeline_tests.ingest.pagework import MAX, index, put

CODES = [f"https://docs.example.com/errors/e{n}" for n in range(100, 130)]
ROTATE = "https://docs.example.com/tokens"


class CodeBlindEmbedder(HashEmbedder):
    """Like a model that never learnt these codes: words with digits carry no meaning for it."""

    def vector(self, text: str) -> list[float]:
        return super().vector(re.sub(r"\b\w*\d\w*\b", " ", text))


@pytest.fixture
def db_conn(database_url):
    embedder = CodeBlindEmbedder(dimensions=64)
    with db.connection(database_url) as conn:
        conn.autocommit = True
        for n, url in enumerate(CODES, 100):
            put(conn, url, f"# Error E{n}\n\nThe connection to the upstream server failed with error code E{n}; "
                           "check the server address and retry the connection.")
        put(conn, ROTATE, "# Tokens\n\nTo renew a credential, generate another one on the settings page, "
                          "update every client with it, then revoke the previous credential.")
        route_batch(conn, 100, MAX)
        for url in [*CODES, ROTATE]:
            index(conn, url, embedder, max_tokens=64, overlap=0)
        yield conn, embedder


def test_hybrid_finds_the_exact_code_the_vectors_cannot_tell_apart(db_conn):
    conn, embedder = db_conn
    space = spaces.active(conn)
    question = "What does connection error code E117 mean?"
    vector = embedder.embed([question]).vectors[0]
    wanted = "https://docs.example.com/errors/e117"
    # The premise: all thirty pages are the same to the model, so the code decides nothing.
    assert len({round(h.distance, 6) for h in search.nearest(conn, space, vector, 30, per_page=1)}) == 1
    words = search.lexical(conn, question, 5, config="english", per_page=1)
    both = search.hybrid(conn, space, vector, question, 5, config="english", per_page=1)
    assert words[0].page_url == wanted and both[0].page_url == wanted
    assert [h.as_dict()["score"] for h in both] == sorted((h.as_dict()["score"] for h in both), reverse=True)


def test_hybrid_keeps_what_only_the_meaning_finds(db_conn):
    conn, embedder = db_conn
    space = spaces.active(conn)
    # No word in common with the page but "settings" (stemmed: "set"): the meaning is in the vector.
    question = "how do I renew a credential and revoke the previous one"
    vector = embedder.embed([question]).vectors[0]
    assert search.nearest(conn, space, vector, 1)[0].page_url == ROTATE
    assert search.hybrid(conn, space, vector, question, 3, config="english", per_page=1)[0].page_url == ROTATE
    # A question of stop words only has no lexemes: lexical finds nothing, and says nothing wrong.
    assert search.lexical(conn, "how do I do it", 5, config="english") == []
    # Quotes and backslashes in a question are words like any other, not tsquery syntax.
    assert search.lexical(conn, "O'Reilly's \\ back\\slash | & ! E117", 5, config="english")[0].page_url.endswith("e117")


def test_the_cli_takes_a_mode_and_the_lexical_index_follows_its_configuration(db_conn, database_url, monkeypatch,
                                                                             caplog):
    conn, _ = db_conn
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("EMBEDDING_PROVIDER", "hash")
    get_settings.cache_clear()
    for mode in ("vector", "lexical", "hybrid"):
        shown = CliRunner().invoke(cli, ["search", "error code E117", "--mode", mode, "--json"])
        assert shown.exit_code == 0, shown.output
        assert json.loads(shown.stdout)["results"]
    bad = CliRunner().invoke(cli, ["search", "E117", "--mode", "telepathy"])
    assert bad.exit_code == 2 and "--mode" in bad.output

    assert search.lexical(conn, "failing", 3, config="english")   # stemmed: "failed" matches
    # `db migrate` rebuilds the column for another configuration, and queries parse with it.
    monkeypatch.setenv("SEARCH_TEXT_CONFIG", "simple")
    get_settings.cache_clear()
    migrated = CliRunner().invoke(cli, ["db", "migrate"])
    assert migrated.exit_code == 0 and "rebuilt with text search configuration simple" in migrated.output
    assert text_search.config(conn) == "simple"
    # 'simple' does not stem: "failing" no longer finds "failed"; 'english' did.
    assert search.lexical(conn, "failing", 3, config="simple") == []
    assert CliRunner().invoke(cli, ["db", "migrate"]).output.count("rebuilt") == 0
    # A process whose setting differs from the index searches with the index's, and says so.
    monkeypatch.setenv("SEARCH_TEXT_CONFIG", "english")
    get_settings.cache_clear()
    shown = CliRunner().invoke(cli, ["search", "failed E117", "--mode", "lexical", "--json"])
    assert shown.exit_code == 0 and json.loads(shown.stdout)["results"][0]["url"].endswith("e117")
    assert "the lexical index is built with simple" in caplog.text and "db migrate" in caplog.text
    monkeypatch.setenv("SEARCH_TEXT_CONFIG", "klingon")
    get_settings.cache_clear()
    refused = CliRunner().invoke(cli, ["db", "migrate"])
    assert refused.exit_code == 1 and "SEARCH_TEXT_CONFIG='klingon'" in refused.output and "english" in refused.output


def test_each_passage_is_ranked_by_the_words_it_holds_as_by_the_whole_question(db_conn, monkeypatch):
    """The lexical rank gives ts_rank_cd only the question's words a passage holds (its cost grows
    with the words it is given: a 280-word question took 2 ms a passage); the scores are those of
    the whole question ORed, to the bit, for a short question and for one of 280 words (headings
    weighing nothing here: they add their words' weights on top, tested below)."""
    from rag_pipeline.core.lexical import any_of, tsquery_term

    monkeypatch.setattr(search, "HEADING_WEIGHT", 0.0)
    monkeypatch.setattr(search, "BREADCRUMB_WEIGHT", 0.0)
    conn, _ = db_conn
    filler = " ".join(f"zq{n:03d}x" for n in range(270))        # words no passage holds
    for question in ("What does connection error code E117 mean?",
                     f"retry E101 E117 server credential settings connection {filler}"):
        hits = search.lexical(conn, question, 50, config="english", per_page=None)
        terms = search._terms(conn, question, "english")
        whole = dict(conn.execute(
            "SELECT c.chunk_id, (SELECT sum(t.weight) FROM unnest(%(terms)s::tsquery[], %(weights)s::float8[])"
            "  t (term, weight) WHERE c.text_search @@ t.term) + ts_rank_cd(c.text_search, %(every)s::tsquery, 1)"
            " FROM chunks c WHERE c.text_search @@ %(any)s::tsquery",
            {"terms": [tsquery_term(w) for w in terms.weights], "weights": list(terms.weights.values()),
             "every": any_of(list(terms.weights)), "any": any_of(terms.candidates)}).fetchall())
        chunk_id = {(url, idx): cid for url, idx, cid in conn.execute(
            "SELECT p.url, c.chunk_index, c.chunk_id FROM chunks c JOIN pages p USING (page_id)").fetchall()}
        assert len(hits) == len(whole) > 1
        assert [h.score for h in hits] == sorted(whole.values(), reverse=True)
        assert {chunk_id[(h.page_url, h.chunk_index)]: h.score for h in hits} == whole


DEFINED = "https://docs.example.com/settings"


def test_the_passage_whose_heading_names_the_word_comes_before_those_that_list_it(database_url, monkeypatch):
    """A setting's own section, not the topical index that lists its name (nor a neighbour)."""
    embedder = HashEmbedder(dimensions=64)
    sections = ["# Settings", "## Topical index\n\n* ``CACHE_TTL``\n* ``CACHE_SIZE``\n* ``CACHE_DIR``"]
    for name, text in (("CACHE_DIR", "Where cached files go."), ("CACHE_SIZE", "How many entries are kept."),
                       ("CACHE_TTL", "How long an entry lives, in seconds, before it is read again.")):
        sections.append(f"## ``{name}``\n\nDefault: none.\n\n{text}")
    with db.connection(database_url) as conn:
        conn.autocommit = True
        put(conn, DEFINED, "\n\n".join(sections))
        route_batch(conn, 100, MAX)
        index(conn, DEFINED, embedder, max_tokens=24, overlap=0)
        space = spaces.active(conn)
        question = "What is the CACHE_TTL setting for?"
        vector = embedder.embed([question]).vectors[0]

        def first(mode: str) -> str:
            hits = (search.lexical(conn, question, 3, config="english", per_page=None) if mode == "lexical" else
                    search.hybrid(conn, space, vector, question, 3, config="english", per_page=None))
            return hits[0].content

        assert first("lexical").startswith("## ``CACHE_TTL``") and first("hybrid").startswith("## ``CACHE_TTL``")
        monkeypatch.setattr(search, "HEADING_WEIGHT", 0.0)
        monkeypatch.setattr(search, "BREADCRUMB_WEIGHT", 0.0)
        assert first("lexical").startswith("* ``CACHE_TTL``\n* ``CACHE_SIZE``")   # the premise: words alone pick the list
