"""What goes before a chunk's content in the text that is embedded: the breadcrumb of the headings
above it, and a short overlap from the end of the previous chunk of its section."""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence

from rag_pipeline.core.markdown_blocks import Block
from rag_pipeline.core.tokens import char_index, count_tokens, encoding, joins_cleanly, word_cut

# The breadcrumb is context, not content: cap it so long heading paths cannot crowd out the
# text or push an input past the embedding limit.
BREADCRUMB_MAX_TOKENS = 64

_BREADCRUMB_SEPARATOR = " > "


def prefix_within(text: str, max_tokens: int) -> str:
    enc = encoding()
    tokens = enc.encode_ordinary(text)
    if len(tokens) <= max_tokens:
        return text
    cut = char_index(text, len(enc.decode_bytes(tokens[:max_tokens])))
    while cut > 0 and count_tokens(text[:cut]) > max_tokens:
        cut -= 1
    return text[:cut]


_WORD_START = re.compile(r"(?<=\s)\S")


def counted_tail(text: str, max_tokens: int) -> tuple[str, int]:
    """About max_tokens tokens from the end of text, starting at a word when there is one; and
    how many tokens that is."""
    if max_tokens <= 0 or not text.strip():
        return "", 0
    enc = encoding()
    # A bounded window: the overlap is short, the previous chunk may not be.
    window_start = max(0, len(text) - (max_tokens * 16 + 64))
    window = text[window_start:]
    # Only the window's last tokens matter: tokenize from a cut nearer its end where the window's
    # tokens are cut too (`word_cut`, `joins_cleanly`), when that still leaves enough of them.
    offset = _clean_start(window, max_tokens)
    tokens = enc.encode_ordinary(window[offset:])
    if offset and len(tokens) < max_tokens:
        offset, tokens = 0, enc.encode_ordinary(window)
    if len(tokens) <= max_tokens:
        cut = offset
    else:
        rest = window[offset:]
        skip_bytes = len(enc.decode_bytes(tokens[: len(tokens) - max_tokens]))
        cut = char_index(rest, skip_bytes)
        if len(rest[:cut].encode("utf-8")) < skip_bytes:
            cut += 1  # The token boundary fell inside a character: start after it.
        cut += offset
        if cut >= len(window):
            return "", 0  # Even the last character alone is over the overlap budget.
    absolute = window_start + cut
    at_word_start = absolute == 0 or (text[absolute - 1].isspace() and not text[absolute].isspace())
    if not at_word_start:
        word = _WORD_START.search(window, cut)
        if word is not None:
            cut = word.start()
        # Without any word start (CJK, a long URL) the character boundary has to do.
    tail = window[cut:]
    while tail.strip():
        n = count_tokens(tail)
        if n <= max_tokens:
            return tail, n
        following = _WORD_START.search(tail, 1)
        tail = tail[following.start() :] if following else tail[1:]
    return "", 0


# Text runs about 4 characters a token; from this far before the end there are nearly always
# enough tokens, and the whole window is tokenized when there are not.
_CHARS_A_TOKEN_AT_MOST = 6


def _clean_start(window: str, max_tokens: int) -> int:
    """A cut of the window's tokens (`word_cut`, `joins_cleanly`) at least ~max_tokens tokens
    before its end, near there; or 0."""
    limit = len(window) - max_tokens * _CHARS_A_TOKEN_AT_MOST
    if limit < 2:
        return 0   # (a negative bound would count from the end)
    i = limit
    for _ in range(16):
        i = window.rfind(" ", 1, i)
        if i < 0:
            break
        if word_cut(window, i):
            return i
    i = window.rfind("\n", 0, limit)
    while i > 0:
        if joins_cleanly(window, i + 1):
            return i + 1
        i = window.rfind("\n", 0, i)
    return 0


def breadcrumb(titles: Sequence[str]) -> str:
    titles = [t for t in titles if t]
    while titles:
        crumb = _BREADCRUMB_SEPARATOR.join(titles) + "\n\n"
        if count_tokens(crumb) <= BREADCRUMB_MAX_TOKENS:
            return crumb
        if len(titles) == 1:
            # One huge heading: keep its start, the most telling part.
            return prefix_within(titles[0], BREADCRUMB_MAX_TOKENS - 2).rstrip() + "\n\n"
        titles = titles[1:]  # Drop the outermost heading first; the innermost says most.
    return ""


class HeadingIndex:
    """Heading paths by text offset, for heading_path and the breadcrumbs."""

    def __init__(self, blocks: Sequence[Block]) -> None:
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
