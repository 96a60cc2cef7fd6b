"""Nearest chunks of live pages in the active space: one HNSW index scan of its table."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np
import psycopg
from psycopg import sql

from rag_pipeline.core.filters import SearchFilters
from rag_pipeline.core.ranking import best_per_key
from rag_pipeline.store.spaces import Space

EXCERPT_CHARS = 300


@dataclass(frozen=True)
class Citation:
    url: str                    # to open: the URL as crawled (http stays http), else the page key
    page_url: str               # the page's normalized URL: its partition key and identity
    excerpt: str
    content: str
    chunk_index: int
    distance: float
    last_verified_at: datetime | None
    last_changed_at: datetime | None

    def as_dict(self) -> dict:
        return {
            "url": self.url,
            "page_url": self.page_url,
            "excerpt": self.excerpt,
            "chunk_index": self.chunk_index,
            "score": round(1.0 - self.distance, 4),
            "last_verified_at": self.last_verified_at.isoformat() if self.last_verified_at else None,
            "last_changed_at": self.last_changed_at.isoformat() if self.last_changed_at else None,
        }


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    cut = flat.rfind(" ", 0, limit)
    return flat[: cut if cut > limit // 2 else limit] + "…"


# A page may hold many of the nearest passages: with one result a page, the scan asks for this
# many times k candidates first, and for more (up to MAX_CANDIDATES) while pages repeat.
CANDIDATES_PER_RESULT = 4
MAX_CANDIDATES = 4000


def nearest(conn: psycopg.Connection, space: Space, query_vector, k: int, *,
            ef_search: int | None = None, per_page: int | None = None,
            filters: SearchFilters = SearchFilters()) -> list[Citation]:
    """The k chunks of live pages nearest to the vector, at most ``per_page`` of one page (None:
    no limit), of pages that pass ``filters``. The index scan looks at max(ef_search, 2 ×
    candidates) (SEARCH_EF_SEARCH for `search` and `ask`; None: the server's setting, 40 unless
    set otherwise)."""
    if k < 1:
        raise ValueError("k must be at least 1")
    vec = np.asarray(query_vector, dtype=np.float32)
    if vec.shape != (space.dimensions,):
        raise ValueError(f"query vector has {vec.shape} dims, space has {space.dimensions}")
    limit = k if per_page is None else k * CANDIDATES_PER_RESULT
    while True:
        hits = _scan(conn, space, vec, limit, ef_search, filters)
        if per_page is None:
            return hits
        best = best_per_key(hits, lambda c: c.page_url, per_page, k)
        if len(best) == k or len(hits) < limit or limit >= MAX_CANDIDATES:
            return best
        limit = min(MAX_CANDIDATES, limit * CANDIDATES_PER_RESULT)


def _scan(conn: psycopg.Connection, space: Space, vec: np.ndarray, limit: int, ef_search: int | None,
          filters: SearchFilters) -> list[Citation]:
    where, params = _where(filters)
    params.update(q=vec, k=limit)
    with conn.transaction():
        # Enough candidates for the limit; the iterative scan goes on past ef_search while the
        # filters reject what it finds (relaxed order: re-sorted below).
        if ef_search is not None:
            conn.execute(sql.SQL("SET LOCAL hnsw.ef_search = {}").format(
                sql.Literal(min(1000, max(ef_search, 2 * limit)))))
        conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
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


def _query(space: Space, where: sql.Composable, *, indexed: bool) -> sql.Composed:
    # The space's own table, named in the SQL: its HNSW index serves every plan, generic or not.
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
