"""A deterministic, dependency-free embedder for tests only.

Feature hashing of lower-cased word unigrams and bigrams (English function words
dropped, so "what is X" is about X): lexically similar texts land
close together, so a test can search "what is X" and find the chunk about X, and the
same text always gives the same vector on every machine and Python process (blake2b,
not the salted built-in ``hash``). It carries no meaning beyond shared words; never
use it for a real index.
"""

from __future__ import annotations

import hashlib
import math
import re

from rag_pipeline.core.tokens import count_tokens
from rag_pipeline.embedders.base import EmbedResult

_WORD = re.compile(r"\w+", re.UNICODE)
_BIGRAM_WEIGHT = 0.5
_STOPWORDS = frozenset(
    "a an and are as at be by do does for from how in is it its of on or that the this to "
    "was were what when where which who why with".split()
)
#: Every hash space is named this plus its size, so a space's name says how to rebuild its embedder.
MODEL_PREFIX = "hash-v1-"
# Gives the empty text (no words) a fixed unit vector instead of an un-normalisable zero.
_EMPTY_FEATURE = "\x00empty"


def _bucket(feature: str, dimensions: int) -> tuple[int, float]:
    digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest()
    value = int.from_bytes(digest, "little")
    sign = 1.0 if value & 1 else -1.0
    return (value >> 1) % dimensions, sign


class HashEmbedder:
    """Signed feature hashing into ``dimensions`` buckets, L2-normalised. Tests only."""

    def __init__(self, dimensions: int = 256) -> None:
        if dimensions < 2:
            raise ValueError(f"HashEmbedder needs at least 2 dimensions, got {dimensions}")
        self.dimensions: int = dimensions
        self.model: str = f"{MODEL_PREFIX}{dimensions}"

    def vector(self, text: str) -> list[float]:
        """The unit vector of one text (shared by the loopback OpenAI fake)."""
        words = [w.lower() for w in _WORD.findall(text)]
        # Function words would dominate short questions ("what is X" matching every "is").
        content = [w for w in words if w not in _STOPWORDS]
        words = content or words
        counts: dict[str, float] = {}
        for w in words:
            counts[w] = counts.get(w, 0.0) + 1.0
        for a, b in zip(words, words[1:]):
            key = f"{a} {b}"
            counts[key] = counts.get(key, 0.0) + _BIGRAM_WEIGHT
        if not counts:
            counts[_EMPTY_FEATURE] = 1.0
        vec = [0.0] * self.dimensions
        for feature, weight in counts.items():
            index, sign = _bucket(feature, self.dimensions)
            # Sublinear term frequency, so a repeated word does not drown the others.
            vec[index] += sign * (1.0 + math.log(weight)) if weight >= 1.0 else sign * weight
        norm = math.sqrt(sum(x * x for x in vec))
        if norm == 0.0:
            # Every feature cancelled out in its bucket: fall back to the empty-text vector.
            index, sign = _bucket(_EMPTY_FEATURE, self.dimensions)
            vec = [0.0] * self.dimensions
            vec[index] = sign
            return vec
        return [x / norm for x in vec]

    def embed(self, texts: list[str], token_counts: list[int] | None = None) -> EmbedResult:
        """Embed locally; tokens are cl100k counts so ledgers look like the OpenAI path's."""
        if not texts:
            return EmbedResult(vectors=[], tokens=0, requests=0, retries=0)
        return EmbedResult(
            vectors=[self.vector(t) for t in texts],
            tokens=sum(token_counts) if token_counts is not None else sum(count_tokens(t) for t in texts),
            requests=1,
            retries=0,
        )
