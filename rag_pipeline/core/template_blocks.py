"""A page cut into the blocks a site's template is made of, each with a text and a shape fingerprint.

A crawled page is its content wrapped in the site's chrome: a top navigation, a sidebar, a cookie
banner, a footer with a build id and a date. Learning that chrome (site_template.py) counts blocks
across the site's pages, so this module cuts one page's normalized markdown into blocks that cover
it without a gap (each owns the blank lines after it, as in markdown_blocks.py):

- ``line``: a paragraph of one line (a nav bar of inline links, a banner, "Last updated …");
- ``paragraph``: a paragraph of several lines; its lines are candidates of their own (``parts``),
  since converters put a footer's lines in one paragraph;
- ``list_item``: an item of a list that is not a link list;
- ``link_list``: a run of list items most of which are links (a sidebar, a nav menu); its items
  are its ``parts``; it is template or content as a whole, never cut apart;
- ``heading``, ``code``, ``table``: structure and content, never template candidates themselves.

The text fingerprint is the hash of the text with its whitespace collapsed; the shape fingerprint
is the hash of that text with volatile tokens masked (dates, times, hex ids of 7+ characters,
version-like build ids, digit runs), so "Build 4f3a9c1 · 2026-12-01" and "Build 9b2e771 ·
2026-12-07" share a shape. Pure: no Dagster, no I/O.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urldefrag, urljoin

from rag_pipeline.core.markdown_blocks import parse_blocks

__all__ = [
    "CANDIDATE_KINDS",
    "PageBlock",
    "cut_page",
    "fingerprint",
    "mask_volatile",
    "normalize_space",
    "own_site_share",
]

CANDIDATE_KINDS = frozenset({"line", "paragraph", "list_item", "link_list"})
# A list is a link list when at least this share of its items are links.
LINK_LIST_SHARE = 0.5

_MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|"
    r"Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)
# Order matters: the longest, most specific token first, so a date is one mask, not three numbers.
_VOLATILE = [
    ("‹date›", r"\d{4}-\d{2}-\d{2}(?:[T ]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?"),
    ("‹date›", r"\d{1,2}[/.]\d{1,2}[/.]\d{2,4}"),
    ("‹date›", rf"{_MONTH}\.? \d{{1,2}}(?:st|nd|rd|th)?,? \d{{4}}"),
    ("‹date›", rf"\d{{1,2}}(?:st|nd|rd|th)? {_MONTH}\.?,? \d{{4}}"),
    ("‹time›", r"\d{1,2}:\d{2}(?::\d{2})?(?:\s?[AaPp]\.?[Mm]\.?)?(?:\s?(?:UTC|GMT|Z))?"),
    ("‹hex›", r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"),
    ("‹hex›", r"(?=[0-9a-fA-F]*[0-9])(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{7,}"),
    ("‹ver›", r"v?\d+(?:\.\d+){1,3}(?:[-+][0-9A-Za-z]+(?:\.[0-9A-Za-z]+)*)?"),
    ("‹n›", r"\d+(?:,\d{3})*"),
]
_VOLATILE_RE = re.compile(
    "|".join(f"(?P<m{i}>(?<![0-9A-Za-z]){pattern}(?![0-9A-Za-z]))" for i, (_, pattern) in enumerate(_VOLATILE))
)
_MASKS = {f"m{i}": mask for i, (mask, _) in enumerate(_VOLATILE)}
_DIGIT = re.compile(r"\d")
_LIST_ITEM = re.compile(r" {0,3}(?:[-+*]|\d{1,9}[.)])(?:[ \t]+|$)")
_TABLE_ROW = re.compile(r" {0,3}\|")
_LINK = re.compile(r"!?\[([^\]\n]*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"\n]*\")?\s*\)")
_WORD = re.compile(r"\w+")


def normalize_space(text: str) -> str:
    """Whitespace runs collapsed: a block re-wrapped by the converter is the same block."""
    return " ".join(text.split())


def mask_volatile(text: str) -> str:
    """The text with each volatile token replaced by its kind (‹date›, ‹hex›, ‹ver›, ‹n›…)."""
    if _DIGIT.search(text) is None:
        return text  # every volatile token holds a digit; most prose lines have none
    return _VOLATILE_RE.sub(lambda m: _MASKS[m.lastgroup or ""], text)


_STAMPS = frozenset({"‹date›", "‹time›", "‹hex›"})


def mask_stamps(text: str) -> str:
    """The text with only its dates, times and hex ids masked: numbers and versions kept."""
    if _DIGIT.search(text) is None:
        return text
    return _VOLATILE_RE.sub(lambda m: m.group(0) if _MASKS[m.lastgroup or ""] not in _STAMPS
                            else _MASKS[m.lastgroup or ""], text)


def fingerprint(text: str) -> str:
    """A short stable id of a text (16 hex digits): equal texts, equal ids, on any machine."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


