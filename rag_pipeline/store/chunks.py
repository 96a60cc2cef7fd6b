"""Chunk generations, the vector cache, and the one-transaction switch of a page.

The chunks step stages a generation keyed by (page, source_hash); the embeddings step fills
the vector cache and then swaps the staged generation in. Search only ever reads `chunks`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID

import numpy as np
import psycopg

from rag_pipeline.store.spaces import Space


@dataclass(frozen=True)
class StagedChunk:
    chunk_id: UUID
    chunk_index: int
    content: str
    embed_text: str
    embed_hash: bytes
    token_count: int
    chunker_version: str


def stage(conn: psycopg.Connection, page_id: UUID, source_hash: str,
          chunks: Sequence[StagedChunk]) -> None:
    """Replace whatever was staged for this page by the generation of `source_hash`."""
    conn.execute("DELETE FROM staged_chunks WHERE page_id = %s", (page_id,))
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO staged_chunks (page_id, source_hash, chunk_index, chunk_id, content,"
            " embed_text, embed_hash, token_count, chunker_version)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            [
                (page_id, source_hash, c.chunk_index, c.chunk_id, c.content, c.embed_text,
                 c.embed_hash, c.token_count, c.chunker_version)
                for c in chunks
            ],
        )


def staged(conn: psycopg.Connection, page_id: UUID, source_hash: str) -> list[StagedChunk]:
    rows = conn.execute(
        "SELECT chunk_id, chunk_index, content, embed_text, embed_hash, token_count, chunker_version"
        " FROM staged_chunks WHERE page_id = %s AND source_hash = %s ORDER BY chunk_index",
        (page_id, source_hash),
    ).fetchall()
    return [StagedChunk(r[0], r[1], r[2], r[3], bytes(r[4]), r[5], r[6]) for r in rows]


def cached_hashes(conn: psycopg.Connection, space: Space, hashes: Sequence[bytes]) -> set[bytes]:
    """Which of these texts already have a vector in this space."""
    if not hashes:
        return set()
    rows = conn.execute(
        "SELECT embed_hash FROM vectors WHERE space_id = %s AND embed_hash = ANY(%s)",
        (space.space_id, list(hashes)),
    ).fetchall()
    return {bytes(r[0]) for r in rows}


def cache_vectors(conn: psycopg.Connection, space: Space,
                  items: Sequence[tuple[bytes, Sequence[float], int]]) -> None:
    """Add (embed_hash, vector, tokens) to the cache; a hash cached concurrently is kept as is."""
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO vectors (space_id, embed_hash, embedding, token_count)"
            " VALUES (%s, %s, %s, %s) ON CONFLICT (space_id, embed_hash) DO NOTHING",
            [
                (space.space_id, h, np.asarray(v, dtype=np.float32), tokens)
                for h, v, tokens in items
            ],
        )


class IncompleteGeneration(RuntimeError):
    """A staged chunk has no vector in the active space: the switch must not happen."""


def hold_off_space_flip(conn: psycopg.Connection) -> None:
    """Inside a page switch's transaction, before it reads the active space: `space activate`
    flips under a SHARE ROW EXCLUSIVE lock on `chunks`, so either the flip waits for this switch
    (and catches up on its texts), or it has committed and the switch sees the new active space.
    Page switches do not block one another (ROW EXCLUSIVE is what their writes take anyway)."""
    conn.execute("LOCK TABLE chunks IN ROW EXCLUSIVE MODE")


def swap_in(conn: psycopg.Connection, page_id: UUID, source_hash: str, space: Space) -> int:
    """Replace the page's live chunks by the staged generation (caller holds the page row lock
    inside one transaction). Returns the number of live chunks."""
    expected = conn.execute(
        "SELECT count(*) FROM staged_chunks WHERE page_id = %s AND source_hash = %s",
        (page_id, source_hash),
    ).fetchone()[0]
    conn.execute(
        "DELETE FROM chunks c WHERE c.page_id = %s AND NOT EXISTS ("
        " SELECT 1 FROM staged_chunks s WHERE s.page_id = c.page_id AND s.source_hash = %s"
        " AND s.chunk_id = c.chunk_id)",
        (page_id, source_hash),
    )
    written = conn.execute(
        "INSERT INTO chunks (chunk_id, page_id, chunk_index, content, embed_text, embed_hash, token_count,"
        " chunker_version, space_id, embedding)"
        " SELECT s.chunk_id, s.page_id, s.chunk_index, s.content, s.embed_text, s.embed_hash, s.token_count,"
        "        s.chunker_version, v.space_id, v.embedding"
        " FROM staged_chunks s JOIN vectors v ON v.space_id = %s AND v.embed_hash = s.embed_hash"
        " WHERE s.page_id = %s AND s.source_hash = %s"
        " ON CONFLICT (chunk_id) DO UPDATE SET chunk_index = excluded.chunk_index,"
        "   content = excluded.content, embed_text = excluded.embed_text, embed_hash = excluded.embed_hash,"
        "   token_count = excluded.token_count, chunker_version = excluded.chunker_version,"
        "   space_id = excluded.space_id, embedding = excluded.embedding"
        # Rewrite only rows that differ: an unchanged chunk costs no write (and no HNSW update).
        " WHERE (chunks.embed_hash, chunks.space_id, chunks.content, chunks.chunker_version, chunks.embed_text)"
        "   IS DISTINCT FROM (excluded.embed_hash, excluded.space_id, excluded.content, excluded.chunker_version,"
        "                     excluded.embed_text)",
        (space.space_id, page_id, source_hash),
    ).rowcount
    live = conn.execute("SELECT count(*) FROM chunks WHERE page_id = %s", (page_id,)).fetchone()[0]
    if live != expected:
        raise IncompleteGeneration(
            f"page {page_id}: {expected} staged chunks but {live} live after the swap "
            f"({written} written); a vector is missing from space {space.space_id}"
        )
    conn.execute("DELETE FROM staged_chunks WHERE page_id = %s", (page_id,))
    return live


def record_ledger(conn: psycopg.Connection, *, run_id: str | None, page_url: str, space: Space,
                  chunks_total: int, chunks_embedded: int, tokens_embedded: int,
                  tokens_reused: int, requests: int) -> None:
    conn.execute(
        "INSERT INTO embedding_ledger (run_id, page_url, space_id, chunks_total, chunks_embedded,"
        " tokens_embedded, tokens_reused, requests) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
        (run_id, page_url, space.space_id, chunks_total, chunks_embedded, tokens_embedded,
         tokens_reused, requests),
    )
