"""Embedding spaces: which model's vectors search reads, and each space's table and HNSW index.

The live vectors of a space are the partition `space_vectors_<id>` of `space_vectors`, with an
HNSW index of its own: search names the table, so its plan can scan that index (planned with
the query's values each time, prepared or not: store/search.py), and a model switch fills a new
table beside the live one and flips a status. The `vector` column has no fixed dimension, so
the index is on a cast to the space's own dimension, and search repeats the cast. pgvector's
HNSW takes `vector` up to 2,000 dimensions, so larger spaces are indexed as `halfvec`.
"""

from __future__ import annotations

from collections.abc import Callable

from dataclasses import dataclass

import psutil
import psycopg
from psycopg import sql

from rag_pipeline.core import build_memory
from rag_pipeline.store import db, indexes

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

    def table(self) -> sql.Identifier:
        """The partition of `space_vectors` holding this space's vectors of the live chunks."""
        return sql.Identifier(f"space_vectors_{self.space_id}")

    def index_name(self) -> str:
        return f"space_vectors_{self.space_id}_hnsw"

    def cast(self) -> sql.Composable:
        """`::vector(d)` (or `::halfvec(d)`), the cast that both the index and search use."""
        return sql.SQL("::{}({})").format(sql.SQL(self.vector_type), sql.Literal(self.dimensions))


def active(conn: psycopg.Connection) -> Space | None:
    row = conn.execute(
        "SELECT space_id, model, dimensions, status FROM embedding_spaces WHERE status = 'active'"
    ).fetchone()
    return Space(*row) if row else None