@dataclass(frozen=True, slots=True)
class PageBlock:
    """One block of a page: its span in the page, its text and shape fingerprints, its word counts
    (prose words, and words inside link texts), and for a link list or a several-line paragraph
    the blocks it is made of (``parts``), for a link list the links' targets (absolute)."""

    kind: str
    start: int
    end: int
    text: str
    fingerprint: str
    words: int
    link_words: int
    parts: tuple[PageBlock, ...] = ()
    targets: tuple[str | None, ...] = ()
    level: int | None = None

    @property
    def masked(self) -> str:
        return mask_volatile(self.text)

    @property
    def shape(self) -> str:
        """The fingerprint of the masked text (computed on demand: only short blocks need it)."""
        masked = self.masked
        return self.fingerprint if masked is self.text else fingerprint(masked)


def _block(kind: str, page: str, start: int, end: int, **extra: object) -> PageBlock:
    text = normalize_space(page[start:end])
    if "](" in text:
        links = [m.group(1) for m in _LINK.finditer(text)]
        link_words = sum(len(_WORD.findall(link)) for link in links)
        words = len(_WORD.findall(_LINK.sub(lambda m: m.group(1), text))) if links else len(_WORD.findall(text))
    else:
        link_words, words = 0, len(_WORD.findall(text))
    return PageBlock(
        kind=kind,
        start=start,
        end=end,
        text=text,
        fingerprint=fingerprint(text),
        words=words,
        link_words=link_words,
        **extra,  # type: ignore[arg-type]
    )


def _is_link_item(item: PageBlock) -> bool:
    return item.link_words > 0 and item.link_words * 2 >= item.words


def _first_target(page: str, item: PageBlock, base_url: str) -> str | None:
    match = _LINK.search(page, item.start, item.end)
    if match is None or not match.group(2) or match.group(0).startswith("!"):
        return None
    target = match.group(2)
    if target.startswith(("https://", "http://")):
        return target.split("#", 1)[0]  # already absolute: urljoin is the slow part of a sidebar
    try:
        return urldefrag(urljoin(base_url, target)).url
    except ValueError:
        return None


def _line_starts(page: str, start: int, end: int) -> list[int]:
    """Where the block's non-blank lines start; the first is moved back to the block's start, so
    leading blank lines (text left after stripping) belong to the first line."""
    starts = []
    position = start
    while position < end:
        newline = page.find("\n", position, end)
        line_end = end if newline < 0 else newline
        if page[position:line_end].strip():
            starts.append(position)
        position = line_end + 1
    if starts:
        starts[0] = start
    return starts or [start]


def _cut_paragraph(page: str, start: int, end: int, base_url: str) -> list[PageBlock]:
    """A body block of markdown_blocks cut into runs of list items and runs of other lines."""
    starts = _line_starts(page, start, end)
    lines = [page[a:end].lstrip("\n").split("\n", 1)[0] for a in starts]
    if all(_TABLE_ROW.match(line) for line in lines):
        return [_block("table", page, start, end)]
    blocks: list[PageBlock] = []
    index = 0
    while index < len(starts):
        is_item = bool(_LIST_ITEM.match(lines[index]))
        run = index + 1
        if is_item:
            # An item owns the indented lines after it (its continuation).
            while run < len(starts) and not _LIST_ITEM.match(lines[run]) and lines[run][:1] in (" ", "\t"):
                run += 1
            items = [(index, run)]
            while run < len(starts) and _LIST_ITEM.match(lines[run]):
                first = run
                run += 1
                while run < len(starts) and not _LIST_ITEM.match(lines[run]) and lines[run][:1] in (" ", "\t"):
                    run += 1
                items.append((first, run))
            blocks.extend(_cut_list(page, starts, items, end, base_url))
        else:
            while run < len(starts) and not _LIST_ITEM.match(lines[run]):
                run += 1
            run_end = starts[run] if run < len(starts) else end
            blocks.append(_lines_block(page, starts[index:run], run_end))
        index = run
    return blocks


