"""Freshness and site filters: applied in the index scan, so k results come back whenever k
matching passages exist, however many nearer ones do not match."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from rag_pipeline.cli import main as cli
from rag_pipeline.core.filters import SearchFilters, site_pattern, site_patterns
from rag_pipeline.embedders.hash_embedder import HashEmbedder
from rag_pipeline.ingest.routing import route_batch
from rag_pipeline.settings import get_settings
from rag_pipeline.store import db, search, spaces
from rag_pipeline_tests.ingest.pagework import MAX, index, put

NEAR_PAGES = 100            # pages that do not match the filters, nearest to the query
NEAR_SECTIONS = 50          # two passages each (heading, sentence): 10,000 in all
FAR = [f"https://blog.example.com/notes/{n}" for n in range(4)]   # match, far from the query
GONE = "https://blog.example.com/notes/9"   # would match, but the crawler found it gone
# Words of both kinds of passage; those of the far ones ("faces east") are in every near one too,
# so the near ones rank first in every mode, with or without word statistics.
QUERY = "kestrel nesting ledge faces east"
MODES = ("vector", "lexical", "hybrid")


def find(conn, embedder, mode: str, question: str, k: int, per_page: int | None,
         filters: SearchFilters = SearchFilters()):
    space = spaces.active(conn)
    vector = embedder.embed([question]).vectors[0]
    if mode == "vector":
        return search.nearest(conn, space, vector, k, per_page=per_page, filters=filters)
    if mode == "lexical":
        return search.lexical(conn, question, k, config="english", per_page=per_page, filters=filters)
    return search.hybrid(conn, space, vector, question, k, config="english", per_page=per_page, filters=filters)


@pytest.fixture(scope="module")
def embedder():
    return HashEmbedder(dimensions=64)


@pytest.fixture(scope="module")
def written(module_database_url, embedder):
    """10,000 passages near the query on docs.example.com pages last verified 30 days ago, four
    blog pages verified now, a few passages each, about something else, and a tombstoned one."""
    with db.connection(module_database_url) as conn:
        conn.autocommit = True
        near = [f"https://docs.example.com/guide/{n}" for n in range(NEAR_PAGES)]
        for n, url in enumerate(near):
            put(conn, url, "\n\n".join(f"# Ledge {n}.{i}\n\nThe kestrel nesting ledge {n} {i} faces east."
                                       for i in range(NEAR_SECTIONS)))
        for n, url in enumerate([*FAR, GONE]):
            put(conn, url, f"# Pigeons {n}\n\nPigeons by the river number {n} in spring, facing east.\n\n"
                           f"# Bridges {n}\n\nThe old bridge {n} crosses the canal eastward and faces east.")
        route_batch(conn, 1000, MAX)
        for url in [*near, *FAR, GONE]:
            index(conn, url, embedder, max_tokens=16, overlap=0)
        put(conn, GONE, "gone", status=404)
        route_batch(conn, 10, MAX)
        assert conn.execute("SELECT deleted_at IS NOT NULL FROM pages WHERE url = %s", (GONE,)).fetchone()[0]
        conn.execute("UPDATE pages SET last_verified_at = now() - interval '30 days',"
                     " last_changed_at = now() - interval '30 days' WHERE url LIKE 'https://docs.example.com/%'")
        live = conn.execute("SELECT count(*) FROM chunks c JOIN pages p USING (page_id)"
                            " WHERE p.url LIKE 'https://docs.example.com/%'").fetchone()[0]
        assert live == 10_000   # the premise: 10,000 passages that do not match
        # Word statistics as autovacuum would leave them: the lexical weights read them, and an
        # automatic ANALYZE landing mid-module must change nothing.
        conn.execute("ANALYZE chunks")
    return module_database_url


@pytest.fixture
def index_of_10k(written):
    with db.connection(written) as conn:
        conn.autocommit = True
        yield conn
        conn.execute("RESET ALL")


# The planner reads a few matching pages first and sorts their passages; with sorting made dear it
# takes the HNSW order, and the iterative scan goes on past what the filters reject, up to
# hnsw.max_scan_tuples (20,000, or cut to 500 here: the exact pass finds the rest).
PLANS = {"planner's choice": [], "index scan": ["SET enable_sort = off"],
         "index scan cut short": ["SET enable_sort = off", "SET hnsw.max_scan_tuples = 500"]}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("filters", [
    SearchFilters.parse(sites=["https://blog.example.com/*"]),
    SearchFilters.parse(max_age="7d"),
    SearchFilters.parse(changed_since=(datetime.now(UTC) - timedelta(days=1)).date().isoformat()),
    SearchFilters.parse(max_age="1h", sites=["http://BLOG.example.com/notes/?"]),
], ids=["site", "max-age", "changed-since", "max-age-and-site"])
def test_k_matching_passages_come_back_among_10000_nearer_that_do_not_match(
        index_of_10k, embedder, filters, plan, mode):
    conn = index_of_10k
    for setting in PLANS[plan]:
        conn.execute(setting)
    unfiltered = find(conn, embedder, mode, QUERY, k=8, per_page=None)
    assert len(unfiltered) == 8 and all(h.page_url.startswith("https://docs.example.com/") for h in unfiltered)

    hits = find(conn, embedder, mode, QUERY, k=8, per_page=None, filters=filters)
    assert len(hits) == 8 and {h.page_url for h in hits} == set(FAR)
    scores = [h.as_dict()["score"] for h in hits]
    assert scores == sorted(scores, reverse=True)
    one_a_page = find(conn, embedder, mode, QUERY, k=8, per_page=1, filters=filters)
    assert sorted(h.page_url for h in one_a_page) == sorted(FAR)


@pytest.mark.parametrize("mode", MODES)
def test_no_mode_or_filter_returns_a_tombstoned_page(index_of_10k, embedder, mode):
    conn = index_of_10k
    for filters in (SearchFilters(), SearchFilters.parse(sites=["https://blog.example.com/*"]),
                    SearchFilters.parse(max_age="7d"), SearchFilters.parse(sites=[GONE])):
        hits = find(conn, embedder, mode, "Pigeons by the river", k=20, per_page=None, filters=filters)
        assert GONE not in {h.page_url for h in hits}
        assert bool(hits) == (filters.sites != (GONE,))


def test_the_cli_filters_and_refuses_what_it_cannot_read(written, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", written)
    monkeypatch.setenv("EMBEDDING_PROVIDER", "hash")
    monkeypatch.setenv("EMBEDDING_DIMENSIONS", "64")
    get_settings.cache_clear()
    shown = CliRunner().invoke(cli, ["search", QUERY, "--k", "4", "--max-age", "7d",
                                     "--site", "https://blog.example.com/*", "--json"])
    assert shown.exit_code == 0, shown.output
    assert sorted(r["url"] for r in json.loads(shown.output)["results"]) == sorted(FAR)
    for args, words in ((["--max-age", "soon"], "cannot read age"),
                        (["--changed-since", "last tuesday"], "cannot read date"),
                        (["--site", "ftp://files.example.com/*"], "only http and https")):
        bad = CliRunner().invoke(cli, ["search", QUERY, *args])
        assert bad.exit_code == 2 and words in bad.output, bad.output


def test_site_globs_read_scheme_and_host_as_normalized_urls_and_escape_like():
    assert site_pattern("http://Docs.Example.com/guide/*") == "https://docs.example.com/guide/%"
    assert site_pattern("docs.example.com/a_b%?") == "https://docs.example.com/a\\_b\\%_"
    assert site_pattern("*.example.com/*") == "https://%.example.com/%"
    for bad in ("", "   ", "https:///x", "mailto://x/*"):
        with pytest.raises(ValueError):
            site_pattern(bad)


def test_a_glob_ending_in_slash_star_finds_the_page_at_its_prefix(conn):
    """Normalized URLs keep no trailing slash: the home page of `http://127.0.0.1:8900/*` is
    `https://127.0.0.1:8900`, and `…/guide/*` covers the page `…/guide` itself."""
    urls = ["https://127.0.0.1:8900", "https://127.0.0.1:8900/pricing", "https://docs.example.com/guide",
            "https://docs.example.com/guide/install", "https://docs.example.com/guidelines"]

    def matched(glob: str) -> list[str]:
        patterns = list(SearchFilters.parse(sites=[glob]).sites)
        return [u for u in urls if conn.execute("SELECT %s LIKE ANY(%s)", (u, patterns)).fetchone()[0]]

    assert matched("http://127.0.0.1:8900/*") == urls[:2]
    assert matched("https://docs.example.com/guide/*") == urls[2:4]
    assert matched("https://docs.example.com/guide*") == urls[2:]
    assert site_patterns("https://docs.example.com/a?") == ("https://docs.example.com/a_",)


@pytest.mark.parametrize("mode", ["vector", "hybrid"])
@pytest.mark.parametrize("plans", ["force_generic_plan", "force_custom_plan"])
def test_a_search_walks_the_index_whatever_the_plan_cache_and_statistics(written, embedder, mode, plans):
    """psycopg prepares what a connection runs five times, and Postgres may then keep a generic
    plan, which does not know the LIMIT; and the pages of a site just loaded are not analyzed
    yet, so the planner takes them for one. Either way it sorted all 10,000 passages (24 ms, not
    3). Every search on a pooled connection (the query API's) must walk the HNSW index."""
    with db.connection(written) as conn:
        space = spaces.active(conn)

        def index_scans() -> int:
            conn.execute("SELECT pg_stat_force_next_flush()")   # this backend's counts, flushed when idle
            return conn.execute("SELECT pg_stat_get_numscans(%s::regclass)", (space.index_name(),)).fetchone()[0]

        before, searches = index_scans(), 12
        try:
            conn.execute(f"SET plan_cache_mode = {plans}")
            for n in range(searches):
                assert len(find(conn, embedder, mode, f"{QUERY} {n}", k=10, per_page=3)) == 10
        finally:
            conn.execute("RESET plan_cache_mode")
        scans = index_scans() - before
    assert scans >= searches, f"{scans} index scans for {searches} searches"
