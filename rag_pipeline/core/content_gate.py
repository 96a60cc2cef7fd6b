"""The hash gate past the template: whether a crawl whose text differs from the indexed source
changed the page's content, or only its template and its volatile lines.

A crawl whose normalized text equals the indexed source is unchanged before this is asked. When
the text differs, both versions are compared by their **content key**: the hash of
template_strip.content_for_hash under the site's current template and the page's confirmed
volatile lines. Equal keys: the content did not move, the page is only stamped verified.

The stored source's key is cached on the page with a ``tag`` naming what it was computed under
(the template's learning time and the volatile set): a template learned again, or a line newly
confirmed volatile, recomputes it from the stored source, so a change in what is learned is never
taken as a change of every page (and never re-embeds the site's pages wholesale).

The page's own history of volatile lines (volatile_text.py) moves at each compared crawl: a line
that changed in place again counts one more, a line that did not change is forgotten.
Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from rag_pipeline.core.site_template import Template
from rag_pipeline.core.template_strip import hash_text, strip
from rag_pipeline.core.text import content_hash
from rag_pipeline.core.volatile_text import confirmed_volatile, note_volatile

__all__ = ["Gate", "compare", "key_tag"]


@dataclass(frozen=True)
class Gate:
    """What comparing a crawl with the indexed source found."""

    unchanged: bool
    new_key: str            # the crawl's content key (what its crawl is noted with)
    old_key: str            # the stored source's, under ``tag``
    tag: str
    volatile_counts: dict[str, int]
    recomputed: bool        # the stored source's key was computed again (its cache was stale)


def key_tag(learned_at: datetime | None, volatile: frozenset[str]) -> str:
    """What a content key was computed under: the template's learning time and the volatile set."""
    template = learned_at.isoformat() if learned_at is not None else "none"
    digest = hashlib.sha256("\n".join(sorted(volatile)).encode()).hexdigest()[:16] if volatile else "none"
    return f"t:{template};v:{digest}"


def compare(
    stored: str,
    crawled: str,
    url: str,
    template: Template | None,
    learned_at: datetime | None,
    counts: Mapping[str, int],
    cached_key: str | None = None,
    cached_tag: str | None = None,
) -> Gate:
    """Compare a crawl's normalized text with the page's stored (indexed) source.

    ``template`` is the site's current one (None: none learned), ``counts`` the page's volatile
    history, ``cached_key``/``cached_tag`` the stored source's key as last computed. The crawl is
    stripped once; the stored source only when its cached key is stale or the keys differ (then
    its lines are compared with the crawl's to move the volatile history)."""
    template = template if template is not None else Template.empty()
    learned = learned_at if template.pages else None
    new_content = strip(crawled, template, url).content
    old_content: str | None = None
    volatile = confirmed_volatile(counts)
    tag = key_tag(learned, volatile)
    recomputed = cached_key is None or cached_tag != tag
    if recomputed:
        old_content = strip(stored, template, url).content
        old_key = content_hash(hash_text(old_content, template, volatile))
    else:
        old_key = cached_key
    new_key = content_hash(hash_text(new_content, template, volatile))
    if new_key == old_key:
        # Only confirmed volatile lines can have moved: the candidates did not change this time.
        kept = {shape: seen for shape, seen in counts.items() if shape in volatile}
        return Gate(True, new_key, old_key, tag, kept, recomputed)
    if old_content is None:
        old_content = strip(stored, template, url).content
    moved = note_volatile(counts, old_content, new_content)
    now_volatile = confirmed_volatile(moved)
    if now_volatile != volatile:   # a line confirmed volatile by this crawl: both keys again
        tag = key_tag(learned, now_volatile)
        old_key = content_hash(hash_text(old_content, template, now_volatile))
        new_key = content_hash(hash_text(new_content, template, now_volatile))
        recomputed = True
    return Gate(new_key == old_key, new_key, old_key, tag, moved, recomputed)
