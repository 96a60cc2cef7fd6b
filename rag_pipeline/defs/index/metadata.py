"""The metadata of a page's `pages`, `chunks` and `embeddings` materializations, one shape
whether a page run or a batch run wrote them, so a partition's history reads the same."""

from __future__ import annotations

from rag_pipeline.core.chunking import chunker_signature
from rag_pipeline.ingest import indexing
from rag_pipeline.store.spaces import Space


def source_metadata(result: indexing.SourceResult) -> dict:
    return {
        "status": result.status,
        "source_hash": result.source_hash or "",
        "delivery_id": result.delivery_id or 0,
        "chars": result.chars,
        "deliveries_superseded": result.superseded,
    }


def chunk_metadata(result: indexing.StageResult, max_tokens: int, overlap_tokens: int) -> dict:
    return {
        "source_hash": result.source_hash or "",
        "chunks": result.chunks,
        "tokens": result.tokens,
        "chunker_version": chunker_signature(max_tokens, overlap_tokens),
        "max_tokens": max_tokens,
        "overlap_tokens": overlap_tokens,
    }


def switch_metadata(result: indexing.SwitchResult, space: Space | None, note: str | None) -> dict:
    extra: dict = {"note": note} if note else {}
    if space is not None:
        extra["embedding_space"] = f"{space.model} ({space.dimensions} dims)"
    return {
        **extra,
        "status": result.status,
        "source_hash": result.source_hash or "",
        "chunks_total": result.chunks_total,
        "chunks_embedded": result.chunks_embedded,
        "tokens_embedded": result.tokens_embedded,
        "tokens_reused": result.tokens_reused,
        "requests": result.requests,
        "inputs_truncated": result.truncated,
    }
