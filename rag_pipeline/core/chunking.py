"""Edit-stable markdown chunking.

The cost of a recrawl is the embeddings of the chunks whose text changed, so chunk
boundaries must stay where they were when the text around them did not change. Greedy
packing from the start of a section fails that: one inserted paragraph shifts every later
boundary. The algorithm here:

1. Parse the text into blocks (`core/markdown_blocks.py`): ATX headings, setext/RST underlined headings, fenced code
   blocks (never cut inside) and paragraphs (separated by blank lines). A block owns the
   blank lines that follow it, so chunks are contiguous and lossless.
2. Headings of level <= ANCHOR_MAX_LEVEL (3) start a new section, and every section starts a
   new chunk. Consecutive headings with nothing between them stay together, so a title is
   never a chunk of its own. Deeper headings are preferred cut points inside a section.
3. Inside a section, a heading is glued to the block after it; the resulting units are
   tokenized once each. A unit over the budget is split at sentence ends, then line
   breaks, then token counts (always on str indices, so never inside a character).
4. Content-defined cuts: the boundary after each unit gets a strength from the hash of
   the opening of that unit's own text, heading excluded (stronger before a heading).
   A boundary is cut when it is the strongest within `max_tokens // 4` tokens on both
   sides (section ends count as strongest). Whether a boundary is cut thus depends only
   on the text near it, so an edit moves only the boundaries near it and the boundaries
   after it resynchronize at once. Two cuts are never closer than that distance (nor
   to the section ends), which keeps chunks from being fragments; a quarter of the
   budget gives chunks of about 300 tokens on typical pages. A stretch between cuts
   still over `max_tokens` is split at its strongest boundary, recursively: again a
   choice made by content, not by the position of the section start. Only the first
   characters of a unit feed its strength, so an edit inside a paragraph changes that
   chunk's text without moving any boundary.
5. embed_text = breadcrumb of the enclosing headings the chunk does not itself start with,
   + about `overlap_tokens` tokens from the end of the previous chunk of the same section
   (cut at a word start), + the content. The overlap comes from the previous chunk's
   content, not its embed text, so changes do not ripple further than one chunk.
6. A model that reads a window of its own tokens (the local model: 256 wordpieces, which
   cl100k counts do not bound) gives a `Window`: a chunk whose embed_text it would cut is
   split at its strongest boundary (again a choice made by content), a single unit at its
   sentences, lines, tokens, until every chunk fits whole. Without a window (a model that
   reads 8,191 cl100k tokens), nothing changes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from rag_pipeline.core.markdown_blocks import Block, parse_blocks
from rag_pipeline.core.embed_text import BREADCRUMB_MAX_TOKENS, HeadingIndex, breadcrumb, counted_tail
from rag_pipeline.core.chunk_budget import ChunkBudget, Window
from rag_pipeline.core.text_pieces import split_text
from rag_pipeline.core.tokens import MAX_EMBED_INPUT_TOKENS, count_tokens, joins_cleanly, word_cut

__all__ = ["CHUNKER_VERSION", "ANCHOR_MAX_LEVEL", "BREADCRUMB_MAX_TOKENS", "MIN_MAX_TOKENS", "Chunk", "ChunkBudget", "Window",
           "chunk_markdown", "chunker_signature"]

# Stored on every chunk and used as the Dagster code_version of the chunks asset: bump it
# whenever a change here can change any chunk boundary or embed_text.
CHUNKER_VERSION = "2"

# Headings up to this level always start a new chunk; h4-h6 are only preferred cut points,
# since cutting at every minor heading would make many tiny chunks.
ANCHOR_MAX_LEVEL = 3

# Any single code point is at most 4 tokens (4 UTF-8 bytes), so a budget of 8 always
# lets the token-level fallback make progress.
MIN_MAX_TOKENS = 8


@dataclass(frozen=True)
class Chunk:
    """One embeddable piece of a page; content is exactly text[start:end]."""

    index: int
    start: int
    end: int
    content: str
    heading_path: tuple[str, ...]
    embed_text: str
    token_count: int  # Tokens of embed_text, the text actually sent to the embedder.


@dataclass
class _Unit:
    start: int
    end: int
    tokens: int
    strength: float = 0.0
    starts_with_heading: bool = False
    # Where the text that decides the strength starts: the body after a glued heading, so
    # that a paragraph inserted under a heading leaves the old first paragraph's strength
    # as it was.
    key_start: int = -1


@dataclass
class _Section:
    blocks: list[Block] = field(default_factory=list)


def _sections(blocks: Sequence[Block]) -> list[_Section]:
    sections: list[_Section] = []
    for block in blocks:
        is_anchor = block.level is not None and block.level <= ANCHOR_MAX_LEVEL
        current = sections[-1] if sections else None
        only_headings = current is not None and all(b.level is not None for b in current.blocks)
        if current is None or (is_anchor and not only_headings):
            sections.append(_Section())
        sections[-1].blocks.append(block)
    return sections


# Only the opening of a unit decides its boundary strength: an edit further into a
# paragraph then changes that chunk's text but cannot move a boundary.
_STRENGTH_PREFIX_CHARS = 64


def _strength(unit_text: str) -> float:
    opening = unit_text.strip()[:_STRENGTH_PREFIX_CHARS]
    digest = hashlib.blake2b(opening.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def _units(text: str, section: _Section, max_tokens: int) -> list[_Unit]:
    # Glue each heading to what follows it: a cut right after a heading would orphan it.
    groups: list[list[Block]] = [[]]
    for block in section.blocks:
        groups[-1].append(block)
        if block.level is None:
            groups.append([])
    if not groups[-1]:
        groups.pop()

    units: list[_Unit] = []
    for group in groups:
        start, end = group[0].start, group[-1].end
        starts_with_heading = group[0].level is not None
        counts = _block_counts(text, group)
        n = sum(counts) if counts else count_tokens(text[start:end])
        if n <= max_tokens:
            units.append(
                _Unit(start, end, n, starts_with_heading=starts_with_heading, key_start=group[-1].start)
            )
            continue
        # Too big for one chunk: its blocks become units of their own, then an oversized
        # block is cut at sentences (not in code), lines, tokens.
        for k, block in enumerate(group):
            m = counts[k] if counts else count_tokens(text[block.start : block.end])
            if m <= max_tokens:
                pieces = [(block.start, block.end, m)]
            else:
                pieces = split_text(
                    text[block.start : block.end], block.start, max_tokens, not block.is_code
                )
            for k, (a, b, tokens) in enumerate(pieces):
                units.append(_Unit(a, b, tokens, starts_with_heading=k == 0 and block.level is not None))

    for k, unit in enumerate(units):
        unit.strength = _strength(text[max(unit.start, unit.key_start) : unit.end])
        if k + 1 < len(units) and units[k + 1].starts_with_heading:
            unit.strength -= 1.0  # A cut before a heading beats any cut inside a subsection.
    return units


def _block_counts(text: str, group: Sequence[Block]) -> list[int] | None:
    """Each block's tokens when they add up to the group's (every join clean), so an oversized
    group's blocks are not counted again; None: the group is counted whole."""
    for before, after in zip(group, group[1:]):
        if before.end != after.start or not joins_cleanly(text, after.start):
            return None
    return [count_tokens(text[block.start : block.end]) for block in group]


