"""Answer evaluations and space activations (sql/025_answer_quality.sql), and the passages a
question set is judged against."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

import psycopg
from psycopg.types.json import Jsonb

from rag_pipeline.core.answer_quality import Evaluation


def passages_of(conn: psycopg.Connection, page_keys: list[str]) -> dict[str, list[tuple[int, str]]]:
    """Each live page's passages, (chunk index, embedded text), for the pages of a question set:
    one statement for the set."""
    rows = conn.execute(
        "SELECT p.url, c.chunk_index, coalesce(c.embed_text, c.content) FROM pages p JOIN chunks c USING (page_id)"
        " WHERE p.url = ANY(%s) AND p.deleted_at IS NULL", (sorted(set(page_keys)),)).fetchall()
    out: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for url, index, text in rows:
        out[url].append((index, text))
    return dict(out)


def record(conn: psycopg.Connection, site: str, space_id: int, result: Evaluation) -> datetime:
    failing = [{"question": f.question, "url": f.url, "kind": f.kind} for f in result.failures]
    return conn.execute(
        "INSERT INTO answer_evaluations (site, space_id, k, questions, answered, recall, mrr, stale, failing)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING evaluated_at",
        (site, space_id, result.k, result.asked, result.answered, result.recall, result.mrr, len(result.stale),
         Jsonb(failing))).fetchone()[0]


def recent_recalls(conn: psycopg.Connection, site: str, space_id: int, k: int, *, limit: int,
                   before: datetime | None = None) -> list[float]:
    """The site's newest `limit` recall@k figures on this space (before `before`): what its check
    calls the recent best. Another space's figures are another model's, not a regression."""
    rows = conn.execute(
        "SELECT recall FROM answer_evaluations WHERE site = %s AND space_id = %s AND k = %s"
        " AND (%s::timestamptz IS NULL OR evaluated_at < %s) ORDER BY evaluated_at DESC LIMIT %s",
        (site, space_id, k, before, before, limit)).fetchall()
    return [r[0] for r in rows]


def last_evaluated(conn: psycopg.Connection, sites: list[str]) -> dict[str, datetime]:
    """When each site was last evaluated (sites never evaluated left out)."""
    rows = conn.execute("SELECT site, max(evaluated_at) FROM answer_evaluations WHERE site = ANY(%s) GROUP BY site",
                        (sites,)).fetchall()
    return dict(rows)


def record_activation(conn: psycopg.Connection, space_id: int, previous_space_id: int | None, forced: bool,
                      figures: list[dict]) -> None:
    conn.execute("INSERT INTO space_activations (space_id, previous_space_id, forced, figures) VALUES (%s, %s, %s, %s)",
                 (space_id, previous_space_id, forced, Jsonb(figures)))


def activations(conn: psycopg.Connection, limit: int = 20) -> list[tuple]:
    """The newest flips: (activated_at, space_id, previous_space_id, forced, figures)."""
    return conn.execute("SELECT activated_at, space_id, previous_space_id, forced, figures FROM space_activations"
                        " ORDER BY activated_at DESC LIMIT %s", (limit,)).fetchall()


def last_change(conn: psycopg.Connection, site: str) -> datetime | None:
    """When something last changed what search answers from the site: a page's content or
    tombstone, a re-chunk at work, a switch of the active space. None while no page of the site
    has been indexed."""
    return conn.execute(
        "SELECT CASE WHEN p.changed IS NOT NULL THEN greatest(p.changed,"
        "   (SELECT max(seen_at) FROM rechunks), (SELECT max(activated_at) FROM space_activations)) END"
        " FROM (SELECT max(greatest(last_changed_at, deleted_at)) AS changed FROM pages WHERE site = %s) p",
        (site,)).fetchone()[0]
