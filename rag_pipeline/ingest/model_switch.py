"""Switching embedding models without a gap in search, at any index size.

`build` fills a second space's table from the chunk texts already in the index (no crawl, no
re-chunk) while the active space keeps serving: one keyset walk over `chunks`, embedding only
texts the space has no cached vector of, outside any transaction; then the space's HNSW index,
built once over the loaded table, concurrently. Page switches go on meanwhile and write both
spaces (a chunk whose new text the building space has no vector of goes on its backlog).
`activate` works the backlog off, then flips a status in a transaction of milliseconds: no rewrite
of `chunks`, no lock held while embedding. The old space's vectors stay in the cache, so
switching back embeds nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg

from rag_pipeline.embedders.base import Embedder
from rag_pipeline.ingest import vector_cache
from rag_pipeline.store import chunks as chunk_store
from rag_pipeline.store import evaluations, space_vectors, spaces

if TYPE_CHECKING:
    from rag_pipeline.ingest.activation_gate import Gate

log = logging.getLogger(__name__)

#: Chunks per page of the walk: a full embedding request of short chunks.
WALK_PAGE = 2048
# A backlog that keeps refilling (pages switched in faster than we embed them) is worked off
# this many times before `activate` gives up and says so.
_MAX_ROUNDS = 20


class ModelSwitchError(RuntimeError):
    pass


@dataclass
class BuildResult:
    space: spaces.Space
    texts_embedded: int = 0
    tokens_embedded: int = 0
    requests: int = 0
    chunks_walked: int = 0
    index_built: bool = False
    index_s: float = 0.0


Progress = Callable[[BuildResult], None]


def _embed_missing(conn: psycopg.Connection, space: spaces.Space, embedder: Embedder,
                   rows: list[space_vectors.ChunkText], result: BuildResult) -> None:
    texts = {r.embed_hash: (r.embed_text, r.token_count) for r in rows if r.embed_text is not None}
    count, spent = vector_cache.cache_uncached(conn, space, lambda: embedder, texts)
    if spent is not None:
        result.texts_embedded += count
        result.tokens_embedded += spent.tokens
        result.requests += spent.requests


def build(conn: psycopg.Connection, embedder: Embedder, *, page: int = WALK_PAGE,
          maintenance_work_mem: str = "auto", memory_max: str = "auto",
          on_progress: Progress | None = None) -> BuildResult:
    """Fill the configured model's space from every live chunk text; the active space is untouched.
    Resumes where a stopped build got to."""
    if chunk_store.count_without_text(conn):
        raise ModelSwitchError(
            "some chunks predate stored embed texts: run a re-chunk backfill first (docs/operations.md, 'Re-chunk backfill')"
        )
    space = spaces.ensure_building(conn, embedder.model, embedder.dimensions)
    result = BuildResult(space)
    if space.status == "active":
        return result
    cursor, filled = space_vectors.progress(conn, space)
    if not filled:
        while True:
            rows = space_vectors.texts_after(conn, cursor, page)
            if not rows:
                break
            _embed_missing(conn, space, embedder, rows, result)
            with conn.transaction():
                space_vectors.copy_cached(conn, space, [r.chunk_id for r in rows])
                cursor = rows[-1].chunk_id
                space_vectors.advance(conn, space, cursor)
            result.chunks_walked += len(rows)
            if on_progress:
                on_progress(result)
            log.info("space %s: %d chunks walked, %d texts embedded", space.space_id,
                     result.chunks_walked, result.texts_embedded)
        started = time.monotonic()
        spaces.build_index_concurrently(conn, space, maintenance_work_mem, memory_max=memory_max)
        result.index_built, result.index_s = True, time.monotonic() - started
        with conn.transaction():
            space_vectors.mark_filled(conn, space)
    drain_backlog(conn, space, embedder, result, page)
    return result


def drain_backlog(conn: psycopg.Connection, space: spaces.Space, embedder: Embedder,
                  result: BuildResult, page: int = WALK_PAGE) -> None:
    """Give every backlog chunk its vector (switches may add more meanwhile: one pass over what
    is there now)."""
    seen = 0
    total = space_vectors.backlog_size(conn, space)
    while seen < total:
        rows = space_vectors.backlog(conn, space, page)
        if not rows:
            return
        _embed_missing(conn, space, embedder, rows, result)
        with conn.transaction():
            left = space_vectors.settle_backlog(conn, space, [r.chunk_id for r in rows])
        seen += len(rows)
        if left == len(rows):   # their texts changed again while we embedded: next round
            return


def activate(conn: psycopg.Connection, embedder: Embedder, gate: "Gate | None" = None) -> spaces.Space:
    """Finish the build (the walk, the index, the backlog), then flip search to the new space.
    With a ``gate``, the candidate and the active space first answer its question sets: a worse
    candidate is refused (GateRefused) before anything changes. Every flip is recorded, with the
    figures compared and whether it was forced."""
    space = spaces.find(conn, embedder.model, embedder.dimensions)
    if space is None:
        raise ModelSwitchError(f"no space for {embedder.model} ({embedder.dimensions} dims): build it first")
    if space.status == "active":
        return space
    result = build(conn, embedder)   # resumes a walk that stopped; else only the backlog
    space = result.space
    previous = spaces.active(conn)
    for round_ in range(_MAX_ROUNDS):
        if spaces.index_state(conn, space) != "valid":
            raise ModelSwitchError(f"space {space.space_id} has no valid index: run `rag-pipeline space build` again")
        if round_ == 0 and gate is not None and previous is not None:
            gate.judge(conn, previous, space, embedder)
        if space_vectors.flip(conn, space, also=lambda: evaluations.record_activation(
                conn, space.space_id, previous.space_id if previous else None,
                gate.forced if gate else False, gate.figures() if gate else [])):
            return spaces.Space(space.space_id, space.model, space.dimensions, "active")
        drain_backlog(conn, space, embedder, result)
    raise ModelSwitchError(
        f"pages keep switching in new texts faster than space {space.space_id} catches up "
        f"({space_vectors.backlog_size(conn, space)} chunks on its backlog); nothing changed, try again"
    )