# --------------------------------------------------------------------------- cutting


def _content_defined_cuts(units: Sequence[_Unit], min_spacing: int) -> list[int]:
    """Unit indices k (cut before units[k]) that are the strongest boundary near them."""
    positions = [0]
    for unit in units:
        positions.append(positions[-1] + unit.tokens)
    # Boundary k sits before units[k]; its strength is that of the unit it closes.
    # The section ends are unbeatable, which keeps cuts min_spacing away from them.
    keys = [(-2.0, 0)] + [(units[k - 1].strength, k) for k in range(1, len(units))] + [(-2.0, len(units))]
    cuts = []
    for k in range(1, len(units)):
        key, pos = keys[k], positions[k]
        strongest = True
        j = k - 1
        while strongest and j >= 0 and pos - positions[j] < min_spacing:
            strongest = key < keys[j]
            j -= 1
        j = k + 1
        while strongest and j <= len(units) and positions[j] - pos < min_spacing:
            strongest = key < keys[j]
            j += 1
        if strongest:
            cuts.append(k)
    return cuts


def _span_tokens(text: str, units: Sequence[_Unit], lo: int, hi: int, end: int) -> int:
    """Tokens of text[units[lo].start:end] (`end` inside units[hi - 1]), added up from the units'
    own counts across the joins that allow it (`joins_cleanly`: a paragraph's blank line before
    the next block), and counted only where they do not: most chunks are tokenized once, as units."""
    last = units[hi - 1]
    whole = end == last.end
    total = 0
    for k in range(lo, hi if whole else hi - 1):
        if k > lo and not _joins_cleanly_before(text, units, k):
            return count_tokens(text[units[lo].start : end])
        total += units[k].tokens
    if whole:
        return total
    if last.start >= end or (hi - 1 > lo and not _joins_cleanly_before(text, units, hi - 1)):
        return count_tokens(text[units[lo].start : end])
    # The last unit cut short (its trailing blank lines): its count, less what follows its last
    # word cut, plus what follows that cut up to `end`.
    cut = _last_word_cut(text, last.start, end)
    if cut is None:
        return total + count_tokens(text[last.start : end])
    return total + last.tokens - count_tokens(text[cut : last.end]) + count_tokens(text[cut:end])