def ensure_active(conn: psycopg.Connection, model: str, dimensions: int,
                  with_index: Callable[[], bool] | None = None) -> Space:
    """The active space, created on first use; refuses a silent model switch. Created with its
    HNSW index unless ``with_index()`` says no (an initial load that is a bulk load from its first
    batch: the index is built once, after it)."""
    current = active(conn)
    if current is None:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (SPACE_LOCK_KEY,))
            current = active(conn)
            if current is None:
                row = conn.execute(
                    "INSERT INTO embedding_spaces (model, dimensions, status, activated_at, filled_at)"
                    " VALUES (%s, %s, 'active', now(), now())"
                    " ON CONFLICT (model, dimensions) DO UPDATE SET status = 'active', activated_at = now(),"
                    "   filled_at = now()"
                    " RETURNING space_id, model, dimensions, status",
                    (model, dimensions),
                ).fetchone()
                current = Space(*row)
                create_table(conn, current)
                if with_index is None or with_index():
                    create_index(conn, current)   # an empty table: page switches fill it and the index
    if (current.model, current.dimensions) != (model, dimensions):
        raise SpaceMismatch(
            f"the active embedding space is {current.model} ({current.dimensions} dims) but the "
            f"configured embedder is {model} ({dimensions} dims); set EMBEDDING_PROVIDER/"
            "EMBEDDING_MODEL back, or rebuild the index for the new model (see docs/operations.md, 'Switching models')"
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


def maintained(conn: psycopg.Connection) -> list[Space]:
    """The spaces a page switch writes: the active one and any being built."""
    rows = conn.execute(
        "SELECT space_id, model, dimensions, status FROM embedding_spaces"
        " WHERE status IN ('active', 'building') ORDER BY space_id"
    ).fetchall()
    return [Space(*r) for r in rows]


def ensure_building(conn: psycopg.Connection, model: str, dimensions: int) -> Space:
    """A space to fill beside the active one (a retired space's cached vectors are reused, but its
    table, no longer kept up to date, is made again)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (SPACE_LOCK_KEY,))
        existing = find(conn, model, dimensions)
        if existing is not None and existing.status in ("active", "building"):
            return existing
        # Page switches read which spaces to write inside their transaction, under ROW EXCLUSIVE
        # on `chunks`: waiting for the ones in flight means every later switch writes this space too.
        conn.execute("LOCK TABLE chunks IN SHARE ROW EXCLUSIVE MODE")
        row = conn.execute(
            "INSERT INTO embedding_spaces (model, dimensions, status) VALUES (%s, %s, 'building')"
            " ON CONFLICT (model, dimensions) DO UPDATE SET status = 'building'"
            " RETURNING space_id, model, dimensions, status",
            (model, dimensions),
        ).fetchone()
        space = Space(*row)
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(space.table()))
        conn.execute("DELETE FROM space_backlog WHERE space_id = %s", (space.space_id,))
        conn.execute("UPDATE embedding_spaces SET fill_cursor = NULL, filled_at = NULL, retired_at = NULL,"
                     " table_dropped_at = NULL WHERE space_id = %s",
                     (space.space_id,))
        create_table(conn, space)
    return space


def create_table(conn: psycopg.Connection, space: Space) -> None:
    conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} PARTITION OF space_vectors FOR VALUES IN ({})").format(
        space.table(), sql.Literal(space.space_id)))


@dataclass(frozen=True)
class HnswBuild:
    """The HNSW graph's build parameters: links a node (`m`) and the candidates a node's links are
    chosen from (`ef_construction`); more of either is a better graph, built slower and larger."""

    m: int = 16
    ef_construction: int = 64


# pgvector's own defaults, until bench/search_quality.py --builds picks others (issue 45, point 5).
HNSW_BUILD = HnswBuild()


def _index_sql(space: Space, concurrently: bool, build: HnswBuild = HNSW_BUILD) -> sql.Composed:
    ops = "vector_cosine_ops" if space.vector_type == "vector" else "halfvec_cosine_ops"
    return sql.SQL("CREATE INDEX {how} IF NOT EXISTS {name} ON {table} USING hnsw ((embedding{cast}) {ops})"
                   " WITH (m = {m}, ef_construction = {ef})").format(
        how=sql.SQL("CONCURRENTLY" if concurrently else ""),
        name=sql.Identifier(space.index_name()),
        table=space.table(),
        cast=space.cast(),
        ops=sql.SQL(ops),
        m=sql.Literal(build.m),
        ef=sql.Literal(build.ef_construction),
    )


def create_index(conn: psycopg.Connection, space: Space) -> None:
    conn.execute(_index_sql(space, concurrently=False))


def index_state(conn: psycopg.Connection, space: Space) -> str:
    """'valid', 'invalid' (a concurrent build under way, or one that failed half-way) or 'missing'."""
    return indexes.state(conn, space.index_name())


def search_scan(conn: psycopg.Connection) -> str:
    """How search reads the active space now, for `search --json`, `status` and the UI: `hnsw`, or
    `exact` while its index makes way for a bulk load or is being built again."""
    space = active(conn)
    if space is None:
        return "none"
    return {"valid": "hnsw", "missing": "exact (HNSW index dropped for a bulk load)",
            "invalid": "exact (HNSW index being built or dropped)"}[index_state(conn, space)]


def indexed_rows(conn: psycopg.Connection, space: Space) -> int:
    """About how many vectors the space's table holds (the planner's estimate: no scan; an index
    build or ANALYZE keeps it current)."""
    row = conn.execute("SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)",
                       (f"space_vectors_{space.space_id}",)).fetchone()
    return max(0, int(row[0])) if row and row[0] is not None else 0


def source_per_chunk_sample(conn: psycopg.Connection, pages: int = 500) -> tuple[int, int]:
    """(stored source characters, live chunks) of up to ``pages`` indexed pages: how many vectors
    a page's text becomes, measured (core/bulk_load.chars_per_vector). The first pages by id (a
    spread sample), each counted by the chunks_page index: milliseconds at any size."""
    row = conn.execute(
        "SELECT coalesce(sum(length(p.source_text)), 0), coalesce(sum(n.chunks), 0) FROM"
        " (SELECT page_id, source_text FROM pages WHERE deleted_at IS NULL AND indexed_hash IS NOT NULL"
        "   AND indexed_hash = source_hash ORDER BY page_id LIMIT %s) p,"
        " LATERAL (SELECT count(*) AS chunks FROM chunks c WHERE c.page_id = p.page_id) n", (pages,)).fetchone()
    return int(row[0]), int(row[1])


def drop_index(conn: psycopg.Connection, space: Space, lock_timeout: str | None = None) -> None:
    """Make way for a bulk load: rows go in without the per-row HNSW cost, and search scans the
    table exactly meanwhile."""
    indexes.drop_concurrently(conn, space.index_name(), lock_timeout)


@dataclass(frozen=True)
class IndexBuild:
    vectors: int
    maintenance_work_mem: str
    fits: bool          # whether pgvector's graph fit in that memory (several times faster)


def sized_build_memory(conn: psycopg.Connection, setting: str, memory_max: str, vectors: int, dimensions: int,
                       bytes_per_dimension: int) -> tuple[str, bool]:
    """The `maintenance_work_mem` for an HNSW build over `vectors` on this connection's server, and
    whether the graph fits in it; `auto` is capped by the machine the server runs on."""
    local = db.server_is_local(conn)
    server_bytes = 0
    if setting == build_memory.AUTO and memory_max == build_memory.AUTO and not local:   # else unused
        server_bytes = conn.execute("SELECT greatest(pg_size_bytes(current_setting('shared_buffers')),"
                                    " pg_size_bytes(current_setting('maintenance_work_mem')))").fetchone()[0]
    cap = build_memory.memory_cap(memory_max, local=local, ram_bytes=psutil.virtual_memory().total,
                                  server_bytes=server_bytes)
    return build_memory.build_memory(setting, vectors, dimensions, bytes_per_dimension, cap)


def build_index_concurrently(conn: psycopg.Connection, space: Space, maintenance_work_mem: str,
                             parallel_workers: int | None = None, memory_max: str = build_memory.AUTO,
                             build: HnswBuild = HNSW_BUILD) -> IndexBuild:
    """The space's HNSW index over its bulk-loaded table, built once; page switches go on
    writing the table meanwhile (CONCURRENTLY takes no lock that blocks them).
    `maintenance_work_mem` may be `auto`: sized from the vectors to index, at most `memory_max`
    (core/build_memory.py)."""
    vectors = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(space.table())).fetchone()[0]
    memory, fits = sized_build_memory(conn, maintenance_work_mem, memory_max, vectors, space.dimensions,
                                      4 if space.vector_type == "vector" else 2)
    indexes.build_concurrently(conn, space.index_name(), _index_sql(space, concurrently=True, build=build), memory,
                               parallel_workers)
    return IndexBuild(vectors, memory, fits)
