"""A learned site template as rows of PostgreSQL and back, when to learn it again, and how it is told.

The store (store/site_templates.py) keeps one ``site_templates`` row per site (when it was learned,
from how many pages, the lookup sets strip() needs, the pins it was learned with) and one
``site_template_blocks`` row per learned block (what ``site show`` and the UI list). ``header_of``
and ``block_rows`` make those rows of a ``Template``; ``template_of`` makes the ``Template`` again:
the lookup sets, canonical pages and pins come back exactly, so the template read from the database
strips a page as the one learned did. Only a block's display text is capped (``TEXT_CAP``).

Pure: no Dagster, no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from rag_pipeline.core.site_template import LearnedBlock, Template
from rag_pipeline.core.template_pins import parse_pins, pins_rows

__all__ = ["BLOCK_COLUMNS", "PAGES_MOVED", "TEXT_CAP", "block_rows", "blocks_by_kind", "cap", "header_of",
           "learning_due", "template_of", "top_blocks_markdown"]

# A block's text as stored and shown: a sidebar of 25 items or a licence paragraph is told by its
# start; the fingerprint, not the text, is what recognises it.
TEXT_CAP = 2_000
# Learned again when the site's live pages (with a stored source) moved by more than this share.
PAGES_MOVED = 0.10
BLOCK_COLUMNS = ("position", "kind", "why", "fingerprint", "pages_seen", "example_url", "text", "scope",
                 "canonical_url")


def cap(text: str, limit: int = TEXT_CAP) -> str:
    """``text`` cut to ``limit`` characters, the cut marked with an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def header_of(template: Template) -> dict:
    """The site_templates row's values (site and learned_at are the store's)."""
    return {
        "pages": template.pages,
        "short_words": template.short_words,
        "texts": sorted(template.texts),
        "shapes": sorted(template.shapes),
        "sidebar_items": sorted(template.sidebar_items),
        "volatile_shapes": sorted(template.volatile_shapes),
        "pins": pins_rows(template.pins),
    }


def block_rows(template: Template) -> list[tuple]:
    """One tuple per learned block, in BLOCK_COLUMNS order, positions in the template's order."""
    return [(position, b.kind, b.by, b.fingerprint, b.pages_seen, b.example_url, cap(b.text), b.scope,
             b.canonical_url) for position, b in enumerate(template.blocks)]


def template_of(header: Mapping, rows: Sequence[Sequence]) -> Template:
    """The Template of a site_templates row and its blocks' rows (BLOCK_COLUMNS order)."""
    blocks = tuple(LearnedBlock(kind=kind, by=why, fingerprint=key, pages_seen=seen, example_url=example,
                                text=text, scope=scope, canonical_url=canonical)
                   for _, kind, why, key, seen, example, text, scope, canonical in sorted(rows, key=lambda r: r[0]))
    return Template(
        pages=header["pages"],
        blocks=blocks,
        texts=frozenset(header["texts"]),
        shapes=frozenset(header["shapes"]),
        sidebar_items=frozenset(header["sidebar_items"]),
        canonical={b.fingerprint: b.canonical_url for b in blocks if b.by == "text" and b.canonical_url},
        volatile_shapes=frozenset(header["volatile_shapes"]),
        pins=parse_pins(header["pins"]),
        short_words=header["short_words"],
    )


def learning_due(learned_at: datetime | None, pages_then: int | None, pages_now: int, now: datetime,
                 every: timedelta) -> str | None:
    """Why the site's template is learned again now, or None: never learned, learned longer ago
    than ``every`` (the site's template_every), or its page count moved by more than PAGES_MOVED."""
    if learned_at is None:
        return "never learned"
    if now - learned_at >= every:
        return f"learned more than {every} ago"
    then = pages_then or 0
    if abs(pages_now - then) > PAGES_MOVED * max(then, 1):
        return f"pages moved from {then} to {pages_now} (more than {PAGES_MOVED:.0%})"
    return None


def blocks_by_kind(blocks: Sequence[LearnedBlock]) -> dict[str, int]:
    """How many learned blocks of each kind (line, paragraph, list_item, link_list, volatile)."""
    return dict(sorted(Counter(b.kind for b in blocks).items()))


def _cell(text: str, width: int) -> str:
    one_line = " ".join(text.split())
    return cap(one_line, width).replace("|", "\\|")


def top_blocks_markdown(blocks: Sequence[LearnedBlock], limit: int = 10, excerpt: int = 80) -> str:
    """A markdown table of the first ``limit`` blocks (they come most-seen first): the UI's view."""
    if not blocks:
        return "no template blocks learned"
    lines = ["| kind | why | pages seen | scope | example page | text |", "|---|---|---:|---|---|---|"]
    for b in blocks[:limit]:
        lines.append(f"| {b.kind} | {b.by} | {b.pages_seen} | {b.scope} | {_cell(b.example_url, 200)} "
                     f"| {_cell(b.text, excerpt)} |")
    if len(blocks) > limit:
        lines.append(f"\n… and {len(blocks) - limit} more (`rag-pipeline site template <site>`)")
    return "\n".join(lines)
