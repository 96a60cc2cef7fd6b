"""Passages of live pages for a question: nearest in the active space (one HNSW index scan of its
table), best by full-text rank (the GIN index of `chunks.text_search`), or both fused by rank."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime

import numpy as np
import psycopg
from psycopg import sql

from rag_pipeline.core.filters import SearchFilters
from rag_pipeline.core.lexical import any_of, candidate_terms, term_weights, tsquery_term
from rag_pipeline.core.ranking import best_per_key, fuse_rrf, fuse_scores
from rag_pipeline.store.spaces import Space

EXCERPT_CHARS = 300


@dataclass(frozen=True)
class Citation:
    url: str                    # to open: the URL as crawled (http stays http), else the page key
    page_url: str               # the page's normalized URL: its partition key and identity
    excerpt: str
    content: str
    chunk_index: int
    distance: float             # cosine distance to the question (nan: found by text alone)
    last_verified_at: datetime | None
    last_changed_at: datetime | None
    #: The mode's own score, higher is better: cosine similarity (vector), the held words' weights plus
    #: ts_rank_cd (lexical),
    #: the reciprocal rank fusion score (hybrid).
    score: float | None = None

    @property
    def key(self) -> str:
        return f"{self.page_url}#{self.chunk_index}"

    def as_dict(self) -> dict:
        score = self.score if self.score is not None else 1.0 - self.distance
        return {
            "url": self.url,
            "page_url": self.page_url,
            "excerpt": self.excerpt,
            "chunk_index": self.chunk_index,
            "score": round(score, 4),
            "last_verified_at": self.last_verified_at.isoformat() if self.last_verified_at else None,
            "last_changed_at": self.last_changed_at.isoformat() if self.last_changed_at else None,
        }


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    cut = flat.rfind(" ", 0, limit)
    return flat[: cut if cut > limit // 2 else limit] + "…"


# Candidates each list starts from, whatever k is asked (k is at most 100): the first results
# never depend on how many are asked for. While pages repeat past `per_page`, the pool grows
# fourfold (up to MAX_CANDIDATES), and only what the first pool did not decide is taken from it.
CANDIDATE_POOL = 100
MAX_CANDIDATES = 4000


def nearest(conn: psycopg.Connection, space: Space, query_vector, k: int, *,
            ef_search: int | None = None, per_page: int | None = None,
            filters: SearchFilters = SearchFilters()) -> list[Citation]:
    """The k chunks of live pages nearest to the vector, at most ``per_page`` of one page (None:
    no limit), of pages that pass ``filters``. The index scan looks at max(ef_search, 2 ×
    candidates) (SEARCH_EF_SEARCH for `search` and `ask`; None: the server's setting, 40 unless
    set otherwise)."""
    vec = _vector(space, query_vector)
    return _collect(lambda limit: _full(_scan(conn, space, vec, limit, ef_search, filters), limit), k, per_page)


def lexical(conn: psycopg.Connection, question: str, k: int, *, config: str, per_page: int | None = None,
            filters: SearchFilters = SearchFilters()) -> list[Citation]:
    """The k chunks of live pages that hold the question's words, the rarer words counting more
    (over the GIN index of `chunks.text_search`; ``config`` its text search configuration)."""
    terms = _terms(conn, question, config)

    def scan(limit: int) -> tuple[list[Citation], bool]:
        hits = _text_scan(conn, terms, limit, filters)
        scores = _lexical_scores(conn, terms, config, hits)
        ranked = sorted(hits, key=lambda c: -scores.get(c.key, 0.0))   # stable: the scan's order breaks ties
        return [replace(c, score=scores.get(c.key, c.score)) for c in ranked], len(hits) < limit

    return _collect(scan, k, per_page)


@dataclass(frozen=True)
class Fusion:
    vector_weight: float = 1.0
    lexical_weight: float = 1.0
    rrf_k: int = 60
    method: str = "scores"      # or "rrf": reciprocal rank fusion (SEARCH_FUSION)


def hybrid(conn: psycopg.Connection, space: Space, query_vector, question: str, k: int, *, config: str,
           fusion: Fusion = Fusion(), ef_search: int | None = None, per_page: int | None = None,
           filters: SearchFilters = SearchFilters()) -> list[Citation]:
    """Both lists of candidates, fused by reciprocal rank: a passage near the question in meaning
    and one holding its exact terms (an error code, a function name) both come back."""
    vec = _vector(space, query_vector)
    terms = _terms(conn, question, config)

    def fused(limit: int) -> tuple[list[Citation], bool]:
        near = _scan(conn, space, vec, limit, ef_search, filters)
        matched = _text_scan(conn, terms, limit, filters)
        exhausted = len(near) < limit and len(matched) < limit
        seen = {c.key for c in near}
        if fusion.method == "rrf":
            # A passage holding the words that the vector scan should have returned (as near as what it
            # did return: an approximate scan's miss, or a tie cut at the limit) takes its place there.
            # One farther away stays out: it would push down what only the meaning finds.
            if near:
                bound = near[-1].distance
                missed = [c for c in _distances(conn, space, vec, [c for c in matched if c.key not in seen])
                          if c.distance <= bound]
                near = sorted(near + missed, key=lambda c: c.distance)
            by_key = {c.key: c for c in matched} | {c.key: c for c in near}
            ranked = fuse_rrf([[(c.key, -c.distance) for c in near], [(c.key, c.score) for c in matched]],
                              [fusion.vector_weight, fusion.lexical_weight], fusion.rrf_k)
            return [replace(by_key[key], score=score) for key, score in ranked if score > 0], exhausted
        # Scores: every candidate of either list with both its exact distance and its words' score.
        pool = near + _distances(conn, space, vec, [c for c in matched if c.key not in seen])
        words = _lexical_scores(conn, terms, config, pool)
        by_key = {c.key: c for c in pool}
        ranked = fuse_scores([(c.key, 1.0 - c.distance, words.get(c.key)) for c in pool],
                             fusion.vector_weight, fusion.lexical_weight)
        return [replace(by_key[key], score=score) for key, score in ranked], exhausted

    return _collect(fused, k, per_page)


def _vector(space: Space, query_vector) -> np.ndarray:
    vec = np.asarray(query_vector, dtype=np.float32)
    if vec.shape != (space.dimensions,):
        raise ValueError(f"query vector has {vec.shape} dims, space has {space.dimensions}")
    return vec


def _full(hits: list[Citation], limit: int) -> tuple[list[Citation], bool]:
    return hits, len(hits) < limit


def _collect(scan: Callable[[int], tuple[list[Citation], bool]], k: int, per_page: int | None) -> list[Citation]:
    """The first k of ``scan`` (candidates best first, and whether it has no more), at most
    ``per_page`` of one page. Prefix-stable: the results for k are the first of those for any
    larger k (a bigger pool, needed when pages repeat, adds results after those the first pool
    decided and never reorders them)."""
    if k < 1:
        raise ValueError("k must be at least 1")
    limit = max(CANDIDATE_POOL, k)
    out: list[Citation] = []
    while True:
        hits, exhausted = scan(limit)
        taken = {c.key for c in out}
        out = best_per_key(out + [c for c in hits if c.key not in taken], lambda c: c.page_url, per_page or k, k)
        if len(out) == k or exhausted or limit >= MAX_CANDIDATES:
            return out
        limit = min(MAX_CANDIDATES, limit * 4)


def _scan(conn: psycopg.Connection, space: Space, vec: np.ndarray, limit: int, ef_search: int | None,
          filters: SearchFilters) -> list[Citation]:
    where, params = _where(filters)
    params.update(q=vec, k=limit)
    with conn.transaction():
        # Enough candidates for the limit; the iterative scan goes on past ef_search while the
        # filters reject what it finds (relaxed order: re-sorted below).
        settings = {"hnsw.iterative_scan": "relaxed_order"}
        if not filters:
            # Nothing to read first: the index's order is the plan at any size, even where the
            # statistics (a site just loaded, not yet analyzed) make a sort of every passage look
            # cheap (41 ms against 2.6 ms at 5,000 passages).
            settings["enable_sort"] = "off"
        if ef_search is not None:
            settings["hnsw.ef_search"] = str(min(1000, max(ef_search, 2 * limit)))
        _plan_with_values(conn, settings)
        rows = conn.execute(_query(space, where, indexed=True), params).fetchall()
        if filters and len(rows) < limit:
            # The iterative scan stops after hnsw.max_scan_tuples: when filters pass few pages,
            # their passages may lie beyond it. Exact order over the pages that pass, so k results
            # come back whenever k matching passages exist.
            rows = conn.execute(_query(space, where, indexed=False), params).fetchall()
    rows.sort(key=lambda r: r[3])  # relaxed_order may hand back near-ties slightly out of order
    return [
        Citation(url=r[0], page_url=r[6], excerpt=excerpt(r[1]), content=r[1], chunk_index=r[2],
                 distance=float(r[3]), last_verified_at=r[4], last_changed_at=r[5])
        for r in rows
    ]


def _distances(conn: psycopg.Connection, space: Space, vec: np.ndarray, hits: list[Citation]) -> list[Citation]:
    """The hits again, each with its exact distance to the question in the space."""
    if not hits:
        return []
    query = sql.SQL(
        "SELECT p.url, c.chunk_index, v.embedding{cast} <=> %(q)s{cast}"
        " FROM unnest(%(urls)s::text[], %(idx)s::int[]) AS h (url, chunk_index)"
        " JOIN pages p ON p.url = h.url JOIN chunks c ON c.page_id = p.page_id AND c.chunk_index = h.chunk_index"
        " JOIN {table} v ON v.chunk_id = c.chunk_id"
    ).format(cast=space.cast(), table=space.table())
    with conn.transaction():
        rows = conn.execute(query, {"q": vec, "urls": [h.page_url for h in hits],
                                    "idx": [h.chunk_index for h in hits]}).fetchall()
    found = {(url, index): float(distance) for url, index, distance in rows}
    return [replace(h, distance=found[(h.page_url, h.chunk_index)]) for h in hits
            if (h.page_url, h.chunk_index) in found]


# A question's word in a passage's own heading (a section it opens: `### ``inspectdb```) counts
# this many times its weight more, and in the headings above it (its breadcrumb) half that: the
# passage that a section about the word starts with is its definition, more often than the
# passages that mention it (BM25F's field weights, on the two fields a chunk has).
HEADING_WEIGHT = 1.0
BREADCRUMB_WEIGHT = 0.5


def _lexical_scores(conn: psycopg.Connection, terms: "_Terms", config: str, hits: list[Citation]) -> dict[str, float]:
    """The words' score of each of ``hits`` (the held words' weights, plus ts_rank_cd, plus the
    weights of those its headings hold): one statement for the pool. Passages holding none of
    the words are left out."""
    if not hits or not terms.weights:
        return {}
    rows = conn.execute(sql.SQL(
        "SELECT p.url, c.chunk_index, held.weight + ts_rank_cd(c.text_search, held.words, 1)"
        "  + %(heading)s * held.in_own + %(crumb)s * held.in_above"
        " FROM unnest(%(urls)s::text[], %(idx)s::int[]) AS h (url, chunk_index)"
        " JOIN pages p ON p.url = h.url JOIN chunks c ON c.page_id = p.page_id AND c.chunk_index = h.chunk_index"
        # Its headings' words, made once a passage: those it opens (`#` lines of its content) and
        # those above it (the breadcrumb line its embedded text starts with, when it has one).
        " CROSS JOIN LATERAL (SELECT"
        "   to_tsvector({config}, coalesce((SELECT string_agg(m[1], ' ')"
        "     FROM regexp_matches(c.content, '^#+\\s+(.*)$', 'gn') m), '')) AS own,"
        "   to_tsvector({config}, CASE WHEN starts_with(c.embed_text, split_part(c.content, E'\\n', 1)) THEN ''"
        "     ELSE split_part(c.embed_text, E'\\n', 1) END) AS above) hd"
        " CROSS JOIN LATERAL (SELECT sum(t.weight) AS weight, string_agg(t.term::text, ' | ')::tsquery AS words,"
        "                            coalesce(sum(t.weight) FILTER (WHERE hd.own @@ t.term), 0) AS in_own,"
        "                            coalesce(sum(t.weight) FILTER (WHERE hd.above @@ t.term), 0) AS in_above"
        "                     FROM unnest(%(terms)s::tsquery[], %(weights)s::float8[]) t (term, weight)"
        "                     WHERE c.text_search @@ t.term) held"
        " WHERE held.weight IS NOT NULL"
    ).format(config=sql.Literal(config)), {
        "terms": [tsquery_term(w) for w in terms.weights], "weights": list(terms.weights.values()),
        "heading": HEADING_WEIGHT, "crumb": BREADCRUMB_WEIGHT,
        "urls": [h.page_url for h in hits], "idx": [h.chunk_index for h in hits]}).fetchall()
    return {f"{url}#{index}": float(score) for url, index, score in rows}


def _where(filters: SearchFilters) -> tuple[sql.Composable, dict]:
    """The pages a passage may come from: live, and passing every filter."""
    clauses: list[sql.Composable] = [sql.SQL("p.deleted_at IS NULL")]
    params: dict = {}
    if filters.verified_within is not None:
        clauses.append(sql.SQL("p.last_verified_at >= now() - %(verified_within)s"))
        params["verified_within"] = filters.verified_within
    if filters.changed_since is not None:
        clauses.append(sql.SQL("p.last_changed_at >= %(changed_since)s"))
        params["changed_since"] = filters.changed_since
    if filters.sites:
        clauses.append(sql.SQL("p.url LIKE ANY(%(sites)s)"))
        params["sites"] = list(filters.sites)
    return sql.SQL(" AND ").join(clauses), params


@dataclass(frozen=True)
class _Terms:
    """A question's words as the lexical scan weighs them (read once a search, not once a scan)."""

    weights: dict[str, float]
    candidates: list[str]


