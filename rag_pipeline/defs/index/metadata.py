"""The metadata of a page's `pages`, `chunks` and `embeddings` materializations, one shape
whether a page run or a batch run wrote them, so a partition's history reads the same."""

from __future__ import annotations

from rag_pipeline.core.chunking import chunker_signature
from rag_pipeline.ingest import indexing
from rag_pipeline.ingest.batch import Failed
from rag_pipeline.store import spaces


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


def switch_metadata(conn, result: indexing.SwitchResult, embedder, seen: dict, log) -> dict:
    """``embedder.note`` says when the configured model is not the space's: logged once a run
    (``seen`` is the run's memo of spaces) and kept on every page it concerns."""
    space = _space_of(conn, result.space_id, seen)
    note = embedder.note(space)
    extra: dict = {}
    if note:
        extra["note"] = note
        if ("noted", space.space_id) not in seen:
            seen[("noted", space.space_id)] = True
            log.info(note)
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


def failure_metadata(event: Failed) -> dict:
    """Observed on the partition of the asset whose step failed for this page."""
    return {"status": "failed", "error": event.failure.reason[:2000], "retryable": event.failure.retryable,
            "delivery_id": event.delivery_id or 0}


def _space_of(conn, space_id: int | None, seen: dict) -> spaces.Space | None:
    """The space a page switched into (a run switches hundreds of pages into one or two)."""
    if space_id is None:
        return None
    if space_id not in seen:
        seen[space_id] = spaces.by_id(conn, space_id)
        conn.commit()
    return seen[space_id]
