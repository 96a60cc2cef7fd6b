"""The index of one page, as three assets on the `pages` partitions (key: normalized URL)."""

from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg
import psycopg

from rag_pipeline.core.chunking import CHUNKER_VERSION, chunker_signature
from rag_pipeline.defs.index.partitions import pages_partitions
from rag_pipeline.defs.resources import EmbedderResource, PostgresResource
from rag_pipeline.embedders.base import PoisonedInputError
from rag_pipeline.store import spaces
from rag_pipeline.store.spaces import SpaceMismatch
from rag_pipeline.ingest import indexing
from rag_pipeline.settings import get_settings

GROUP = "index"
# Read by delivery_failure_sensor: a later run would fail the same way, so none is scheduled.
RETRYABLE_METADATA = "retryable"


def _not_retryable(description: str) -> dg.Failure:
    return dg.Failure(description=description, allow_retries=False, metadata={RETRYABLE_METADATA: False})


@contextmanager
def _failures_a_retry_cannot_fix() -> Iterator[None]:
    """The same text refused by the model or by Postgres, the same model mismatch: a later run
    would meet them again, so retrying costs money and changes nothing."""
    try:
        yield
    except (PoisonedInputError, SpaceMismatch) as exc:
        raise _not_retryable(str(exc)) from exc
    except psycopg.DataError as exc:
        # SQLSTATE class 22 (or psycopg refusing a NUL before sending): a property of the data.
        code = f" (SQLSTATE {exc.sqlstate})" if exc.sqlstate else ""
        raise _not_retryable(
            f"the page's data cannot be stored: {str(exc).strip()}{code}; not retried: "
            "a retry would fail the same way") from exc


@dg.asset(
    partitions_def=pages_partitions,
    group_name=GROUP,
    kinds={"postgres"},
)
def pages(context: dg.AssetExecutionContext, postgres: PostgresResource) -> dg.MaterializeResult:
    """The newest crawled content of a page, normalized: the source every chunk is cut from.

    Kept in full so that a new chunker re-cuts pages without recrawling them.
    """
    settings = get_settings()
    with postgres.connect() as conn, _failures_a_retry_cannot_fix():
        result = indexing.take_newest_delivery(conn, context.partition_key, settings.webhook_max_page_bytes)
    return dg.MaterializeResult(
        metadata={
            "status": result.status,
            "source_hash": result.source_hash or "",
            "delivery_id": result.delivery_id or 0,
            "chars": result.chars,
            "deliveries_superseded": result.superseded,
        }
    )


@dg.asset(
    partitions_def=pages_partitions,
    group_name=GROUP,
    deps=[pages],
    code_version=CHUNKER_VERSION,
    kinds={"postgres"},
)
def chunks(
    context: dg.AssetExecutionContext, postgres: PostgresResource, embedder: EmbedderResource
) -> dg.MaterializeResult:
    """A page cut into passages at headings and paragraph breaks, each small enough to embed.

    Staged as a new generation: search keeps the old one until `embeddings` swaps this one in.
    """
    with postgres.connect() as conn, _failures_a_retry_cannot_fix():
        # Sized to the model the page will be embedded with: the active space's.
        max_tokens, overlap_tokens = embedder.chunk_budget(spaces.active(conn))
        result = indexing.stage_chunks(conn, context.partition_key, max_tokens, overlap_tokens)
    return dg.MaterializeResult(
        metadata={
            "source_hash": result.source_hash or "",
            "chunks": result.chunks,
            "tokens": result.tokens,
            "chunker_version": chunker_signature(max_tokens, overlap_tokens),
            "max_tokens": max_tokens,
            "overlap_tokens": overlap_tokens,
        }
    )


@dg.asset(
    partitions_def=pages_partitions,
    group_name=GROUP,
    deps=[chunks],
    kinds={"postgres", "openai"},
    pool="embedding_api",
    # No step retries: the embedder already retries blips (429/5xx, with backoff), and a failed
    # run is tried again minutes later by delivery_failure_sensor, which outlasts an outage.
)
def embeddings(
    context: dg.AssetExecutionContext, postgres: PostgresResource, embedder: EmbedderResource
) -> dg.MaterializeResult:
    """What search sees of a page: its chunks with a vector each in the active embedding space.

    Only text never embedded before is sent to the model; the page switches in one transaction.
    Embedded with the active space's model, whatever is configured (the configured model makes
    only the first space; `space build` / `space activate` switch models).
    """
    with postgres.connect() as conn, _failures_a_retry_cannot_fix():
        result = indexing.embed_and_switch(conn, context.partition_key, embedder.for_space, context.run_id)
        space = spaces.by_id(conn, result.space_id) if result.space_id is not None else None
    note = embedder.note(space)
    if note:
        context.log.info(note)
    extra = {"note": note} if note else {}
    if space is not None:
        extra["embedding_space"] = f"{space.model} ({space.dimensions} dims)"
    return dg.MaterializeResult(
        metadata={
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
    )