def _terms(conn: psycopg.Connection, question: str, config: str) -> _Terms:
    from rag_pipeline.store import text_search

    words = text_search.lexemes(conn, config, question)
    shares, unlisted = text_search.common_shares(conn) if words else ({}, 0.0)
    weights = term_weights(words, shares, unlisted)
    return _Terms(weights, candidate_terms(weights, shares))


def _text_scan(conn: psycopg.Connection, terms: _Terms, limit: int, filters: SearchFilters) -> list[Citation]:
    """Passages holding the question's words, ranked by the weight of the words they hold (the
    rarer, the more: core/lexical.py), then by ts_rank_cd (more of them, closer together).

    ts_rank_cd is given, for each passage, only the question's words that passage holds (``held``,
    ORed): the same rank as the whole question ORed (words a passage lacks make no cover), but its
    cost grows with the words of the question, about as their square, and a question of 280 rare
    words took 2 ms a passage (3.4 s for its 1,241 candidates among 50,000; bench/query_api.py
    --hostile). Now 0.1 ms."""
    if not terms.weights:   # stop words only
        return []
    where, params = _where(filters)
    params.update(k=limit, any=any_of(terms.candidates),
                  terms=[tsquery_term(w) for w in terms.weights], weights=list(terms.weights.values()))
    query = sql.SQL(
        "SELECT coalesce(p.crawl_url, p.url), c.content, c.chunk_index,"
        "       held.weight + ts_rank_cd(c.text_search, held.words, 1) AS score,"
        "       p.last_verified_at, p.last_changed_at, p.url"
        " FROM chunks c JOIN pages p ON p.page_id = c.page_id"
        " CROSS JOIN LATERAL (SELECT sum(t.weight) AS weight, string_agg(t.term::text, ' | ')::tsquery AS words"
        "                     FROM unnest(%(terms)s::tsquery[], %(weights)s::float8[]) t (term, weight)"
        "                     WHERE c.text_search @@ t.term) held"
        " WHERE c.text_search @@ %(any)s::tsquery AND {where}"
        " ORDER BY 4 DESC, c.chunk_id LIMIT %(k)s"
    ).format(where=where)
    with conn.transaction():
        _plan_with_values(conn)
        rows = conn.execute(query, params).fetchall()
    return [
        Citation(url=r[0], page_url=r[6], excerpt=excerpt(r[1]), content=r[1], chunk_index=r[2],
                 distance=math.nan, last_verified_at=r[4], last_changed_at=r[5], score=float(r[3]))
        for r in rows
    ]


