"""Each site's learned template (`site_templates`, `site_template_blocks`) and the page sources it
is learned from.

A template is replaced whole, in one transaction: its row upserted and its blocks written by one
COPY, so a reader sees the old template or the new one, never a mix. A learning that fails leaves
the template as it was and records only when and why (`failed_at`, `error`). The sources are read
by keyset, a batch of pages a statement, so a 100,000-page site is never held in memory at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from rag_pipeline.core.site_template import Template
from rag_pipeline.core.template_rows import BLOCK_COLUMNS, block_rows, header_of, template_of

# Pages a statement when the sources are read: ~20 KB each, ~10 MB a batch.
SOURCE_BATCH = 500
_LIVE = "site = %s AND deleted_at IS NULL AND alias_of IS NULL AND source_text IS NOT NULL"


@dataclass(frozen=True)
class Learned:
    """A site's stored template (None when no learning ever succeeded) and its newest failure."""

    site: str
    template: Template | None
    learned_at: datetime | None
    failed_at: datetime | None
    error: str | None
    now: datetime


def live_count(conn: psycopg.Connection, site: str) -> int:
    """The site's live pages with a stored source: what its template is learned from."""
    return conn.execute(f"SELECT count(*) FROM pages WHERE {_LIVE}", (site,)).fetchone()[0]


def live_sources(conn: psycopg.Connection, site: str, batch: int = SOURCE_BATCH,
                 limit: int | None = None) -> Iterator[tuple[str, str]]:
    """(URL, stored source) of the site's live pages, in page id order, read ``batch`` pages a
    statement by keyset (the pages_site index): no snapshot or cursor held between batches. At
    most ``limit`` pages: page ids are UUIDv5 hashes of the URLs, so the first ones by id are a
    sample of the site spread over all its sections."""
    after: UUID | None = None
    left = limit
    while left is None or left > 0:
        want = batch if left is None else min(batch, left)
        rows = conn.execute(
            f"SELECT page_id, url, source_text FROM pages WHERE {_LIVE} AND (%s::uuid IS NULL OR page_id > %s)"
            " ORDER BY page_id LIMIT %s", (site, after, after, want)).fetchall()
        for _, url, text in rows:
            yield url, text
        if left is not None:
            left -= len(rows)
        if len(rows) < want:
            return
        after = rows[-1][0]


def sites_of(conn: psycopg.Connection, urls) -> list[str]:
    """The declared sites these pages belong to."""
    return [r[0] for r in conn.execute("SELECT DISTINCT site FROM pages WHERE url = ANY(%s) AND site IS NOT NULL"
                                       " ORDER BY 1", (list(urls),))]


def declared_pins(conn: psycopg.Connection, site: str) -> list:
    """The site's template_pins as its declaration was last synced (the YAML's form)."""
    row = conn.execute("SELECT template_pins FROM sites WHERE name = %s", (site,)).fetchone()
    return row[0] if row else []


# One learning of a site at a time: two batch runs of a young site never learn it side by side.
_LEARNING_LOCK = 0x7E4A


def try_learning_lock(conn: psycopg.Connection, site: str) -> bool:
    return conn.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", (_LEARNING_LOCK, site)).fetchone()[0]


def learning_unlock(conn: psycopg.Connection, site: str) -> None:
    conn.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (_LEARNING_LOCK, site))


def replace(conn: psycopg.Connection, site: str, template: Template) -> datetime:
    """The site's template replaced by ``template`` in one transaction (a newest failure cleared);
    returns when it was learned."""
    header = header_of(template)
    with conn.transaction():
        conn.execute("DELETE FROM site_template_blocks WHERE site = %s", (site,))
        learned_at = conn.execute(
            "INSERT INTO site_templates (site, learned_at, pages, short_words, texts, shapes, sidebar_items,"
            " volatile_shapes, pins, failed_at, error)"
            " VALUES (%s, now(), %s, %s, %s, %s, %s, %s, %s, NULL, NULL)"
            " ON CONFLICT (site) DO UPDATE SET learned_at = excluded.learned_at, pages = excluded.pages,"
            " short_words = excluded.short_words, texts = excluded.texts, shapes = excluded.shapes,"
            " sidebar_items = excluded.sidebar_items, volatile_shapes = excluded.volatile_shapes,"
            " pins = excluded.pins, failed_at = NULL, error = NULL RETURNING learned_at",
            (site, header["pages"], header["short_words"], header["texts"], header["shapes"],
             header["sidebar_items"], header["volatile_shapes"], Jsonb(header["pins"]))).fetchone()[0]
        with conn.cursor().copy(f"COPY site_template_blocks (site, {', '.join(BLOCK_COLUMNS)}) FROM STDIN") as copy:
            for row in block_rows(template):
                copy.write_row((site, *row))
    return learned_at