def _lines_block(page: str, starts: list[int], end: int) -> PageBlock:
    if len(starts) == 1:
        return _block("line", page, starts[0], end)
    bounds = [*starts[1:], end]
    parts = tuple(_block("line", page, a, b) for a, b in zip(starts, bounds))
    return _block("paragraph", page, starts[0], end, parts=parts)


def _cut_list(
    page: str, starts: list[int], items: list[tuple[int, int]], end: int, base_url: str
) -> list[PageBlock]:
    bounds = [starts[b] if b < len(starts) else end for _, b in items]
    blocks = [_block("list_item", page, starts[a], bound) for (a, _), bound in zip(items, bounds)]
    links = sum(1 for item in blocks if _is_link_item(item))
    if len(blocks) >= 2 and links >= LINK_LIST_SHARE * len(blocks):
        targets = tuple(_first_target(page, item, base_url) if _is_link_item(item) else None for item in blocks)
        return [_block("link_list", page, blocks[0].start, blocks[-1].end, parts=tuple(blocks), targets=targets)]
    return blocks


def _merge_loose_items(
    blocks: list[PageBlock], singles: list[bool], page: str, base_url: str
) -> list[PageBlock]:
    """A loose list ("- a", blank, "- b") is one list: consecutive paragraphs that are each a single
    list item are joined and judged as one list, so a sidebar with blank lines between its items
    is still one link list. Tight lists separated by a blank line stay apart."""
    merged: list[PageBlock] = []
    run: list[PageBlock] = []

    def flush() -> None:
        if len(run) > 1:
            merged.extend(_relist(page, [(item.start, item.end) for item in run], base_url))
        else:
            merged.extend(run)
        run.clear()

    for block, single in zip(blocks, singles):
        if single:
            run.append(block)
        else:
            flush()
            merged.append(block)
    flush()
    return merged


def _relist(page: str, spans: list[tuple[int, int]], base_url: str) -> list[PageBlock]:
    blocks = [_block("list_item", page, a, b) for a, b in spans]
    links = sum(1 for item in blocks if _is_link_item(item))
    if links >= LINK_LIST_SHARE * len(blocks):
        targets = tuple(_first_target(page, item, base_url) if _is_link_item(item) else None for item in blocks)
        return [_block("link_list", page, spans[0][0], spans[-1][1], parts=tuple(blocks), targets=targets)]
    return blocks


def cut_page(markdown: str, url: str) -> list[PageBlock]:
    """The page's blocks, in order, covering it exactly: ``"".join(markdown[b.start:b.end])`` is
    the page. ``url`` resolves relative links (a sidebar's "/docs/x/" is the site's own URL)."""
    blocks: list[PageBlock] = []
    loose: list[bool] = []  # whether the block is a paragraph holding one list item only
    for structural in parse_blocks(markdown):
        start, end = structural.start, structural.end
        if not markdown[start:end].strip():
            cut = [_block("blank", markdown, start, end)]
        elif structural.is_code:
            cut = [_block("code", markdown, start, end)]
        elif structural.level is not None:
            cut = [_block("heading", markdown, start, end, level=structural.level)]
        else:
            cut = _cut_paragraph(markdown, start, end, url)
        single = len(cut) == 1 and cut[0].kind == "list_item"
        blocks.extend(cut)
        loose.extend([single] * len(cut))
    return _merge_loose_items(blocks, loose, markdown, url)


def own_site_share(block: PageBlock, is_own: Callable[[str], bool]) -> float:
    """The share of a link list's items that link to the site's own URLs."""
    if not block.targets:
        return 0.0
    return sum(1 for target in block.targets if target is not None and is_own(target)) / len(block.targets)
