"""The text search configuration of `chunks.text_search` (lexical and hybrid retrieval)."""

from __future__ import annotations

import logging

import psycopg
from psycopg import sql

log = logging.getLogger(__name__)


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
