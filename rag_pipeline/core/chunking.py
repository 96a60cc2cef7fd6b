"""Edit-stable markdown chunking.

The cost of a recrawl is the embeddings of the chunks whose text changed, so chunk
boundaries must stay where they were when the text around them did not change. Greedy
packing from the start of a section fails that: one inserted paragraph shifts every later
boundary. The algorithm here:

1. Parse the text into blocks: ATX headings, setext/RST underlined headings, fenced code
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
"""

from __future__ import annotations

import bisect
import hashlib
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field

from rag_pipeline.core.tokens import MAX_EMBED_INPUT_TOKENS, encoding

__all__ = [
    "CHUNKER_VERSION",
    "ANCHOR_MAX_LEVEL",
    "BREADCRUMB_MAX_TOKENS",
    "MIN_MAX_TOKENS",
    "Chunk",
    "chunk_markdown",
]

# Stored on every chunk and used as the Dagster code_version of the chunks asset: bump it
# whenever a change here can change any chunk boundary or embed_text.
CHUNKER_VERSION = "2"

# Headings up to this level always start a new chunk; h4-h6 are only preferred cut points,
# since cutting at every minor heading would make many tiny chunks.
ANCHOR_MAX_LEVEL = 3

# The breadcrumb is context, not content: cap it so long heading paths cannot crowd out the
# text or push an input past the embedding limit.
BREADCRUMB_MAX_TOKENS = 64

# Any single code point is at most 4 tokens (4 UTF-8 bytes), so a budget of 8 always
# lets the token-level fallback make progress.
MIN_MAX_TOKENS = 8

_BREADCRUMB_SEPARATOR = " > "


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


# --------------------------------------------------------------------------- parsing

_ATX = re.compile(r" {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*")
_ATX_CLOSING = re.compile(r"(?:^|[ \t]+)#+[ \t]*$")
_FENCE_OPEN = re.compile(r" {0,3}(`{3,}|~{3,})(.*)")
_FENCE_CLOSE = re.compile(r" {0,3}(`{3,}|~{3,})[ \t]*")
# Markdown setext uses = and -; RST also underlines with these characters.
_UNDERLINE = re.compile(r" {0,3}([=\-~^*+#\"'`])\1{2,}[ \t]*")
_NOT_A_TITLE = re.compile(r" {0,3}(?:[-+*]|\d{1,9}[.)])(?:[ \t]|$)| {0,3}[>|]| {4}")


@dataclass
class _Block:
    start: int
    end: int = -1
    is_code: bool = False
    is_blank: bool = False
    heading_style: tuple[str, bool] | None = None  # Underline style: (character, has overline).
    level: int | None = None  # Heading level, None for body blocks.
    title: str = ""


def _line_spans(text: str) -> list[tuple[int, int]]:
    # Only "\n" ends a line: str.splitlines would also split on \x0b, \x1c, \u2028, ...
    spans = []
    pos = 0
    length = len(text)
    while pos < length:
        newline = text.find("\n", pos)
        end = length if newline < 0 else newline + 1
        spans.append((pos, end))
        pos = end
    return spans


def _is_blank(line: str) -> bool:
    return not line.strip(" \t\r\f\v")


def _is_fence_open(line: str) -> re.Match[str] | None:
    match = _FENCE_OPEN.fullmatch(line)
    if match and match.group(1)[0] == "`" and "`" in match.group(2):
        return None  # CommonMark: a backtick fence's info string has no backtick.
    return match


def _is_title(line: str) -> bool:
    return not (
        _is_blank(line)
        or _ATX.fullmatch(line)
        or _is_fence_open(line)
        or _UNDERLINE.fullmatch(line)
        or _NOT_A_TITLE.match(line)
    )


def _atx_title(match: re.Match[str]) -> str:
    return _ATX_CLOSING.sub("", match.group(2) or "").strip()


