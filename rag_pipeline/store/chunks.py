"""Chunk generations, the vector cache, and the one-transaction switch of a page.

The chunks step stages a generation keyed by (page, source_hash); the embeddings step fills
the vector cache and then swaps the staged generation in: its chunks into `chunks`, their vectors
into the table of each space search reads or will read (`space_vectors`). Search reads only those.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID

import numpy as np
import psycopg

from rag_pipeline.store import db
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


def stage(conn: psycopg.Connection, generations: dict[UUID, tuple[str, Sequence[StagedChunk]]]) -> None:
    """Replace what was staged for these pages by their new generations: page_id → (source_hash, chunks), one DELETE and one COPY."""
    if not generations:
        return
    with conn.transaction():
        conn.execute("DELETE FROM staged_chunks WHERE page_id = ANY(%s)", (list(generations),))
        with conn.cursor() as cur, cur.copy(
            "COPY staged_chunks (page_id, source_hash, chunk_index, chunk_id, content, embed_text, embed_hash,"
            " token_count, chunker_version) FROM STDIN"
        ) as copy:
            for page_id, (source_hash, chunks) in generations.items():
                for c in chunks:
                    copy.write_row((page_id, source_hash, c.chunk_index, c.chunk_id, c.content, c.embed_text,
                                    c.embed_hash, c.token_count, c.chunker_version))


def staged(conn: psycopg.Connection, page_id: UUID, source_hash: str) -> list[StagedChunk]:
    return staged_many(conn, [(page_id, source_hash)])[page_id]


def staged_many(conn: psycopg.Connection, wanted: Sequence[tuple[UUID, str]]) -> dict[UUID, list[StagedChunk]]:
    """`staged` for many pages in one statement: (page_id, source_hash) each; a page with
    nothing staged from that source maps to []."""
    out: dict[UUID, list[StagedChunk]] = {pid: [] for pid, _ in wanted}
    if not wanted:
        return out
    rows = conn.execute(
        "SELECT s.page_id, s.chunk_id, s.chunk_index, s.content, s.embed_text, s.embed_hash, s.token_count,"
        "       s.chunker_version"
        " FROM unnest(%s::uuid[], %s::text[]) AS w (page_id, source_hash)"
        " JOIN staged_chunks s ON s.page_id = w.page_id AND s.source_hash = w.source_hash"
        " ORDER BY s.page_id, s.chunk_index",
        ([pid for pid, _ in wanted], [h for _, h in wanted]),
    ).fetchall()
    for r in rows:
        out[r[0]].append(StagedChunk(r[1], r[2], r[3], r[4], bytes(r[5]), r[6], r[7]))
    return out


def pages_staged(conn: psycopg.Connection, urls: Sequence[str]) -> set[str]:
    """Which of these pages have chunks staged from their current source, waiting for a switch."""
    rows = conn.execute(
        "SELECT p.url FROM pages p WHERE p.url = ANY(%s) AND EXISTS (SELECT 1 FROM staged_chunks s"
        " WHERE s.page_id = p.page_id AND s.source_hash = p.source_hash)", (list(urls),)).fetchall()
    return {r[0] for r in rows}


def discard_staged(conn: psycopg.Connection, page_ids: UUID | Sequence[UUID]) -> None:
    """Staged generations that will never switch in (their page lost its source: a tombstone)."""
    ids = [page_ids] if isinstance(page_ids, UUID) else list(page_ids)
    if ids:
        conn.execute("DELETE FROM staged_chunks WHERE page_id = ANY(%s)", (ids,))


def count_without_text(conn: psycopg.Connection) -> int:
    """Chunks stored before their embed text was kept: a new space cannot be built from them."""
    return conn.execute("SELECT count(*) FROM chunks WHERE embed_text IS NULL").fetchone()[0]


def cached_hashes(conn: psycopg.Connection, space: Space, hashes: Sequence[bytes]) -> set[bytes]:
    """Which of these texts already have a vector in this space."""
    if not hashes:
        return set()
    rows = conn.execute(
        "SELECT embed_hash FROM vectors WHERE space_id = %s AND embed_hash = ANY(%s)",
        (space.space_id, list(hashes)),
    ).fetchall()
    return {bytes(r[0]) for r in rows}


def live_hashes(conn: psycopg.Connection, page_ids: Sequence[UUID]) -> dict[UUID, dict[int, bytes]]:
    """Each page's live chunks: chunk index → the hash of the text its vector embeds. A re-cut
    chunk whose index keeps its hash writes no row: what a re-chunk's plan counts."""
    live: dict[UUID, dict[int, bytes]] = {}
    for page_id, index, digest in conn.execute(
            "SELECT page_id, chunk_index, embed_hash FROM chunks WHERE page_id = ANY(%s)", (list(page_ids),)):
        live.setdefault(page_id, {})[index] = bytes(digest)
    return live


