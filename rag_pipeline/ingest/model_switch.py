"""Switching embedding models without a gap in search.

`build` fills a second embedding space from the chunk texts already in the index (no crawl,
no re-chunk) while the active space keeps serving; `activate` then moves every live chunk to
the new space's vectors and flips `active` in one transaction. The old space's vectors stay in
the cache, so switching back costs nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import psycopg

from rag_pipeline.embedders.base import Embedder
from rag_pipeline.store import chunks as chunk_store
from rag_pipeline.store import spaces

log = logging.getLogger(__name__)


class ModelSwitchError(RuntimeError):
    pass


@dataclass
class BuildResult:
    space: spaces.Space
    texts_embedded: int = 0
    tokens_embedded: int = 0
    requests: int = 0
    missing: int = 0


def _missing_texts(conn: psycopg.Connection, space: spaces.Space, limit: int) -> list[tuple[bytes, str, int]]:
    rows = conn.execute(
        "SELECT DISTINCT ON (c.embed_hash) c.embed_hash, c.embed_text, c.token_count FROM chunks c"
        " WHERE c.embed_text IS NOT NULL AND NOT EXISTS ("
        "   SELECT 1 FROM vectors v WHERE v.space_id = %s AND v.embed_hash = c.embed_hash)"
        " ORDER BY c.embed_hash LIMIT %s",
        (space.space_id, limit),
    ).fetchall()
    return [(bytes(h), t, n) for h, t, n in rows]


def _without_text(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT count(*) FROM chunks WHERE embed_text IS NULL").fetchone()[0]


def build(conn: psycopg.Connection, embedder: Embedder, *, batch: int = 512) -> BuildResult:
    """Embed every live chunk text the new model's space lacks; the active space is untouched."""
    if _without_text(conn):
        raise ModelSwitchError(
            "some chunks predate stored embed texts: run a re-chunk backfill first (README, 'Re-chunk backfill')"
        )
    space = spaces.ensure_building(conn, embedder.model, embedder.dimensions)
    result = BuildResult(space)
    while True:
        todo = _missing_texts(conn, space, batch)
        if not todo:
            return result
        embedded = embedder.embed([t for _, t, _ in todo])
        with conn.transaction():
            chunk_store.cache_vectors(conn, space, [(h, v, n) for (h, _, n), v in zip(todo, embedded.vectors)])
        result.texts_embedded += len(todo)
        result.tokens_embedded += embedded.tokens
        result.requests += embedded.requests
        log.info("space %s: %d texts embedded so far", space.space_id, result.texts_embedded)


def activate(conn: psycopg.Connection, embedder: Embedder) -> spaces.Space:
    """Catch up on texts indexed since the build, then flip search to the new space at once."""
    build(conn, embedder)  # whatever pages switched meanwhile
    space = spaces.find(conn, embedder.model, embedder.dimensions)
    if space is None:
        raise ModelSwitchError(f"no space for {embedder.model} ({embedder.dimensions} dims): build it first")
    if space.status == "active":
        return space
    with conn.transaction():
        conn.execute("LOCK TABLE chunks IN SHARE ROW EXCLUSIVE MODE")  # page switches wait for the flip
        for h, text, n in _missing_texts(conn, space, 10_000):
            # Pages switched in the last moments: few, embedded inside the flip.
            vector = embedder.embed([text]).vectors[0]
            chunk_store.cache_vectors(conn, space, [(h, vector, n)])
        moved = conn.execute(
            "UPDATE chunks c SET space_id = v.space_id, embedding = v.embedding FROM vectors v"
            " WHERE v.space_id = %s AND v.embed_hash = c.embed_hash",
            (space.space_id,),
        ).rowcount
        total = conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
        if moved != total:
            raise ModelSwitchError(f"{total - moved} chunk(s) have no vector in the new space; nothing changed")
        conn.execute("UPDATE embedding_spaces SET status = 'retired' WHERE status = 'active'")
        conn.execute(
            "UPDATE embedding_spaces SET status = 'active', activated_at = now() WHERE space_id = %s",
            (space.space_id,),
        )
    return spaces.Space(space.space_id, space.model, space.dimensions, "active")