def _parse_blocks(text: str) -> list[_Block]:
    spans = _line_spans(text)
    lines = [text[a:b].rstrip("\n").rstrip("\r") for a, b in spans]
    count = len(lines)
    blocks: list[_Block] = []
    at_block_start = True  # After a blank line, a heading or a fence, a line starts a block.
    i = 0
    while i < count:
        line = lines[i]
        if _is_blank(line):
            if not blocks:
                blocks.append(_Block(start=0, is_blank=True))
            at_block_start = True
            i += 1
            continue
        start = spans[i][0]

        over = _UNDERLINE.fullmatch(line) if at_block_start and i + 2 < count else None
        if over and over.group(1) not in "`~":
            # RST title with overline. Not with ` or ~: that is a one-line fenced code block.
            under = _UNDERLINE.fullmatch(lines[i + 2])
            title = lines[i + 1].strip()
            if under and under.group(1) == over.group(1) and title and _is_title(title):
                blocks.append(_Block(start=start, heading_style=(over.group(1), True), title=title))
                i += 3
                at_block_start = True
                continue

        atx = _ATX.fullmatch(line)
        if atx:
            blocks.append(_Block(start=start, level=len(atx.group(1)), title=_atx_title(atx)))
            i += 1
            at_block_start = True
            continue

        fence = _is_fence_open(line)
        if fence:
            marker = fence.group(1)
            j = i + 1
            while j < count:
                close = _FENCE_CLOSE.fullmatch(lines[j])
                if close and close.group(1)[0] == marker[0] and len(close.group(1)) >= len(marker):
                    break
                j += 1
            blocks.append(_Block(start=start, is_code=True))
            i = j + 1  # An unclosed fence runs to the end of the text, as in CommonMark.
            at_block_start = True
            continue

        if at_block_start and i + 1 < count and _is_title(line):
            under = _UNDERLINE.fullmatch(lines[i + 1])
            if under:
                char = under.group(1)
                length = len(lines[i + 1].strip())
                # RST wants the underline at least as long as the title; requiring that for
                # characters other than = and - keeps "***" rules apart, and at least four
                # ~ or ` keeps the usual three-character code fence after "Run:" a fence.
                if char in "=-" or (length >= len(line.strip()) and (char not in "~`" or length >= 4)):
                    blocks.append(_Block(start=start, heading_style=(char, False), title=line.strip()))
                    i += 2
                    at_block_start = True
                    continue

        if at_block_start:
            blocks.append(_Block(start=start))
        at_block_start = False
        i += 1

    if len(blocks) > 1 and blocks[0].is_blank:
        # Leading blank lines belong to the first real block, so no chunk is only whitespace.
        blocks[1].start = 0
        del blocks[0]
    for block, following in zip(blocks, blocks[1:]):
        block.end = following.start
    if blocks:
        blocks[-1].end = len(text)
    _assign_underline_levels(blocks)
    return blocks


def _assign_underline_levels(blocks: list[_Block]) -> None:
    styles = [b.heading_style for b in blocks if b.heading_style is not None]
    if all(style in {("=", False), ("-", False)} for style in styles):
        levels = {("=", False): 1, ("-", False): 2}  # Markdown setext.
    else:
        # RST: a style's level is the order in which it first appears in the document.
        levels = {}
        for style in styles:
            levels.setdefault(style, min(len(levels) + 1, 6))
    for block in blocks:
        if block.heading_style is not None:
            block.level = levels[block.heading_style]


# --------------------------------------------------------------------------- units


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
    blocks: list[_Block] = field(default_factory=list)


def _sections(blocks: Sequence[_Block]) -> list[_Section]:
    sections: list[_Section] = []
    for block in blocks:
        is_anchor = block.level is not None and block.level <= ANCHOR_MAX_LEVEL
        current = sections[-1] if sections else None
        only_headings = current is not None and all(b.level is not None for b in current.blocks)
        if current is None or (is_anchor and not only_headings):
            sections.append(_Section())
        sections[-1].blocks.append(block)
    return sections


