"""Filling a space's table of live vectors: in keyset pages of chunks, and from its backlog.

A model switch walks `chunks` once in chunk_id order (each page of the walk starts where the last
one ended: no scan restarted from the beginning), embeds the texts the space has no vector of
outside any transaction, and copies the vectors in. Page switches write the space meanwhile,
and put on its backlog the chunks they could not give a vector.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

import psycopg

from rag_pipeline.store import db
from rag_pipeline.store.spaces import Space


@dataclass(frozen=True)
class ChunkText:
    chunk_id: UUID
    embed_hash: bytes
    embed_text: str | None
    token_count: int


def texts_after(conn: psycopg.Connection, after: UUID | None, limit: int) -> list[ChunkText]:
    """The next `limit` live chunks in chunk_id order after `after` (one index range scan)."""
    rows = conn.execute(
        "SELECT chunk_id, embed_hash, embed_text, token_count FROM chunks"
        " WHERE %(after)s::uuid IS NULL OR chunk_id > %(after)s::uuid ORDER BY chunk_id LIMIT %(limit)s",
        {"after": after, "limit": limit},
    ).fetchall()
    return [ChunkText(r[0], bytes(r[1]), r[2], r[3]) for r in rows]


def copy_cached(conn: psycopg.Connection, space: Space, chunk_ids: list[UUID]) -> int:
    """Give these chunks their cached vector of `space`, as their text is now. A row a page switch
    wrote meanwhile is kept: the switch knew the chunk's newest text."""
    return conn.execute(
        "INSERT INTO space_vectors (chunk_id, space_id, embed_hash, embedding)"
        " SELECT c.chunk_id, v.space_id, c.embed_hash, v.embedding FROM chunks c"
        " JOIN vectors v ON v.space_id = %s AND v.embed_hash = c.embed_hash WHERE c.chunk_id = ANY(%s)"
        " ON CONFLICT (chunk_id, space_id) DO NOTHING",
        (space.space_id, chunk_ids),
    ).rowcount


def progress(conn: psycopg.Connection, space: Space) -> tuple[UUID | None, bool]:
    """(the chunk_id the walk got to, whether the walk and the index are done)."""
    row = conn.execute("SELECT fill_cursor, filled_at IS NOT NULL FROM embedding_spaces WHERE space_id = %s",
                       (space.space_id,)).fetchone()
    return row[0], row[1]


def advance(conn: psycopg.Connection, space: Space, cursor: UUID) -> None:
    conn.execute("UPDATE embedding_spaces SET fill_cursor = %s WHERE space_id = %s", (cursor, space.space_id))


def mark_filled(conn: psycopg.Connection, space: Space) -> None:
    conn.execute("UPDATE embedding_spaces SET filled_at = now() WHERE space_id = %s", (space.space_id,))


def backlog(conn: psycopg.Connection, space: Space, limit: int) -> list[ChunkText]:
    """Chunks on the space's backlog, as they are now (embed_text None: the chunk is gone)."""
    rows = conn.execute(
        "SELECT b.chunk_id, c.embed_hash, c.embed_text, coalesce(c.token_count, 0) FROM space_backlog b"
        " LEFT JOIN chunks c ON c.chunk_id = b.chunk_id WHERE b.space_id = %s ORDER BY b.chunk_id LIMIT %s",
        (space.space_id, limit),
    ).fetchall()
    return [ChunkText(r[0], bytes(r[1]) if r[1] is not None else b"", r[2], r[3]) for r in rows]


def settle_backlog(conn: psycopg.Connection, space: Space, chunk_ids: list[UUID]) -> int:
    """Bring these backlog chunks up to date in `space` (a vector of another text, left by a walk
    that read the chunk before a switch changed it, goes), and take off the backlog those now
    right or gone. Returns how many stay (their text has no vector yet)."""
    db.require_transaction(conn, "space_vectors.settle_backlog")
    conn.execute(
        "DELETE FROM space_vectors sv USING chunks c WHERE sv.space_id = %s AND sv.chunk_id = ANY(%s)"
        " AND c.chunk_id = sv.chunk_id AND sv.embed_hash <> c.embed_hash",
        (space.space_id, chunk_ids),
    )
    copy_cached(conn, space, chunk_ids)
    conn.execute(
        "DELETE FROM space_backlog b WHERE b.space_id = %(space)s AND b.chunk_id = ANY(%(ids)s) AND ("
        "   NOT EXISTS (SELECT 1 FROM chunks c WHERE c.chunk_id = b.chunk_id)"
        "   OR EXISTS (SELECT 1 FROM space_vectors sv JOIN chunks c ON c.chunk_id = sv.chunk_id"
        "              WHERE sv.space_id = %(space)s AND sv.chunk_id = b.chunk_id AND sv.embed_hash = c.embed_hash))",
        {"space": space.space_id, "ids": chunk_ids},
    )
    return conn.execute(
        "SELECT count(*) FROM space_backlog WHERE space_id = %s AND chunk_id = ANY(%s)",
        (space.space_id, chunk_ids),
    ).fetchone()[0]


def backlog_size(conn: psycopg.Connection, space: Space) -> int:
    return conn.execute("SELECT count(*) FROM space_backlog WHERE space_id = %s", (space.space_id,)).fetchone()[0]


def live_count(conn: psycopg.Connection, space: Space) -> int:
    return conn.execute("SELECT count(*) FROM space_vectors WHERE space_id = %s", (space.space_id,)).fetchone()[0]


def flip(conn: psycopg.Connection, space: Space, also=None) -> bool:
    """Make `space` the one search reads, if nothing is left to give a vector: one short
    transaction that waits for the page switches in flight and holds off new ones for its few
    milliseconds (they read which spaces to write after it). False: the backlog is not empty.
    ``also()`` runs in the same transaction (the flip's record: both or neither)."""
    with conn.transaction():
        conn.execute("LOCK TABLE chunks IN SHARE ROW EXCLUSIVE MODE")
        if backlog_size(conn, space):
            return False
        conn.execute("UPDATE embedding_spaces SET status = 'retired', retired_at = now() WHERE status = 'active'")
        conn.execute(
            "UPDATE embedding_spaces SET status = 'active', activated_at = now() WHERE space_id = %s",
            (space.space_id,),
        )
        if also is not None:
            also()
    return True
