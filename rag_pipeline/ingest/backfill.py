"""Re-chunk backfill: which pages a chunker change makes due, and what re-cutting them costs.

Everything works from the stored source text: a re-chunk never needs a recrawl, and the plan
never calls the embedder (it only looks texts up in the vector cache).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from rag_pipeline.core.chunking import chunk_markdown, chunker_signature
from rag_pipeline.core.template_strip import chunk_source
from rag_pipeline.core.text import embed_hash
from rag_pipeline.store import chunks, pages, site_templates
from rag_pipeline.store.spaces import Space


@dataclass
class BackfillPlan:
    signature: str
    pages: int = 0
    chunks_total: int = 0
    chunks_to_embed: int = 0
    tokens_to_embed: int = 0
    tokens_reused: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def plan(conn: psycopg.Connection, space: Space | None, max_tokens: int, overlap_tokens: int,
         *, batch: int = 200, on_progress: Callable[[int], None] | None = None) -> BackfillPlan:
    """Re-chunk every outdated page in memory and price it against the vector cache.
    ``on_progress(pages_done)`` is told after each page."""
    signature = chunker_signature(max_tokens, overlap_tokens)
    result = BackfillPlan(signature)
    seen: set[bytes] = set()  # a text shared by several pages is embedded once
    templates = site_templates.current(conn)
    for url, text, site in pages.sources_chunked_otherwise(conn, signature, itersize=batch):
        result.pages += 1
        template = templates.get(site, (None, None))[0]
        pieces = chunk_markdown(chunk_source(text or "", template, url), max_tokens=max_tokens,
                                overlap_tokens=overlap_tokens)
        hashes = [embed_hash(c.embed_text) for c in pieces]
        cached = chunks.cached_hashes(conn, space, hashes) if space is not None and hashes else set()
        for piece, digest in zip(pieces, hashes):
            result.chunks_total += 1
            if digest in cached or digest in seen:
                result.tokens_reused += piece.token_count
            else:
                seen.add(digest)
                result.chunks_to_embed += 1
                result.tokens_to_embed += piece.token_count
        if on_progress:
            on_progress(result.pages)
    return result