def cached_count(conn: psycopg.Connection, space: Space) -> int:
    return conn.execute("SELECT count(*) FROM vectors WHERE space_id = %s", (space.space_id,)).fetchone()[0]


def cache_vectors(conn: psycopg.Connection, space: Space,
                  items: Sequence[tuple[bytes, Sequence[float], int]]) -> None:
    """Add (embed_hash, vector, tokens) to the cache, one statement for the lot; a hash cached
    concurrently is kept as is. The vectors go as a binary array (`%b`): as text, psycopg formats
    every float in Python, 3 s of CPU for 7,000 vectors of 256 dims against 0.15 s."""
    if not items:
        return
    conn.execute(
        "INSERT INTO vectors (space_id, embed_hash, embedding, token_count)"
        " SELECT %s, n.embed_hash, n.embedding, n.token_count"
        " FROM unnest(%s::bytea[], %b::vector[], %s::integer[]) AS n (embed_hash, embedding, token_count)"
        " ON CONFLICT (space_id, embed_hash) DO NOTHING",
        (space.space_id, [h for h, _, _ in items], [np.asarray(v, dtype=np.float32) for _, v, _ in items],
         [tokens for _, _, tokens in items]))


class IncompleteGeneration(RuntimeError):
    """A staged chunk has no vector in the active space: the switch must not happen."""


def hold_off_space_flip(conn: psycopg.Connection) -> None:
    """Inside a page switch's transaction, before it reads which spaces to write: `space activate`
    flips, and `space build` starts a space, under a SHARE ROW EXCLUSIVE lock on `chunks`, so each
    either waits for this switch or has committed before it reads. Page switches do not block one
    another (ROW EXCLUSIVE is what their writes take anyway)."""
    conn.execute("LOCK TABLE chunks IN ROW EXCLUSIVE MODE")


