"""Applying a learned template to a page: what is chunked and embedded, and what change detection hashes.

``strip`` removes the page's template blocks and says where they were: ``content`` is exactly the
page without the ``template_spans`` (the two interleaved are the page, byte for byte, so the
stored source keeps it whole). ``content_for_hash`` is that content with the lines known to be
volatile masked (learned volatile shapes, and the page's own history, volatile_text.py) and blank
runs collapsed: its hash moves only when the content does, whatever the template did.

A block is template here as site_template.py learned it (by text, by shape for short blocks, as a
sidebar, or pinned), or, on a site with learned sidebars, as a link list that links to the page
itself and stays on its host (a small section's sidebar, below what can be learned), a prose block stays content on its canonical page, a link list goes whole or
not at all (a half-stripped list is neither), and a heading whose whole section went (a sidebar's
"In this section") goes with it. Tables, code and other headings are never template. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from urllib.parse import urlsplit

from rag_pipeline.core.site_template import Template, is_prose
from rag_pipeline.core.template_blocks import (
    CANDIDATE_KINDS,
    PageBlock,
    cut_page,
    fingerprint,
    mask_volatile,
    normalize_space,
)
from rag_pipeline.core.template_pins import pinned_role
from rag_pipeline.core.urls import InvalidURL, normalize_url

__all__ = ["Split", "chunk_source", "content_for_hash", "hash_text", "line_shape", "strip"]

# A link list is a known sidebar when at least this share of its items were learned as sidebar items.
KNOWN_ITEMS_SHARE = 0.5
_BLANK_RUNS = re.compile(r"\n{3,}")
_TRAILING = re.compile(r"[ \t]+$", re.MULTILINE)


@dataclass(frozen=True)
class Split:
    """A page split: ``content`` (what is chunked and embedded) and the template's spans in the page."""

    content: str
    template_spans: tuple[tuple[int, int], ...]


def line_shape(line: str) -> str:
    """The fingerprint of a line's shape: how a volatile line is named across crawls."""
    return fingerprint(mask_volatile(normalize_space(line)))


def _decide(block: PageBlock, template: Template, url: str) -> tuple[bool, bool]:
    """(template?, settled?): settled means the block's parts are not looked at on their own."""
    if block.kind not in CANDIDATE_KINDS:
        return False, True
    role = pinned_role(template.pins, block.text) if template.pins else None
    if role is not None:
        return role == "template", True
    if block.kind == "link_list":
        if block.fingerprint in template.texts:
            return True, True
        known = sum(1 for part in block.parts if part.fingerprint in template.sidebar_items)
        if len(block.parts) >= 2 and known >= KNOWN_ITEMS_SHARE * len(block.parts):
            return True, True
        return bool(template.sidebar_items) and _lists_itself(block, url), True
    if block.kind == "list_item" and template.sidebar_items and _links_itself(block.text, url):
        return True, True   # a one-page section's sidebar: the page's own link, alone
    if block.fingerprint in template.texts:
        if is_prose(block, template.short_words) and template.canonical.get(block.fingerprint) == url:
            return False, True  # its canonical page: the shared text stays searchable here
        return True, True
    if block.words <= template.short_words and block.shape in template.shapes:
        return True, True
    return False, False


def _normalized(url: str | None) -> str | None:
    try:
        return normalize_url(url.split("#", 1)[0]) if url else None
    except InvalidURL:
        return None


_LONE_LINK = re.compile(r"^\s*[-*+]\s+\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)\s*$")


def _links_itself(text: str, url: str) -> bool:
    """A list item that is only a link to the page itself."""
    match = _LONE_LINK.match(text)
    return match is not None and _normalized(match.group(1)) == _normalized(url) is not None