def _plan_with_values(conn: psycopg.Connection, settings: dict[str, str] | None = None) -> None:
    """Plan this transaction's scans with their values (and set ``settings`` for it), in one
    round trip. psycopg prepares a statement a connection runs five times, and Postgres may then
    keep a generic plan (or always, under plan_cache_mode = force_generic_plan). A generic plan
    does not know the LIMIT, assumes a tenth of the rows, and sorted every passage instead of
    walking the HNSW index: 24 ms against 3 ms at 10,000 passages. It does not know the words
    either, whose frequency decides between the text index and a scan."""
    values = {"plan_cache_mode": "force_custom_plan", **(settings or {})}
    conn.execute("SELECT set_config(name, value, true) FROM unnest(%s::text[], %s::text[]) AS s (name, value)",
                 (list(values), list(values.values())))


def _query(space: Space, where: sql.Composable, *, indexed: bool) -> sql.Composed:
    # The space's own table, named in the SQL: its HNSW index serves the plan (planned with its
    # values: _plan_with_values).
    # Not indexed: the same distance in an expression the index cannot serve, so the plan reads
    # the passages of the pages that pass and sorts them exactly.
    order = sql.SQL("v.embedding{cast} <=> %(q)s{cast}" if indexed else "(v.embedding{cast} <=> %(q)s{cast}) + 0")
    return sql.SQL(
        "SELECT coalesce(p.crawl_url, p.url), c.content, c.chunk_index,"
        "       (v.embedding{cast} <=> %(q)s{cast}) AS distance, p.last_verified_at, p.last_changed_at, p.url"
        " FROM {table} v JOIN chunks c ON c.chunk_id = v.chunk_id JOIN pages p ON p.page_id = c.page_id"
        " WHERE {where}"
        " ORDER BY {order} LIMIT %(k)s"
    ).format(order=order.format(cast=space.cast()), where=where, cast=space.cast(), table=space.table())


def live_urls(conn: psycopg.Connection, urls: list[str]) -> set[str]:
    """Those of ``urls`` (normalized page URLs) whose page is still in search now: not tombstoned,
    not turned into a redirect."""
    if not urls:
        return set()
    rows = conn.execute(
        "SELECT url FROM pages WHERE url = ANY(%s) AND deleted_at IS NULL AND alias_of IS NULL", (list(urls),)
    ).fetchall()
    return {r[0] for r in rows}