def swap_in(conn: psycopg.Connection, page_id: UUID, source_hash: str, space: Space,
            building: Sequence[Space] = ()) -> int:
    """Replace the page's live chunks by the staged generation and write their vectors into the
    active space's table and into each space being built (caller holds the page row lock inside
    one transaction). A chunk whose text a building space has no vector of yet goes on that
    space's backlog. Returns the number of live chunks."""
    db.require_transaction(conn, "chunks.swap_in")
    expected = conn.execute(
        "SELECT count(*) FROM staged_chunks WHERE page_id = %s AND source_hash = %s",
        (page_id, source_hash),
    ).fetchone()[0]
    # Chunks of the old generation leave, with their vectors (ON DELETE CASCADE).
    conn.execute(
        "DELETE FROM chunks c WHERE c.page_id = %s AND NOT EXISTS ("
        " SELECT 1 FROM staged_chunks s WHERE s.page_id = c.page_id AND s.source_hash = %s"
        " AND s.chunk_id = c.chunk_id)",
        (page_id, source_hash),
    )
    conn.execute(
        "INSERT INTO chunks (chunk_id, page_id, chunk_index, content, embed_text, embed_hash, token_count,"
        " chunker_version)"
        " SELECT s.chunk_id, s.page_id, s.chunk_index, s.content, s.embed_text, s.embed_hash, s.token_count,"
        "        s.chunker_version"
        " FROM staged_chunks s WHERE s.page_id = %s AND s.source_hash = %s"
        " ON CONFLICT (chunk_id) DO UPDATE SET chunk_index = excluded.chunk_index,"
        "   content = excluded.content, embed_text = excluded.embed_text, embed_hash = excluded.embed_hash,"
        "   token_count = excluded.token_count, chunker_version = excluded.chunker_version"
        # Rewrite only rows that differ: an unchanged chunk costs no write.
        " WHERE (chunks.chunk_index, chunks.embed_hash, chunks.content, chunks.chunker_version, chunks.embed_text)"
        "   IS DISTINCT FROM (excluded.chunk_index, excluded.embed_hash, excluded.content,"
        "                     excluded.chunker_version, excluded.embed_text)",
        (page_id, source_hash),
    )
    spaces = [space.space_id, *(b.space_id for b in building if b.space_id != space.space_id)]
    # A vector moves only when its chunk's text did: an unchanged text costs no HNSW insert. The
    # switch knows the chunk's current text, so it overwrites whatever a concurrent build wrote.
    conn.execute(
        "INSERT INTO space_vectors (chunk_id, space_id, embed_hash, embedding)"
        " SELECT c.chunk_id, v.space_id, c.embed_hash, v.embedding FROM chunks c"
        " JOIN vectors v ON v.space_id = ANY(%s) AND v.embed_hash = c.embed_hash WHERE c.page_id = %s"
        " ON CONFLICT (chunk_id, space_id) DO UPDATE SET embed_hash = excluded.embed_hash,"
        "   embedding = excluded.embedding WHERE space_vectors.embed_hash <> excluded.embed_hash",
        (spaces, page_id),
    )
    if len(spaces) > 1:
        conn.execute(
            "DELETE FROM space_vectors sv USING chunks c WHERE c.page_id = %s AND sv.chunk_id = c.chunk_id"
            " AND sv.space_id = ANY(%s) AND sv.embed_hash <> c.embed_hash",
            (page_id, spaces[1:]),
        )
        conn.execute(
            "INSERT INTO space_backlog (space_id, chunk_id)"
            " SELECT b.space_id, c.chunk_id FROM chunks c CROSS JOIN unnest(%s::integer[]) b (space_id)"
            " WHERE c.page_id = %s AND NOT EXISTS (SELECT 1 FROM space_vectors sv"
            "   WHERE sv.chunk_id = c.chunk_id AND sv.space_id = b.space_id)"
            " ON CONFLICT DO NOTHING",
            (spaces[1:], page_id),
        )
    live, searchable = conn.execute(
        "SELECT count(*), count(sv.chunk_id) FROM chunks c LEFT JOIN space_vectors sv"
        " ON sv.chunk_id = c.chunk_id AND sv.space_id = %s AND sv.embed_hash = c.embed_hash"
        " WHERE c.page_id = %s",
        (space.space_id, page_id),
    ).fetchone()
    if live != expected or searchable != live:
        raise IncompleteGeneration(
            f"page {page_id}: {expected} staged chunks, {live} live after the swap, {searchable} with "
            f"a vector; a vector is missing from space {space.space_id}"
        )
    conn.execute("DELETE FROM staged_chunks WHERE page_id = %s", (page_id,))
    return live