def _count(text: str) -> int:
    return len(encoding().encode_ordinary(text))


# Only the opening of a unit decides its boundary strength: an edit further into a
# paragraph then changes that chunk's text but cannot move a boundary.
_STRENGTH_PREFIX_CHARS = 64


def _strength(unit_text: str) -> float:
    opening = unit_text.strip()[:_STRENGTH_PREFIX_CHARS]
    digest = hashlib.blake2b(opening.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


_SENTENCE_END = re.compile(r"[.!?…]+[\"'”’)\]]*\s+|[。！？]+[\"'”’)\]」』]*\s*")


def _sentence_cuts(text: str) -> list[int]:
    return [m.end() for m in _SENTENCE_END.finditer(text) if 0 < m.end() < len(text)]


def _line_cuts(text: str) -> list[int]:
    return [m.end() for m in re.finditer("\n", text) if m.end() < len(text)]


def _char_index(text: str, byte_count: int) -> int:
    """Largest str index whose UTF-8 prefix fits in byte_count bytes (never mid-character)."""
    return len(text.encode("utf-8")[:byte_count].decode("utf-8", errors="ignore"))


def _token_pieces(text: str, offset: int, max_tokens: int) -> list[tuple[int, int, int]]:
    """Last resort for text with no sentence or line break: pieces of at most max_tokens."""
    enc = encoding()
    pieces = []
    pos = 0
    # A window keeps this linear: never re-tokenize the whole remainder per piece.
    window_chars = max_tokens * 16 + 64
    while pos < len(text):
        window = text[pos : pos + window_chars]
        tokens = enc.encode_ordinary(window)
        if len(tokens) <= max_tokens:
            cut = len(window)
        else:
            cut = max(1, _char_index(window, len(enc.decode_bytes(tokens[:max_tokens]))))
            space = max(window.rfind(" ", cut // 2, cut), window.rfind("\n", cut // 2, cut))
            if space > 0:
                cut = space + 1  # Prefer to keep words whole when a space is near.
            while 1 < cut < len(window) and unicodedata.combining(window[cut]):
                cut -= 1  # Keep a combining mark with its base character.
            while cut > 1 and _count(window[:cut]) > max_tokens:
                cut = max(1, cut - max(1, cut // 16))
        n = _count(window[:cut])
        pieces.append((offset + pos, offset + pos + cut, n))
        pos += cut
    return pieces


def _split_text(
    text: str, offset: int, max_tokens: int, use_sentences: bool
) -> list[tuple[int, int, int]]:
    """Pieces of at most max_tokens, cut at sentence ends, then line breaks, then tokens."""
    cutters = ([_sentence_cuts] if use_sentences else []) + [_line_cuts]
    for depth, cutter in enumerate(cutters):
        cuts = cutter(text)
        if not cuts:
            continue
        pieces: list[tuple[int, int, int]] = []
        bounds = [0, *cuts, len(text)]
        for a, b in zip(bounds, bounds[1:]):
            piece = text[a:b]
            n = _count(piece)
            if n <= max_tokens:
                pieces.append((offset + a, offset + b, n))
            elif cutters[depth + 1 :]:
                pieces.extend(_split_text(piece, offset + a, max_tokens, use_sentences=False))
            else:
                pieces.extend(_token_pieces(piece, offset + a, max_tokens))
        return pieces
    return _token_pieces(text, offset, max_tokens)


def _units(text: str, section: _Section, max_tokens: int) -> list[_Unit]:
    # Glue each heading to what follows it: a cut right after a heading would orphan it.
    groups: list[list[_Block]] = [[]]
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
        n = _count(text[start:end])
        if n <= max_tokens:
            units.append(
                _Unit(start, end, n, starts_with_heading=starts_with_heading, key_start=group[-1].start)
            )
            continue
        # Too big for one chunk: its blocks become units of their own, then an oversized
        # block is cut at sentences (not in code), lines, tokens.
        for block in group:
            m = _count(text[block.start : block.end])
            if m <= max_tokens:
                pieces = [(block.start, block.end, m)]
            else:
                pieces = _split_text(
                    text[block.start : block.end], block.start, max_tokens, not block.is_code
                )
            for k, (a, b, tokens) in enumerate(pieces):
                units.append(_Unit(a, b, tokens, starts_with_heading=k == 0 and block.level is not None))

    for k, unit in enumerate(units):
        unit.strength = _strength(text[max(unit.start, unit.key_start) : unit.end])
        if k + 1 < len(units) and units[k + 1].starts_with_heading:
            unit.strength -= 1.0  # A cut before a heading beats any cut inside a subsection.
    return units


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


def _fit(
    text: str, units: Sequence[_Unit], lo: int, hi: int, max_tokens: int, min_spacing: int
) -> list[tuple[int, int]]:
    """Split units[lo:hi] at their strongest boundaries until every piece fits the budget."""
    start, end = units[lo].start, units[hi - 1].end
    if hi - lo == 1 or _count(text[start:end]) <= max_tokens:
        return [(lo, hi)]
    sizes = [0]
    for k in range(lo, hi):
        sizes.append(sizes[-1] + units[k].tokens)
    total = sizes[-1]
    candidates = range(lo + 1, hi)
    balanced = [k for k in candidates if min(sizes[k - lo], total - sizes[k - lo]) >= min_spacing]
    k = min(balanced or candidates, key=lambda k: (units[k - 1].strength, k))
    left = _fit(text, units, lo, k, max_tokens, min_spacing)
    return left + _fit(text, units, k, hi, max_tokens, min_spacing)


# --------------------------------------------------------------------------- embed text


def _prefix_within(text: str, max_tokens: int) -> str:
    enc = encoding()
    tokens = enc.encode_ordinary(text)
    if len(tokens) <= max_tokens:
        return text
    cut = _char_index(text, len(enc.decode_bytes(tokens[:max_tokens])))
    while cut > 0 and _count(text[:cut]) > max_tokens:
        cut -= 1
    return text[:cut]


_WORD_START = re.compile(r"(?<=\s)\S")


def _tail_within(text: str, max_tokens: int) -> str:
    """About max_tokens tokens from the end of text, starting at a word when there is one."""
    if max_tokens <= 0 or not text.strip():
        return ""
    enc = encoding()
    # A bounded window: the overlap is short, the previous chunk may not be.
    window_start = max(0, len(text) - (max_tokens * 16 + 64))
    window = text[window_start:]
    tokens = enc.encode_ordinary(window)
    if len(tokens) <= max_tokens:
        cut = 0
    else:
        skip_bytes = len(enc.decode_bytes(tokens[: len(tokens) - max_tokens]))
        cut = _char_index(window, skip_bytes)
        if len(window[:cut].encode("utf-8")) < skip_bytes:
            cut += 1  # The token boundary fell inside a character: start after it.
        if cut >= len(window):
            return ""  # Even the last character alone is over the overlap budget.
    absolute = window_start + cut
    at_word_start = absolute == 0 or (text[absolute - 1].isspace() and not text[absolute].isspace())
    if not at_word_start:
        word = _WORD_START.search(window, cut)
        if word is not None:
            cut = word.start()
        # Without any word start (CJK, a long URL) the character boundary has to do.
    tail = window[cut:]
    while tail.strip() and _count(tail) > max_tokens:
        following = _WORD_START.search(tail, 1)
        tail = tail[following.start() :] if following else tail[1:]
    return tail if tail.strip() else ""


def _breadcrumb(titles: Sequence[str]) -> str:
    titles = [t for t in titles if t]
    while titles:
        crumb = _BREADCRUMB_SEPARATOR.join(titles) + "\n\n"
        if _count(crumb) <= BREADCRUMB_MAX_TOKENS:
            return crumb
        if len(titles) == 1:
            # One huge heading: keep its start, the most telling part.
            return _prefix_within(titles[0], BREADCRUMB_MAX_TOKENS - 2).rstrip() + "\n\n"
        titles = titles[1:]  # Drop the outermost heading first; the innermost says most.
    return ""


class _HeadingIndex:
    """Heading paths by text offset, for heading_path and the breadcrumbs."""

    def __init__(self, blocks: Sequence[_Block]) -> None:
        self.blocks = blocks
        self.starts = [block.start for block in blocks]
        # path_after[i]: (level, block position, title) of the open headings after blocks[i].
        self.path_after: list[tuple[tuple[int, int, str], ...]] = []
        path: tuple[tuple[int, int, str], ...] = ()
        for position, block in enumerate(blocks):
            if block.level is not None:
                level = block.level
                path = tuple(entry for entry in path if entry[0] < level) + ((level, position, block.title),)
            self.path_after.append(path)

    def at(self, start: int, end: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(heading path, breadcrumb) of the chunk text[start:end].

        The path includes the headings the chunk opens with; the breadcrumb leaves those
        out, since the chunk already shows them.
        """
        first = bisect.bisect_right(self.starts, start) - 1
        block = self.blocks[first]
        if block.start == start and block.level is not None:
            last = first
            while (
                last + 1 < len(self.blocks)
                and self.blocks[last + 1].level is not None
                and self.blocks[last + 1].start < end
            ):
                last += 1
            path = self.path_after[last]
            crumb = tuple(title for _, position, title in path if position < first)
        else:
            # A body block does not change the path; a chunk that starts inside a (huge)
            # heading block gets that heading as context.
            path = self.path_after[first]
            crumb = tuple(title for _, _, title in path)
        return tuple(title for _, _, title in path), crumb


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


def chunk_markdown(text: str, max_tokens: int = 512, overlap_tokens: int = 64) -> list[Chunk]:
    """Lossless, edit-stable chunks: the contents concatenate back to exactly `text`."""
    _validate(max_tokens, overlap_tokens)
    if not text:
        return []
    blocks = _parse_blocks(text)
    headings = _HeadingIndex(blocks)
    min_spacing = max(1, max_tokens // 4)

    chunks: list[Chunk] = []
    for section in _sections(blocks):
        units = _units(text, section, max_tokens)
        cuts = [0, *_content_defined_cuts(units, min_spacing), len(units)]
        previous_content: str | None = None
        for lo, hi in zip(cuts, cuts[1:]):
            for a, b in _fit(text, units, lo, hi, max_tokens, min_spacing):
                start, end = units[a].start, units[b - 1].end
                content = text[start:end]
                path, crumb_titles = headings.at(start, end)
                crumb = _breadcrumb(crumb_titles)
                # The overlap ends where the content starts, so overlap + content is itself
                # a slice of the page: no separator is invented.
                overlap = _tail_within(previous_content, overlap_tokens) if previous_content else ""
                # Trailing blank lines say nothing to the model, and would make the last chunk of
                # a page differ from the same text followed by more page (a shorter page's tail).
                body = content.rstrip() or content
                embed_text = crumb + overlap + body
                token_count = _count(embed_text)
                limit = max_tokens + overlap_tokens + _count(crumb)
                if token_count > limit:
                    # Token counts are not strictly additive across a join; drop the extras
                    # rather than ever exceed the promised budget.
                    embed_text = crumb + body
                    token_count = _count(embed_text)
                    if token_count > limit:
                        embed_text, token_count = body, _count(body)
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


def chunker_signature(max_tokens: int, overlap_tokens: int) -> str:
    """What decides chunk boundaries: the code version and the budget. A page whose stored
    signature differs is due for a re-chunk (from its stored text, never a recrawl)."""
    return f"{CHUNKER_VERSION}/{max_tokens}/{overlap_tokens}"