def _joins_cleanly_before(text: str, units: Sequence[_Unit], k: int) -> bool:
    return units[k - 1].end == units[k].start and joins_cleanly(text, units[k].start)


def _last_word_cut(text: str, start: int, end: int) -> int | None:
    """A `word_cut` i with start < i and i + 1 < end, near `end`; None if the last few spaces are not."""
    i = end - 1
    for _ in range(8):
        i = text.rfind(" ", start + 1, i)
        if i < 0:
            return None
        if i + 1 < end and word_cut(text, i):
            return i
    return None


def _added(parts: Sequence[tuple[str, int]]) -> int:
    """Tokens of the parts joined, from their own counts when every join allows it."""
    present = [(p, n) for p, n in parts if p]
    joined = "".join(p for p, _ in present)
    at = 0
    for part, _ in present[:-1]:
        at += len(part)
        if not joins_cleanly(joined, at):
            return count_tokens(joined)
    return sum(n for _, n in present)


def _fit(
    text: str, units: Sequence[_Unit], lo: int, hi: int, max_tokens: int, min_spacing: int
) -> list[tuple[int, int]]:
    """Split units[lo:hi] at their strongest boundaries until every piece fits the budget."""
    if hi - lo == 1 or _span_tokens(text, units, lo, hi, units[hi - 1].end) <= max_tokens:
        return [(lo, hi)]
    k = _split_point(units, lo, hi, min_spacing)
    left = _fit(text, units, lo, k, max_tokens, min_spacing)
    return left + _fit(text, units, k, hi, max_tokens, min_spacing)


def _split_point(units: Sequence[_Unit], lo: int, hi: int, min_spacing: int) -> int:
    """The strongest boundary inside units[lo:hi], among those leaving `min_spacing` tokens on
    both sides when there are such (a choice made by content, as `_fit` makes it)."""
    sizes = [0]
    for k in range(lo, hi):
        sizes.append(sizes[-1] + units[k].tokens)
    total = sizes[-1]
    candidates = range(lo + 1, hi)
    balanced = [k for k in candidates if min(sizes[k - lo], total - sizes[k - lo]) >= min_spacing]
    return min(balanced or candidates, key=lambda k: (units[k - 1].strength, k))


