"""`chunks.text_search` (lexical and hybrid retrieval): its text search configuration, and its GIN
index, which makes way for bulk loads beside the HNSW index (defs/index/bulk_index.py)."""

from __future__ import annotations

import logging

import psycopg
from psycopg import sql

from rag_pipeline.store import indexes

log = logging.getLogger(__name__)

INDEX = "chunks_text_search"
# maintenance_work_mem of a GIN build: its accumulator of lexemes, allocated as it fills (not
# reserved up front); a build that outgrows it flushes and goes on.
BUILD_MEMORY = "512MB"


class UnknownTextConfig(ValueError):
    """SEARCH_TEXT_CONFIG names no text search configuration of this server."""


def config(conn: psycopg.Connection) -> str:
    """The configuration `chunks.text_search` is built with: queries must parse with the same one."""
    return conn.execute("SELECT config::text FROM text_search_config").fetchone()[0]


def available(conn: psycopg.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT cfgname FROM pg_ts_config ORDER BY cfgname").fetchall()]


def rebuild_for(conn: psycopg.Connection, wanted: str) -> bool:
    """Rebuild `chunks.text_search` (and its GIN index) with configuration ``wanted`` unless it is
    built with it already; True when it rebuilt. Rewrites `chunks` under an exclusive lock: a
    deploy step (`rag-pipeline db migrate`), never something a page run does."""
    names = available(conn)
    if wanted not in names:
        raise UnknownTextConfig(f"SEARCH_TEXT_CONFIG={wanted!r} is no text search configuration of this "
                                f"server; it has: {', '.join(names)}")
    with conn.transaction():
        if config(conn) == wanted:
            return False
        expression = sql.SQL("to_tsvector({}::regconfig, embed_text)").format(sql.Literal(wanted))
        conn.execute("ALTER TABLE chunks DROP COLUMN text_search")
        conn.execute(sql.SQL("ALTER TABLE chunks ADD COLUMN text_search tsvector GENERATED ALWAYS AS ({}) STORED")
                     .format(expression))
        conn.execute("CREATE INDEX chunks_text_search ON chunks USING gin (text_search)")
        conn.execute("UPDATE text_search_config SET config = %s::regconfig", (wanted,))
    log.info("chunks.text_search rebuilt with text search configuration %s", wanted)
    return True


def lexemes(conn: psycopg.Connection, config_name: str, text: str) -> list[str]:
    """The question's lexemes as the index holds words (stemmed, stop words out), in order."""
    rows = conn.execute("SELECT lexeme FROM unnest(to_tsvector(%s::regconfig, %s)) ORDER BY positions[1]",
                        (config_name, text)).fetchall()
    return [r[0] for r in rows]


def common_shares(conn: psycopg.Connection) -> tuple[dict[str, float], float]:
    """(lexeme → share of passages holding it, for the common ones; the least share listed) from
    PostgreSQL's statistics of `chunks.text_search` (kept by ANALYZE and autovacuum). None yet:
    ({}, 0.0), and every word counts alike."""
    row = conn.execute(
        "SELECT most_common_elems::text::text[], most_common_elem_freqs FROM pg_stats"
        " WHERE schemaname = current_schema() AND tablename = 'chunks' AND attname = 'text_search'"
    ).fetchone()
    if row is None or row[0] is None or row[1] is None:
        return {}, 0.0
    elems, freqs = row
    # most_common_elem_freqs: one a listed element, then the least and the greatest, and nulls' share.
    return dict(zip(elems, freqs)), float(freqs[len(elems)]) if len(freqs) > len(elems) else 0.0


def index_state(conn: psycopg.Connection) -> str:
    return indexes.state(conn, INDEX)


def lexical_scan(conn: psycopg.Connection) -> str:
    """How lexical search reads `chunks` now: `gin`, or `exact` while its index makes way for a
    bulk load (every passage's stored tsvector is matched: the same results, slower)."""
    return {"valid": "gin", "missing": "exact (GIN index dropped for a bulk load)",
            "invalid": "exact (GIN index being built or dropped)"}[index_state(conn)]


def drop_index(conn: psycopg.Connection, lock_timeout: str | None = None) -> None:
    """Make way for a bulk load: keeping a GIN index up row by row costs ~2.3x building it once
    afterwards, and writes ~4.4x the WAL (bench/index_builds.py)."""
    indexes.drop_concurrently(conn, INDEX, lock_timeout)


def build_index_concurrently(conn: psycopg.Connection, parallel_workers: int | None = None) -> None:
    """The GIN index over `chunks.text_search`, built once after a bulk load; switches go on."""
    indexes.build_concurrently(
        conn, INDEX, sql.SQL("CREATE INDEX CONCURRENTLY IF NOT EXISTS {} ON chunks USING gin (text_search)")
        .format(sql.Identifier(INDEX)), BUILD_MEMORY, parallel_workers)
