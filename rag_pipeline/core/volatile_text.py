"""Volatile text learned from one page's own history: lines that change on every crawl without meaning.

A "Generated 2026-12-01 10:30" stamp or a session token inside a page's content is not on enough
pages to be learned as template, yet it changes at each crawl. Only dates, times and hex ids count:
a line whose number or version moved ("Round 6", a price, "5.2.1") is a change every time, since a
number that moves at every crawl may be the page's content. Comparing two
versions of the page, ``volatile_lines`` finds the lines at the same place (aligned by shape, so
an inserted paragraph elsewhere does not shift them) whose shape is equal but text differs. These
are masked for the hash (template_strip.content_for_hash) and kept in the content text.

One change is not yet a pattern: a real edit of a number ("timeout 30 s" to "60 s") looks the same
in one comparison. So the caller keeps a count per line shape across crawls (``note_volatile``)
and masks only the shapes that changed on at least ``min_changes`` consecutive crawls
(``confirmed_volatile``): the first change of a line is always routed as a change. Lines in code
blocks are never volatile. Pure: no I/O.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass

from rag_pipeline.core.markdown_blocks import parse_blocks
from rag_pipeline.core.template_blocks import mask_stamps
from rag_pipeline.core.template_strip import line_shape

__all__ = ["VolatileLine", "confirmed_volatile", "note_volatile", "volatile_lines"]

MIN_CHANGES = 2


@dataclass(frozen=True)
class VolatileLine:
    """A line of the current version (0-based line number) that differs from the previous version
    only in its volatile tokens; ``shape`` is its line_shape."""

    line: int
    shape: str
    previous: str
    current: str


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the non-blank lines outside code blocks."""
    code = [(block.start, block.end) for block in parse_blocks(text) if block.is_code]
    found = []
    position = 0
    for number, line in enumerate(text.split("\n")):
        if line.strip() and not any(start <= position < end for start, end in code):
            found.append((number, line))
        position += len(line) + 1
    return found


def volatile_lines(previous: str, current: str) -> list[VolatileLine]:
    """Lines at the same place in both versions whose shape is equal but whose text differs."""
    before = _prose_lines(previous)
    after = _prose_lines(current)
    shapes_before = [line_shape(line) for _, line in before]
    shapes_after = [line_shape(line) for _, line in after]
    matcher = difflib.SequenceMatcher(a=shapes_before, b=shapes_after, autojunk=False)
    found = []
    for tag, i1, _, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            continue
        for offset in range(j2 - j1):
            (_, old), (number, new) = before[i1 + offset], after[j1 + offset]
            # Only a date, a time or an id moved: a number or a version that moved is content (a
            # price, a release), whatever its history.
            if old.strip() != new.strip() and mask_stamps(old) == mask_stamps(new):
                found.append(VolatileLine(number, shapes_after[j1 + offset], old, new))
    return found


def note_volatile(counts: Mapping[str, int], previous: str, current: str) -> dict[str, int]:
    """The page's volatile counts after one more crawl: a shape that changed again counts one
    more; a shape that did not change this time is forgotten (it is not volatile after all)."""
    changed = {line.shape for line in volatile_lines(previous, current)}
    return {shape: counts.get(shape, 0) + 1 for shape in sorted(changed)}


def confirmed_volatile(counts: Mapping[str, int], min_changes: int = MIN_CHANGES) -> frozenset[str]:
    """The line shapes to mask for the hash: changed on at least ``min_changes`` crawls in a row."""
    if min_changes < 1:
        raise ValueError(f"min_changes must be at least 1, got {min_changes}")
    return frozenset(shape for shape, seen in counts.items() if seen >= min_changes)
