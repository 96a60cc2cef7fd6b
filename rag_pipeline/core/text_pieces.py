"""Text cut into pieces of at most a number of cl100k tokens: at sentence ends, then line breaks,
then token counts, always on str indices (never inside a character, a combining mark kept with its
base). The chunker's last resort for a block over its budget."""

from __future__ import annotations

import re
import unicodedata

from rag_pipeline.core.tokens import char_index, count_tokens, encoding

__all__ = ["split_text"]

_SENTENCE_END = re.compile(r"[.!?…]+[\"'”’)\]]*\s+|[。！？]+[\"'”’)\]」』]*\s*")


def sentence_cuts(text: str) -> list[int]:
    return [m.end() for m in _SENTENCE_END.finditer(text) if 0 < m.end() < len(text)]


def line_cuts(text: str) -> list[int]:
    return [m.end() for m in re.finditer("\n", text) if m.end() < len(text)]


def token_pieces(text: str, offset: int, max_tokens: int) -> list[tuple[int, int, int]]:
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
            cut = max(1, char_index(window, len(enc.decode_bytes(tokens[:max_tokens]))))
            space = max(window.rfind(" ", cut // 2, cut), window.rfind("\n", cut // 2, cut))
            if space > 0:
                cut = space + 1  # Prefer to keep words whole when a space is near.
            while 1 < cut < len(window) and unicodedata.combining(window[cut]):
                cut -= 1  # Keep a combining mark with its base character.
            while cut > 1 and count_tokens(window[:cut]) > max_tokens:
                cut = max(1, cut - max(1, cut // 16))
        n = count_tokens(window[:cut])
        pieces.append((offset + pos, offset + pos + cut, n))
        pos += cut
    return pieces


def split_text(
    text: str, offset: int, max_tokens: int, use_sentences: bool
) -> list[tuple[int, int, int]]:
    """Pieces of at most max_tokens, cut at sentence ends, then line breaks, then tokens."""
    cutters = ([sentence_cuts] if use_sentences else []) + [line_cuts]
    for depth, cutter in enumerate(cutters):
        cuts = cutter(text)
        if not cuts:
            continue
        pieces: list[tuple[int, int, int]] = []
        bounds = [0, *cuts, len(text)]
        for a, b in zip(bounds, bounds[1:]):
            piece = text[a:b]
            n = count_tokens(piece)
            if n <= max_tokens:
                pieces.append((offset + a, offset + b, n))
            elif cutters[depth + 1 :]:
                pieces.extend(split_text(piece, offset + a, max_tokens, use_sentences=False))
            else:
                pieces.extend(token_pieces(piece, offset + a, max_tokens))
        return pieces
    return token_pieces(text, offset, max_tokens)