def _lists_itself(block: PageBlock, url: str) -> bool:
    """A sidebar too small to be learned (a section of one to four pages): on a site whose
    sidebars were learned, a link list that links to the page itself and whose links all stay on
    its host. Content does not link to its own page; its section's sidebar does."""
    host, page = urlsplit(url).hostname, _normalized(url)
    if page is None or not block.targets or not any(_normalized(t) == page for t in block.targets):
        return False
    return all(target is not None and urlsplit(target).hostname == host for target in block.targets)


def _template_spans(blocks: list[PageBlock], template: Template, url: str) -> list[tuple[int, int]]:
    gone = [False] * len(blocks)
    spans: dict[int, list[tuple[int, int]]] = {}
    for index, block in enumerate(blocks):
        is_template, settled = _decide(block, template, url)
        if is_template:
            gone[index] = True
        elif not settled and block.parts:
            parts = [(p.start, p.end) for p in block.parts if _decide(p, template, url)[0]]
            if len(parts) == len(block.parts):
                gone[index] = True
            elif parts:
                spans[index] = parts
    _drop_emptied_headings(blocks, gone)
    found: list[tuple[int, int]] = []
    for index, block in enumerate(blocks):
        if gone[index]:
            found.append((block.start, block.end))
        else:
            found.extend(spans.get(index, ()))
    return _merged(found)


def _drop_emptied_headings(blocks: list[PageBlock], gone: list[bool]) -> None:
    """A heading goes when everything under it (up to the next heading of its level or higher)
    went, and something did: from the last heading back, so nested sections are settled first.
    Headings of the page's top level (its title) always stay: a page is never left without one."""
    levels = [block.level for block in blocks if block.kind == "heading" and block.level is not None]
    if not levels:
        return
    top = min(levels)
    for index in range(len(blocks) - 1, -1, -1):
        heading = blocks[index]
        if heading.kind != "heading" or heading.level is None or heading.level == top:
            continue
        removed_any = False
        for block, went in zip(blocks[index + 1 :], gone[index + 1 :]):
            if block.kind == "heading" and block.level is not None and block.level <= heading.level:
                break
            if went:
                removed_any = True
            elif block.kind != "blank":
                removed_any = False
                break
        gone[index] = removed_any


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if start >= end:
            continue
        if merged and merged[-1][1] == start:
            merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def strip(markdown: str, template: Template, url: str) -> Split:
    """The page without its template blocks. ``url`` is the page's own (canonical pages, links)."""
    spans = _template_spans(cut_page(markdown, url), template, url)
    pieces = []
    position = 0
    for start, end in spans:
        pieces.append(markdown[position:start])
        position = end
    pieces.append(markdown[position:])
    return Split(content="".join(pieces), template_spans=tuple(spans))


def content_for_hash(
    markdown: str, template: Template, url: str, volatile: Collection[str] = ()
) -> str:
    """The text whose hash change detection compares: the page's content (strip), each line whose
    shape is volatile (learned, or from the page's history: ``volatile`` holds line_shape values)
    replaced by its masked shape, trailing blanks and blank-line runs tidied."""
    return hash_text(strip(markdown, template, url).content, template, volatile)


def hash_text(content: str, template: Template, volatile: Collection[str] = ()) -> str:
    """``content_for_hash`` of a page already stripped (``strip(...).content``)."""
    masked_shapes = template.volatile_shapes | frozenset(volatile)
    if masked_shapes:
        lines = content.split("\n")
        for index, line in enumerate(lines):
            if line.strip() and line_shape(line) in masked_shapes:
                lines[index] = mask_volatile(line)
        content = "\n".join(lines)
    return _BLANK_RUNS.sub("\n\n", _TRAILING.sub("", content)).strip("\n")


def chunk_source(markdown: str, template: Template | None, url: str) -> str:
    """What a page's chunks are cut from: its content without its site's template (None: no
    template learned, the whole page). A page that is all template (a section index that is only
    its sidebar) is cut whole: a live page is never left without a passage."""
    if template is None or not template.pages and not template.pins:
        return markdown
    content = strip(markdown, template, url).content
    return content if content.strip() else markdown
