"""Embedding spaces: which model's vectors search reads, and the HNSW index of each space.

The `vector` column has no fixed dimension, so each space gets a partial expression index
cast to its own dimension; search repeats the same cast so the planner uses it. pgvector's
HNSW takes `vector` up to 2,000 dimensions, so larger spaces are indexed as `halfvec`.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

SPACE_LOCK_KEY = 0x5241_4702
HNSW_VECTOR_MAX_DIMS = 2000


class SpaceMismatch(RuntimeError):
    """The configured embedder is not the model of the active space."""


@dataclass(frozen=True)
class Space:
    space_id: int
    model: str
    dimensions: int
    status: str

    @property
    def vector_type(self) -> str:
        return "vector" if self.dimensions <= HNSW_VECTOR_MAX_DIMS else "halfvec"

    def cast(self) -> sql.Composable:
        """`::vector(d)` (or `::halfvec(d)`), the cast that both the index and search use."""
        return sql.SQL("::{}({})").format(sql.SQL(self.vector_type), sql.Literal(self.dimensions))


def active(conn: psycopg.Connection) -> Space | None:
    row = conn.execute(
        "SELECT space_id, model, dimensions, status FROM embedding_spaces WHERE status = 'active'"
    ).fetchone()
    return Space(*row) if row else None


def ensure_active(conn: psycopg.Connection, model: str, dimensions: int) -> Space:
    """The active space, created (with its index) on first use; refuses a silent model switch."""
    current = active(conn)
    if current is None:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (SPACE_LOCK_KEY,))
            current = active(conn)
            if current is None:
                row = conn.execute(
                    "INSERT INTO embedding_spaces (model, dimensions, status, activated_at)"
                    " VALUES (%s, %s, 'active', now())"
                    " ON CONFLICT (model, dimensions) DO UPDATE SET status = 'active', activated_at = now()"
                    " RETURNING space_id, model, dimensions, status",
                    (model, dimensions),
                ).fetchone()
                current = Space(*row)
                create_index(conn, current)
    if (current.model, current.dimensions) != (model, dimensions):
        raise SpaceMismatch(
            f"the active embedding space is {current.model} ({current.dimensions} dims) but the "
            f"configured embedder is {model} ({dimensions} dims); set EMBEDDING_PROVIDER/"
            "EMBEDDING_MODEL back, or rebuild the index for the new model (see README, 'Switching models')"
        )
    return current


def by_id(conn: psycopg.Connection, space_id: int) -> Space | None:
    row = conn.execute(
        "SELECT space_id, model, dimensions, status FROM embedding_spaces WHERE space_id = %s", (space_id,)
    ).fetchone()
    return Space(*row) if row else None


def find(conn: psycopg.Connection, model: str, dimensions: int) -> Space | None:
    row = conn.execute(
        "SELECT space_id, model, dimensions, status FROM embedding_spaces WHERE model = %s AND dimensions = %s",
        (model, dimensions),
    ).fetchone()
    return Space(*row) if row else None


def list_all(conn: psycopg.Connection) -> list[Space]:
    rows = conn.execute(
        "SELECT space_id, model, dimensions, status FROM embedding_spaces ORDER BY space_id"
    ).fetchall()
    return [Space(*r) for r in rows]


def ensure_building(conn: psycopg.Connection, model: str, dimensions: int) -> Space:
    """A space to fill beside the active one (a retired one is reused with its vectors)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (SPACE_LOCK_KEY,))
        existing = find(conn, model, dimensions)
        if existing is not None and existing.status == "active":
            return existing
        row = conn.execute(
            "INSERT INTO embedding_spaces (model, dimensions, status) VALUES (%s, %s, 'building')"
            " ON CONFLICT (model, dimensions) DO UPDATE SET status = 'building'"
            " RETURNING space_id, model, dimensions, status",
            (model, dimensions),
        ).fetchone()
        space = Space(*row)
        create_index(conn, space)
    return space


def create_index(conn: psycopg.Connection, space: Space) -> None:
    ops = "vector_cosine_ops" if space.vector_type == "vector" else "halfvec_cosine_ops"
    conn.execute(
        sql.SQL(
            "CREATE INDEX IF NOT EXISTS {name} ON chunks USING hnsw ((embedding{cast}) {ops})"
            " WHERE space_id = {space_id}"
        ).format(
            name=sql.Identifier(f"chunks_hnsw_space_{space.space_id}"),
            cast=space.cast(),
            ops=sql.SQL(ops),
            space_id=sql.Literal(space.space_id),
        )
    )