def note_failure(conn: psycopg.Connection, site: str, error: str) -> None:
    """A learning that failed: when and why, the stored template (if any) left as it is."""
    conn.execute(
        "INSERT INTO site_templates (site, failed_at, error) VALUES (%s, now(), %s)"
        " ON CONFLICT (site) DO UPDATE SET failed_at = excluded.failed_at, error = excluded.error",
        (site, error))


def header(conn: psycopg.Connection, site: str) -> tuple[int | None, datetime | None, datetime] | None:
    """(pages learned from, or None if never learned; newest failure; now) without the blocks:
    what a batch run reads to see whether a young site is due. None: no row."""
    row = conn.execute("SELECT CASE WHEN learned_at IS NOT NULL THEN pages END, failed_at, now()"
                       " FROM site_templates WHERE site = %s", (site,)).fetchone()
    return (row[0], row[1], row[2]) if row else None


def load(conn: psycopg.Connection, site: str) -> Learned | None:
    """The site's stored template, or None if it was never learned nor failed to be."""
    row = conn.execute(
        "SELECT learned_at, pages, short_words, texts, shapes, sidebar_items, volatile_shapes, pins, failed_at,"
        " error, now() FROM site_templates WHERE site = %s", (site,)).fetchone()
    if row is None:
        return None
    learned_at, pages, short_words, texts, shapes, sidebar_items, volatile, pins, failed_at, error, now = row
    template = None
    if learned_at is not None:
        rows = conn.execute(f"SELECT {', '.join(BLOCK_COLUMNS)} FROM site_template_blocks WHERE site = %s"
                            " ORDER BY position", (site,)).fetchall()
        template = template_of({"pages": pages, "short_words": short_words, "texts": texts, "shapes": shapes,
                                "sidebar_items": sidebar_items, "volatile_shapes": volatile, "pins": pins}, rows)
    return Learned(site, template, learned_at, failed_at, error, now)


def current(conn: psycopg.Connection, sites=None) -> dict[str, tuple[Template, datetime]]:
    """What routing and chunking strip with: each of these sites' (None: every site's) learned
    template (the lookup sets and canonical pages, not the display rows) and when it was learned.
    A site never learned is absent."""
    names = None if sites is None else sorted({site for site in sites if site is not None})
    if names == []:
        return {}
    headers = conn.execute(
        "SELECT site, learned_at, pages, short_words, texts, shapes, sidebar_items, volatile_shapes, pins"
        " FROM site_templates WHERE (%s::text[] IS NULL OR site = ANY(%s)) AND learned_at IS NOT NULL",
        (names, names)).fetchall()
    canonical: dict[str, list] = {}
    for site, *row in conn.execute(
            f"SELECT site, {', '.join(BLOCK_COLUMNS)} FROM site_template_blocks WHERE (%s::text[] IS NULL"
            " OR site = ANY(%s)) AND why = 'text' AND canonical_url IS NOT NULL", (names, names)):
        canonical.setdefault(site, []).append(row)
    found = {}
    for site, learned_at, pages, short_words, texts, shapes, items, volatile, pins in headers:
        header = {"pages": pages, "short_words": short_words, "texts": texts, "shapes": shapes,
                  "sidebar_items": items, "volatile_shapes": volatile, "pins": pins}
        found[site] = (template_of(header, canonical.get(site, [])), learned_at)
    return found
