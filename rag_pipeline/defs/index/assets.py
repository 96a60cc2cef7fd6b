"""The index of one page, as three assets on the `pages` partitions (key: normalized URL)."""

from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg

from rag_pipeline.core.chunking import CHUNKER_VERSION
from rag_pipeline.defs.index.metadata import chunk_metadata, source_metadata, switch_metadata
from rag_pipeline.defs.index.partitions import pages_partitions
from rag_pipeline.defs.resources import EmbedderResource, PostgresResource
from rag_pipeline.ingest import indexing
from rag_pipeline.ingest.failures import classify
from rag_pipeline.store import spaces
from rag_pipeline.settings import get_settings

GROUP = "index"
# Read by delivery_failure_sensor: a later run would fail the same way, so none is scheduled.
RETRYABLE_METADATA = "retryable"


def _not_retryable(description: str) -> dg.Failure:
    return dg.Failure(description=description, allow_retries=False, metadata={RETRYABLE_METADATA: False})


@contextmanager
def _failures_a_retry_cannot_fix() -> Iterator[None]:
    """A failure a later run would meet again fails the step without a retry (ingest/failures.py)."""
    try:
        yield
    except Exception as exc:
        failure = classify(exc)
        if failure.retryable:
            raise
        raise _not_retryable(failure.reason) from exc


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
    return dg.MaterializeResult(metadata=source_metadata(result))


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
    return dg.MaterializeResult(metadata=chunk_metadata(result, max_tokens, overlap_tokens))


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
    return dg.MaterializeResult(metadata=switch_metadata(result, space, note))