def swap_in_many(conn: psycopg.Connection, generations: dict[UUID, str], space: Space) -> dict[UUID, int]:
    """`swap_in` for many pages at once (page_id → the source_hash staged), into the active space
    only (no space is being built): a statement per step for the whole set. Raises
    IncompleteGeneration, naming the page, if any page would go live without all its vectors (the
    caller rolls back and switches page by page). Returns each page's live chunks."""
    db.require_transaction(conn, "chunks.swap_in_many")
    if not generations:
        return {}
    ids, hashes = list(generations), list(generations.values())
    pages_sql = "unnest(%(ids)s::uuid[], %(hashes)s::text[]) AS p (page_id, source_hash)"
    params = {"ids": ids, "hashes": hashes, "space": space.space_id}
    expected = dict(conn.execute(
        f"SELECT s.page_id, count(*) FROM staged_chunks s JOIN {pages_sql}"
        " ON s.page_id = p.page_id AND s.source_hash = p.source_hash GROUP BY s.page_id", params).fetchall())
    conn.execute(
        f"DELETE FROM chunks c USING {pages_sql} WHERE c.page_id = p.page_id AND NOT EXISTS ("
        " SELECT 1 FROM staged_chunks s WHERE s.page_id = c.page_id AND s.source_hash = p.source_hash"
        " AND s.chunk_id = c.chunk_id)", params)
    conn.execute(
        "INSERT INTO chunks (chunk_id, page_id, chunk_index, content, embed_text, embed_hash, token_count,"
        " chunker_version)"
        " SELECT s.chunk_id, s.page_id, s.chunk_index, s.content, s.embed_text, s.embed_hash, s.token_count,"
        "        s.chunker_version"
        f" FROM staged_chunks s JOIN {pages_sql} ON s.page_id = p.page_id AND s.source_hash = p.source_hash"
        " ON CONFLICT (chunk_id) DO UPDATE SET chunk_index = excluded.chunk_index,"
        "   content = excluded.content, embed_text = excluded.embed_text, embed_hash = excluded.embed_hash,"
        "   token_count = excluded.token_count, chunker_version = excluded.chunker_version"
        " WHERE (chunks.chunk_index, chunks.embed_hash, chunks.content, chunks.chunker_version, chunks.embed_text)"
        "   IS DISTINCT FROM (excluded.chunk_index, excluded.embed_hash, excluded.content,"
        "                     excluded.chunker_version, excluded.embed_text)", params)
    conn.execute(
        "INSERT INTO space_vectors (chunk_id, space_id, embed_hash, embedding)"
        " SELECT c.chunk_id, v.space_id, c.embed_hash, v.embedding FROM chunks c"
        " JOIN vectors v ON v.space_id = %(space)s AND v.embed_hash = c.embed_hash WHERE c.page_id = ANY(%(ids)s)"
        " ON CONFLICT (chunk_id, space_id) DO UPDATE SET embed_hash = excluded.embed_hash,"
        "   embedding = excluded.embedding WHERE space_vectors.embed_hash <> excluded.embed_hash", params)
    live = {page_id: (n, searchable) for page_id, n, searchable in conn.execute(
        "SELECT c.page_id, count(*), count(sv.chunk_id) FROM chunks c LEFT JOIN space_vectors sv"
        " ON sv.chunk_id = c.chunk_id AND sv.space_id = %(space)s AND sv.embed_hash = c.embed_hash"
        " WHERE c.page_id = ANY(%(ids)s) GROUP BY c.page_id", params).fetchall()}
    for page_id in ids:
        n, searchable = live.get(page_id, (0, 0))
        if n != expected.get(page_id, 0) or searchable != n:
            raise IncompleteGeneration(
                f"page {page_id}: {expected.get(page_id, 0)} staged chunks, {n} live after the swap, "
                f"{searchable} with a vector; a vector is missing from space {space.space_id}")
    conn.execute("DELETE FROM staged_chunks WHERE page_id = ANY(%s)", (ids,))
    return {page_id: live.get(page_id, (0, 0))[0] for page_id in ids}


def record_ledger(conn: psycopg.Connection, space: Space, run_id: str | None,
                       rows: list[tuple[str, int, int, int, int, int]]) -> None:
    """What each page switch cost and saved: (page_url, chunks_total, chunks_embedded, tokens_embedded,
    tokens_reused, requests) each, in one COPY."""
    with conn.cursor() as cur, cur.copy(
        "COPY embedding_ledger (run_id, page_url, space_id, chunks_total, chunks_embedded, tokens_embedded,"
        " tokens_reused, requests) FROM STDIN"
    ) as copy:
        for row in rows:
            copy.write_row((run_id, row[0], space.space_id, *row[1:]))