def _within_window(text: str, units: Sequence[_Unit], lo: int, hi: int, body: str, window: Window,
                   min_spacing: int) -> list[tuple[Sequence[_Unit], int, int]] | None:
    """What replaces the span units[lo:hi] whose embed text the window cannot read: its halves at
    its strongest boundary; a single unit, its pieces at sentences, lines, tokens, at a budget
    scaled by how far its body overflows; None when it cannot be cut (its body fits without the
    extras, or it is one character)."""
    if hi - lo > 1:
        k = _split_point(units, lo, hi, min_spacing)
        return [(units, lo, k), (units, k, hi)]
    unit = units[lo]
    read = window.count(body)
    if read <= window.limit or unit.end - unit.start < 2:
        return None
    budget = max(1, unit.tokens * window.limit * 9 // (read * 10))
    pieces = split_text(text[unit.start : unit.end], unit.start, min(budget, max(1, unit.tokens - 1)), True)
    if len(pieces) < 2:
        return None
    parts = [_Unit(a, b, n, strength=unit.strength) for a, b, n in pieces]
    return [(parts, k, k + 1) for k in range(len(parts))]


def _validate(max_tokens: int, overlap_tokens: int) -> None:
    if max_tokens < MIN_MAX_TOKENS:
        raise ValueError(f"max_tokens must be at least {MIN_MAX_TOKENS}, got {max_tokens}")
    if overlap_tokens < 0:
        raise ValueError(f"overlap_tokens must not be negative, got {overlap_tokens}")
    if overlap_tokens >= max_tokens:
        raise ValueError(f"overlap_tokens ({overlap_tokens}) must be below max_tokens ({max_tokens})")
    ceiling = max_tokens + overlap_tokens + BREADCRUMB_MAX_TOKENS
    if ceiling > MAX_EMBED_INPUT_TOKENS:
        raise ValueError(
            f"max_tokens + overlap_tokens + {BREADCRUMB_MAX_TOKENS} (breadcrumb) = {ceiling} "
            f"exceeds the embedding input limit of {MAX_EMBED_INPUT_TOKENS} tokens"
        )


def chunk_markdown(text: str, max_tokens: int = 512, overlap_tokens: int = 64,
                   window: Window | None = None) -> list[Chunk]:
    """Lossless, edit-stable chunks: the contents concatenate back to exactly `text`; with a
    `window`, none whose embed text the model would cut, unless a single character is more than
    the window can read."""
    _validate(max_tokens, overlap_tokens)
    if not text:
        return []
    blocks = parse_blocks(text)
    headings = HeadingIndex(blocks)
    min_spacing = max(1, max_tokens // 4)

    chunks: list[Chunk] = []
    crumbs: dict[tuple[str, ...], tuple[str, int]] = {}   # a section's chunks share their breadcrumb
    for section in _sections(blocks):
        units = _units(text, section, max_tokens)
        cuts = [0, *_content_defined_cuts(units, min_spacing), len(units)]
        previous_content: str | None = None
        for lo, hi in zip(cuts, cuts[1:]):
            # Spans of units to make chunks of, in order; a span the window cannot read whole
            # is replaced by its halves (or a unit by its pieces) and looked at again.
            pending: list[tuple[Sequence[_Unit], int, int]] = [
                (units, a, b) for a, b in _fit(text, units, lo, hi, max_tokens, min_spacing)]
            while pending:
                span_units, a, b = pending.pop(0)
                start, end = span_units[a].start, span_units[b - 1].end
                content = text[start:end]
                path, crumb_titles = headings.at(start, end)
                if crumb_titles not in crumbs:
                    crumbs[crumb_titles] = (crumb := breadcrumb(crumb_titles)), count_tokens(crumb)
                crumb, crumb_tokens = crumbs[crumb_titles]
                # The overlap ends where the content starts, so overlap + content is itself
                # a slice of the page: no separator is invented.
                overlap, overlap_count = (counted_tail(previous_content, overlap_tokens)
                                          if previous_content else ("", 0))
                # Trailing blank lines say nothing to the model, and would make the last chunk of
                # a page differ from the same text followed by more page (a shorter page's tail).
                body = content.rstrip() or content
                body_tokens = _span_tokens(text, span_units, a, b, start + len(body))
                embed_text = crumb + overlap + body
                token_count = _added(((crumb, crumb_tokens), (overlap, overlap_count), (body, body_tokens)))
                limit = max_tokens + overlap_tokens + crumb_tokens
                if token_count > limit:
                    # Token counts are not strictly additive across a join; drop the extras
                    # rather than ever exceed the promised budget.
                    embed_text = crumb + body
                    token_count = count_tokens(embed_text)
                    if token_count > limit:
                        embed_text, token_count = body, body_tokens
                if window is not None and window.count(embed_text) > window.limit:
                    smaller = _within_window(text, span_units, a, b, body, window, min_spacing)
                    if smaller is not None:
                        pending[0:0] = smaller
                        continue
                    # One unit the window cannot read even alone: without the extras, then cut.
                    for extras in (crumb, ""):
                        if window.count(extras + body) <= window.limit:
                            embed_text = extras + body
                            token_count = count_tokens(embed_text)
                            break
                chunks.append(
                    Chunk(
                        index=len(chunks),
                        start=start,
                        end=end,
                        content=content,
                        heading_path=path,
                        embed_text=embed_text,
                        token_count=token_count,
                    )
                )
                previous_content = content
    return chunks


def chunker_signature(max_tokens: int, overlap_tokens: int, window: Window | None = None) -> str:
    """What decides chunk boundaries: the code version, the budget and the model's window. A page
    whose stored signature differs is due for a re-chunk (from its stored text, never a recrawl)."""
    base = f"{CHUNKER_VERSION}/{max_tokens}/{overlap_tokens}"
    return base if window is None else f"{base}/{window.name}"
